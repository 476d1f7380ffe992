"""The page is self-contained (no network resource), its data blocks are valid JSON that
no trajectory text can break out of, and every plot it promises has data."""

from __future__ import annotations

import json
import re

from html_blocks import blocks

from loomrl.report import ReportConfig, build_report, load_run
from loomrl.report.page import script_json
from loomrl.runs import read_trajectories


def test_the_page_loads_nothing_from_the_network(rollout_dir):
    page = (rollout_dir / "report.html").read_text()
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)\s*=\s*['\"]?(https?:)?//", page)
    assert page.count("<script>") == 2  # plotly.js and the report's own, each inlined once


def test_script_json_cannot_close_the_script_element():
    text = script_json({"t": "</script><script>alert(1)</script><!--"})
    assert "</" not in text and "<!--" not in text
    assert json.loads(text) == {"t": "</script><script>alert(1)</script><!--"}


def test_every_plot_element_has_a_figure_with_data(train_dirs):
    page = build_report([load_run(p) for p in train_dirs])
    figures = json.loads(blocks(page)["figures"])
    ids = re.findall(r'<div class="plot" id="fig-([^"]+)">', page)
    assert ids == [f["id"] for f in figures]
    assert {"reward", "length", "turns", "outcomes", "learner-entropy", "learner-kl",
            "learner-grad_norm", "learner-clip_fraction", "learner-sampler_learner_abs_gap",
            "learner-is_weight", "mismatch-kl", "mismatch-gap", "mismatch-ratio",
            "mismatch-correction", "time-0", "time-1", "busy", "tokens-per-s", "staleness",
            "producer-events", "tokens-unused", "length-bias"} <= set(ids)  # fmt: skip
    for figure in figures:
        assert figure["data"], figure["id"]


def test_several_runs_are_overlaid_one_colour_each(train_dirs):
    page = build_report([load_run(p) for p in train_dirs])
    reward = next(f for f in json.loads(blocks(page)["figures"]) if f["id"] == "reward")
    means = [t for t in reward["data"] if t.get("showlegend") is not False]
    assert [t["name"] for t in means] == ["seed0 · mean", "seed1 · mean"]
    assert means[0]["line"]["color"] != means[1]["line"]["color"]
    summary = json.loads(blocks(page)["trajectories"])
    assert summary["runs"] == ["seed0", "seed1"]
    assert summary["cols"]["run"] == [0] * 12 + [1] * 12


def test_runs_whose_directories_share_a_name_are_told_apart(train_dirs, tmp_path):
    import shutil

    copies = [shutil.copytree(p, tmp_path / p.name / "run") for p in train_dirs]
    page = build_report([load_run(p) for p in copies])
    assert json.loads(blocks(page)["trajectories"])["runs"] == ["seed0/run", "seed1/run"]
    reward = next(f for f in json.loads(blocks(page)["figures"]) if f["id"] == "reward")
    names = [t["name"] for t in reward["data"] if t.get("showlegend") is not False]
    assert names == ["seed0/run · mean", "seed1/run · mean"]


def test_a_rollout_shows_distributions_not_curves(rollout_dir):
    page = build_report([load_run(rollout_dir)], ReportConfig(max_texts=0))
    figures = {f["id"]: f for f in json.loads(blocks(page)["figures"])}
    assert 'id="fig-learner-' not in page and "reward" not in figures  # no step curves
    assert {"solved-by-k", "statuses", "reward-histogram", "length-by-outcome",
            "turns-by-outcome"} <= set(figures)  # fmt: skip
    rows = read_trajectories(rollout_dir / "trajectories.parquet")
    solved: dict[int, int] = {}
    for row in rows:  # guess_number: a sample solves its example with reward >= 1
        solved[row["example_id"]] = solved.get(row["example_id"], 0) + (row["reward"] >= 1)
    bars = figures["solved-by-k"]["data"][0]
    assert bars["x"] == [0, 1, 2, 3]  # n = 3 samples an example
    assert bars["y"] == [list(solved.values()).count(k) for k in range(4)]
    assert sorted(figures["reward-histogram"]["data"][0]["x"]) == sorted(r["reward"] for r in rows)
    boxes = figures["length-by-outcome"]["data"][0]
    wins = sum(r["reward"] >= 1 for r in rows)
    assert boxes["x"][0] == f"solved ({wins})" if wins else boxes["x"][0].startswith("not")
    assert "<a href='#s-learner'>" not in page and "<a href='#s-outcomes'>" in page
    assert json.loads(blocks(page)["texts"]) == []


def test_no_control_sits_on_a_title(rollout_dir, train_dirs):
    """Plotly's mode bar stands upright in the right margin; titles start on the left."""
    for runs in ([rollout_dir], train_dirs):
        page = build_report([load_run(p) for p in runs], ReportConfig(max_texts=0))
        for figure in json.loads(blocks(page)["figures"]):
            layout = figure["layout"]
            assert layout["modebar"]["orientation"] == "v", figure["id"]
            assert layout["title"]["xanchor"] == "left" and layout["margin"]["r"] >= 40
