"""``loomrl doctor`` and ``loomrl models prepare``: text from checks and specs prints as
written (no Rich markup), and every spec is checked before any is built."""

from __future__ import annotations

from loomrl import doctor
from loomrl.doctor import Check


def test_doctor_prints_markup_characters_as_written(cli, monkeypatch):
    rows = [Check("torch", False, "[/x] is [bold]broken[/]", "pip install 'x[train]'")]
    monkeypatch.setattr(doctor, "run_checks", lambda: rows)
    result = cli("doctor")
    assert result.code == 1, result.err
    text = " ".join(result.out.split())
    assert "[/x] is [bold]broken[/]" in text and "pip install 'x[train]'" in text


def test_models_prepare_checks_every_spec_first(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("LOOMRL_HOME", str(tmp_path / "home"))
    result = cli("models", "prepare", "tiny-random:1", "[bold]nope[/]")
    assert result.code == 2
    assert result.error.startswith("unknown model '[bold]nope[/]': expected one of")
    assert not (tmp_path / "home" / "models").exists()  # tiny-random:1 was not built either
