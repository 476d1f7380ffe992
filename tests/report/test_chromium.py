"""Reports opened in headless Chromium: no console errors, every plot drawn (an SVG with
marks in each plot element), and the browser opens a trajectory showing model text and
env text (and tokens coloured by logprob on demand). Screenshots go to the test's tmp dir.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loomrl.report import write_report


def open_report(chromium, path: Path):
    """A page with ``path`` loaded and its plots drawn; ``errors`` collects console errors,
    uncaught exceptions and any request that leaves the file."""
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    page.errors = []
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.on(
        "request",
        lambda r: (
            None if r.url.startswith(("file:", "data:", "blob:")) else page.errors.append(r.url)
        ),
    )
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    return page


def check_plots(page) -> int:
    """Every plot element holds a drawn figure; returns how many."""
    plots = page.query_selector_all("div.plot")
    assert plots
    for plot in plots:
        name = plot.get_attribute("id")
        assert plot.query_selector("svg.main-svg"), f"{name} was not drawn"
        marks = plot.evaluate(
            "d => Array.from(d.querySelectorAll('.trace path')).filter("
            "p => (p.getAttribute('d') || '').length > 2).length"
        )
        assert marks > 0, f"{name} has no marks"
        assert plot.bounding_box()["height"] > 100, name
    return len(plots)


def test_a_rollout_report_opens_and_shows_a_trajectory(chromium, rollout_dir, tmp_path):
    page = open_report(chromium, rollout_dir / "report.html")
    assert check_plots(page) >= 5
    assert "12 of 12 trajectories match" in page.inner_text("#count")
    page.click("#list tbody tr >> nth=0")
    detail = page.locator("#detail")
    model = detail.locator(".seg.model").first.inner_text()
    env = detail.locator(".seg.env").first.inner_text()
    assert "My guess is" in model
    assert "higher" in env or "lower" in env or "correct" in env.lower()
    assert detail.locator(".tok").count() == 0  # plain text until asked
    page.check("#f-colour")
    coloured = detail.locator(".seg.model .tok")
    assert coloured.count() > 3
    assert "logprob" in coloured.first.get_attribute("title")
    page.screenshot(path=str(tmp_path / "rollout.png"), full_page=True)
    assert (tmp_path / "rollout.png").stat().st_size > 10_000
    assert page.errors == []


def test_filters_narrow_the_list(chromium, rollout_dir):
    page = open_report(chromium, rollout_dir / "report.html")
    page.fill("#f-reward-min", "0.5")
    page.dispatch_event("#f-reward-min", "change")
    shown = page.inner_text("#count")
    matching = int(shown.split(" of ")[0])
    assert 0 < matching < 12, shown  # the scripted guesses win some games, not all
    rewards = page.locator("#list tbody tr td:nth-child(5)").all_inner_texts()
    assert rewards and all(float(r) >= 0.5 for r in rewards)
    page.fill("#f-reward-min", "2")
    page.dispatch_event("#f-reward-min", "change")
    assert page.inner_text("#count").startswith("0 of 12")
    page.fill("#f-reward-min", "")
    page.select_option("#f-status", label="terminated")
    statuses = set(page.locator("#list tbody tr td:nth-child(4)").all_inner_texts())
    assert statuses == {"terminated"}
    assert page.errors == []


def test_two_train_runs_overlaid(chromium, train_dirs, tmp_path):
    out = write_report(train_dirs, tmp_path / "both.html")
    page = open_report(chromium, out)
    assert check_plots(page) >= 15
    legend = page.eval_on_selector_all(
        "#fig-reward .legendtext", "nodes => nodes.map(n => n.textContent)"
    )
    assert sorted(legend) == ["seed0 · mean", "seed1 · mean"]
    page.select_option("#f-run", label="seed1")
    assert page.inner_text("#count").startswith("12 of 24")
    page.click("#list tbody tr >> nth=0")
    assert "Answer:" in page.locator("#detail .seg.model").first.inner_text()
    assert "policy v" in page.locator("#detail .seg.model .who").first.inner_text()
    page.screenshot(path=str(tmp_path / "train.png"), full_page=True)
    assert page.errors == []


@pytest.mark.parametrize("max_texts", [0])
def test_a_trajectory_without_text_says_why(chromium, rollout_dir, tmp_path, max_texts):
    from loomrl.report import ReportConfig

    out = write_report([rollout_dir], tmp_path / "r.html", ReportConfig(max_texts=max_texts))
    page = open_report(chromium, out)
    page.click("#list tbody tr >> nth=0")
    assert "Text not embedded" in page.inner_text("#detail")
    assert page.errors == []
