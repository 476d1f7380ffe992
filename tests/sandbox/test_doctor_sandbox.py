"""The ``loomrl doctor`` row that says which sandbox isolation is active."""

from __future__ import annotations

from loomrl import doctor
from loomrl.sandbox import bwrap


def test_doctor_names_bwrap_and_its_version_when_it_runs(monkeypatch):
    monkeypatch.setattr(bwrap, "probe", lambda: (True, "bubblewrap 0.8.0"))
    assert doctor.check_sandbox() == doctor.Check("sandbox", True, "bwrap (bubblewrap 0.8.0)")


def test_doctor_names_the_fallback_and_the_fix(monkeypatch):
    monkeypatch.setattr(bwrap, "probe", lambda: (False, "bwrap not found on PATH"))
    row = doctor.check_sandbox()
    assert (row.ok, row.detail) == (False, "rlimit-only — bwrap not found on PATH")
    assert row.fix == "install bubblewrap (apt-get install bubblewrap)"


def test_a_failing_probe_is_a_row_not_an_exception(monkeypatch):
    def broken():
        raise OSError("no /proc")

    monkeypatch.setattr(bwrap, "probe", broken)
    row = doctor.check_sandbox()
    assert not row.ok and "probe failed: no /proc" in row.detail


def test_the_real_probe_matches_the_row():
    works, detail = bwrap.probe()
    row = doctor.check_sandbox()
    assert row.ok is works
    assert row.detail == (f"bwrap ({detail})" if works else f"rlimit-only — {detail}")
    if works:
        assert detail.startswith("bubblewrap ")
