"""``loomrl report`` and the report written at the end of ``loomrl rollout``: paths
printed, bad flags refused in one line, a report that fails never fails the run."""

from __future__ import annotations

import pytest
from conftest import rollout_run

from loomrl.cli import main
from loomrl.train.config import TrainConfig


def test_report_writes_the_file_and_prints_its_path(train_dirs, tmp_path, capsys):
    out = tmp_path / "both.html"
    assert main(["report", *map(str, train_dirs), "--out", str(out), "--max-texts", "4"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"report: {out}")
    assert out.stat().st_size > 1_000_000  # plotly.js inlined


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--out", "{tmp}"], "--out {tmp}: a directory; give the HTML file's path"),
        (["--out", "{tmp}/no/r.html"], "--out {tmp}/no/r.html: no directory {tmp}/no"),
        (["--max-texts", "-1"], "--max-texts -1: must be 0 or more"),
    ],
)
def test_bad_flags_are_one_line(rollout_dir, tmp_path, capsys, flags, message):
    argv = ["report", str(rollout_dir), *(f.format(tmp=tmp_path) for f in flags)]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == "error: " + message.format(tmp=tmp_path)


def test_rollout_prints_the_report_path(tmp_path, tokenizer, capsys):
    out = rollout_run(tmp_path / "run", tokenizer)
    assert f"report: {out / 'report.html'}" in capsys.readouterr().out
    assert (out / "report.html").is_file()


def test_a_report_that_fails_does_not_fail_the_run(tmp_path, tokenizer, capsys, monkeypatch):
    import loomrl.report as report

    def broken(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(report, "write_report", broken)
    out = rollout_run(tmp_path / "run", tokenizer)  # exits 0
    err = capsys.readouterr().err
    assert f"note: {out / 'report.html'} not written (OSError: disk full)" in err
    assert (out / "trajectories.parquet").is_file()


def test_report_every_is_a_train_field():
    assert TrainConfig().report_every == 10
    with pytest.raises(ValueError, match="report_every"):
        TrainConfig(report_every=-1)
