"""The report as one self-contained HTML page: plotly.js, CSS, JS and data all inlined
(no CDN, no network: the file opens offline and can be mailed or archived as is)."""

from __future__ import annotations

import html
import json
import time
from collections.abc import Sequence
from importlib import resources
from typing import Any

from loomrl.report.figures import Figure, Plots
from loomrl.report.load import Run

SECTIONS = (
    "Outcomes", "Reward", "Length", "Environment", "Learner", "Mismatch", "Time", "Producer",
)  # fmt: skip


def plotly_js() -> str:
    """plotly.js as shipped in the ``plotly`` package (inlined once per page)."""
    try:
        return (resources.files("plotly") / "package_data" / "plotly.min.js").read_text("utf-8")
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "the report needs plotly (its plotly.js is inlined in the page): pip install plotly"
        ) from None


def _static(name: str) -> str:
    return (resources.files("loomrl.report") / "static" / name).read_text("utf-8")


def script_json(value: Any) -> str:
    """JSON safe inside ``<script type="application/json">`` (no ``</script>`` or
    ``<!--`` can appear: every ``<`` is escaped, which JSON allows only in strings)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace(
        "<", "\\u003c"
    )


def run_table(runs: Sequence[Run]) -> str:
    head = "<tr><th>run</th><th>kind</th><th>model</th><th>env</th><th>steps</th>"
    head += "<th>trajectories</th><th>reward (last)</th></tr>"
    body = []
    for run in runs:
        t = run.trajectories
        envs = sorted(set(t.column("env").to_pylist())) if t.num_rows else []
        env = ", ".join(envs) or str(run.config.get("env", "-"))
        last = next((r.get("reward_mean") for r in reversed(run.rows) if "reward_mean" in r), None)
        cells = [
            str(run.path), run.kind, str(run.model or "-"), env, str(len(run.rows)),
            str(run.trajectories.num_rows), "-" if last is None else f"{last:.3f}",
        ]  # fmt: skip
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def plot_sections(plots: Plots) -> str:
    parts = []
    for section in SECTIONS:
        figures: list[Figure] = [f for f in plots.figures if f.section == section]
        if not figures:
            continue
        divs = "".join(f'<div class="plot" id="fig-{html.escape(f.id)}"></div>' for f in figures)
        parts.append(f'<h2 id="s-{section.lower()}">{section}</h2><div class="grid">{divs}</div>')
    if plots.skipped:
        items = "".join(f"<li>{html.escape(s)}</li>" for s in plots.skipped)
        parts.append(
            f'<details class="note"><summary>plots not shown</summary><ul>{items}</ul></details>'
        )
    return "".join(parts)


BROWSER = """
<h2 id="s-trajectories">Trajectories</h2>
<div id="filters">
  <label>run<select id="f-run"></select></label>
  <label>task<select id="f-env"></select></label>
  <label>status<select id="f-status"></select></label>
  <label>step ≥<input id="f-step-min" type="number"></label>
  <label>step ≤<input id="f-step-max" type="number"></label>
  <label>reward ≥<input id="f-reward-min" type="number" step="any"></label>
  <label>reward ≤<input id="f-reward-max" type="number" step="any"></label>
  <label>model tokens ≥<input id="f-len-min" type="number"></label>
  <label>model tokens ≤<input id="f-len-max" type="number"></label>
  <label>sort<select id="f-sort">
    <option value="">run, step, group</option>
    <option value="reward:desc">reward ↓</option><option value="reward:asc">reward ↑</option>
    <option value="len:desc">length ↓</option><option value="len:asc">length ↑</option>
  </select></label>
  <label><span><input id="f-text" type="checkbox"> with text only</span></label>
  <label><span><input id="f-colour" type="checkbox"> colour tokens by logprob</span>
    <span class="legend-lp">white: likely · yellow ≈ −1 · red ≤ −5</span></label>
</div>
<div id="browser-body">
  <div>
    <div id="pager"><button id="prev">◀</button><button id="next">▶</button>
      <span id="count"></span></div>
    <table id="list"><thead><tr><th class="l">run</th><th>step</th><th class="l">task</th>
      <th class="l">status</th><th>reward</th><th>tokens</th><th>turns</th><th>group/sample</th>
      <th>version</th><th>text</th></tr></thead><tbody></tbody></table>
  </div>
  <div id="detail"><p class="note">Click a trajectory to open it: the prompt, then each
  model turn (green, mask 1) and env reply (grey, mask 0).</p></div>
</div>
"""


def _present(plots: Plots) -> list[str]:
    """The sections that hold a plot, in page order (the nav links only to those)."""
    return [s for s in SECTIONS if any(f.section == s for f in plots.figures)]


def render(runs: Sequence[Run], plots: Plots, browser: dict[str, Any]) -> str:
    """The whole page."""
    names = ", ".join(run.name for run in runs)
    texts = browser.pop("texts")
    figures = [f.spec() for f in plots.figures]
    browser["runs"] = [run.name for run in runs]
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    return "".join([
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>loomrl report: {html.escape(names)}</title>",
        f"<style>{_static('report.css')}</style></head><body>",
        f"<header><h1>loomrl report</h1>{run_table(runs)}",
        f"<div class='note' style='color:#cdd'>written {when}</div></header>",
        "<nav>" + "".join(f"<a href='#s-{s.lower()}'>{s}</a>" for s in _present(plots))
        + "<a href='#s-trajectories'>Trajectories</a></nav>",
        f"<main>{plot_sections(plots)}{BROWSER}</main>",
        f"<script type='application/json' id='figures'>{script_json(figures)}</script>",
        f"<script type='application/json' id='trajectories'>{script_json(browser)}</script>",
        f"<script type='application/json' id='texts'>{script_json(texts)}</script>",
        f"<script>{plotly_js()}</script>",
        f"<script>{_static('report.js')}</script>",
        "</body></html>\n",
    ])  # fmt: skip
