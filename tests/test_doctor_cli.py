"""``loomrl doctor`` rows and the command line's parser, exit codes and messages."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from loomrl import cli, doctor
from loomrl.doctor import Check, run_checks
from loomrl.models.store import MARKER


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOMRL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# -- doctor --------------------------------------------------------------------------------


def test_run_checks_returns_one_row_per_component(home):
    rows = run_checks()
    assert all(isinstance(row, Check) for row in rows)
    names = [row.name for row in rows]
    assert names == [
        "torch",
        "learner",
        "vllm",
        "vision/audio packages",
        "KV cache",
        "sandbox",
        "model smollm2-135m-instruct",
        "model tiny-random",
        "model smolvlm-tiny",
        "model tiny-reward",
    ]
    assert all(row.detail for row in rows)
    assert all(row.fix for row in rows if not row.ok)  # every problem says what to do


def test_models_are_reported_as_prepared_or_not(home):
    (home / "models" / "tiny-random-seed0").mkdir(parents=True)
    (home / "models" / "tiny-random-seed0" / MARKER).write_text("{}")
    rows = {row.name: row for row in doctor.check_models()}
    default, tiny = rows["model smollm2-135m-instruct"], rows["model tiny-random"]
    assert not default.ok
    assert default.fix == "loomrl models prepare smollm2-135m-instruct"
    assert tiny.ok
    assert tiny.detail == str(home / "models" / "tiny-random-seed0")


def test_broken_torch_is_a_row_not_an_exception(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise
    row = doctor.check_torch()
    assert not row.ok
    assert "import failed" in row.detail
    assert "pip install torch" in row.fix


def test_missing_vllm_is_a_row_with_the_install_command(monkeypatch):
    monkeypatch.setattr(doctor, "_version", lambda _dist: None)
    row = doctor.check_vllm()
    assert (row.ok, row.detail) == (False, "not installed")
    assert "loomrl[cpu]" in row.fix


def test_conflicting_packages_that_break_transformers_are_named(monkeypatch):
    monkeypatch.setattr(doctor, "_version", lambda d: "0.1" if d == "torchvision" else None)

    def broken_import(name):
        raise RuntimeError("operator torchvision::nms does not exist\nmore text")

    monkeypatch.setattr(doctor.importlib, "import_module", broken_import)
    row = doctor.check_conflicts()
    assert not row.ok
    assert "torchvision" in row.detail and "nms" in row.detail
    assert row.fix == "pip uninstall -y torchvision"


@pytest.mark.parametrize(
    ("value", "ok"), [(None, True), ("1", True), ("100000", False), ("lots", False)]
)
def test_kv_cache_setting_is_checked_against_host_memory(monkeypatch, value, ok):
    if value is None:
        monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    else:
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", value)
    row = doctor.check_memory()
    assert row.ok is ok
    assert bool(row.fix) is not ok
    if value == "lots":
        assert "'lots' is not a number" in row.detail


def test_one_broken_component_does_not_hide_the_others(home, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "not-a-number")
    monkeypatch.setitem(sys.modules, "torch", None)
    rows = {row.name: row for row in run_checks()}
    assert not rows["torch"].ok
    assert not rows["KV cache"].ok
    assert len(rows) == 10


# -- parser --------------------------------------------------------------------------------


def test_parser_knows_the_commands():
    parser = cli.build_parser()
    assert parser.parse_args(["doctor"]).func is cli.cmd_doctor
    prepare = parser.parse_args(["models", "prepare", "tiny-random", "tiny-random:3"])
    assert prepare.func is cli.cmd_models
    assert prepare.specs == ["tiny-random", "tiny-random:3"]
    generate = parser.parse_args(["generate", "hi", "--max-tokens", "5"])
    assert (generate.prompt, generate.max_tokens, generate.model) == (
        "hi",
        5,
        "smollm2-135m-instruct",
    )


@pytest.mark.parametrize(
    "argv", [[], ["models"], ["models", "prepare"], ["frobnicate"], ["generate"]]
)
def test_incomplete_command_lines_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert "usage: loomrl" in capsys.readouterr().err


# -- commands ------------------------------------------------------------------------------


def flat(text: str) -> str:
    """Rich wraps long lines at the console width; compare text with spaces normalised."""
    return " ".join(text.split())


def rows(*checks):
    return lambda: list(checks)


def test_doctor_exit_code_ignores_unprepared_models(monkeypatch, capsys):
    monkeypatch.setattr(
        doctor,
        "run_checks",
        rows(Check("torch", True, "2.13"), Check("model tiny-random", False, "no", "prepare")),
    )
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "loomrl doctor" in out and "tiny-random" in out


def test_doctor_exit_code_is_1_when_something_needs_fixing(monkeypatch, capsys):
    monkeypatch.setattr(
        doctor, "run_checks", rows(Check("torch", True, "ok"), Check("vllm", False, "missing", "x"))
    )
    assert cli.main(["doctor"]) == 1
    assert "vllm" in capsys.readouterr().out


def table_rows(text: str) -> dict[str, tuple[str, ...]]:
    """``name -> (state, detail, fix)`` from a Rich table printed wide enough not to wrap."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("│┃|").split("│")]
        if len(cells) == 4 and cells[1] in ("ok", "fix"):
            rows[cells[0]] = tuple(cells[1:])
    return rows


def test_loomrl_doctor_runs_for_real(home, monkeypatch):
    """The real command on this machine: the environment the tests run in has everything
    (torch, vllm, no conflicting packages) and LOOMRL_HOME decides which models are ready."""
    (home / "models" / "tiny-random-seed0").mkdir(parents=True)
    (home / "models" / "tiny-random-seed0" / MARKER).write_text("{}")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setenv("COLUMNS", "250")  # one line per row
    monkeypatch.setenv("PYTHONIOENCODING", "utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "loomrl.cli", "doctor"],
        capture_output=True,
        encoding="utf-8",
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "loomrl doctor" in result.stdout
    shown = table_rows(result.stdout)
    # What it prints is what the checks find here, row by row.
    assert shown == {
        row.name: ("ok" if row.ok else "fix", row.detail, row.fix) for row in run_checks()
    }
    assert shown["torch"][0] == "ok" and shown["torch"][1].startswith(metadata.version("torch"))
    assert shown["vllm"][0] == "ok" and shown["vllm"][1].startswith(("vllm-cpu ", "vllm "))
    assert shown["vision/audio packages"][0] == "ok"
    assert shown["KV cache"][0] == "ok" and "loomrl default on CPU" in shown["KV cache"][1]
    assert shown["model tiny-random"] == ("ok", str(home / "models" / "tiny-random-seed0"), "")
    assert shown["model smollm2-135m-instruct"] == (
        "fix",
        "not prepared yet (built on first use)",
        "loomrl models prepare smollm2-135m-instruct",
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [("no-such-model", "unknown model 'no-such-model'"), ("tiny-random:x", "must be an integer")],
)
def test_models_prepare_with_a_bad_spec_exits_2_with_the_reason(home, capsys, spec, message):
    assert cli.main(["models", "prepare", spec]) == 2
    out = flat(capsys.readouterr().err)
    assert "error:" in out and message in out
    assert "Traceback" not in out
    assert not (home / "models").exists()


def test_models_prepare_bad_spec_from_the_installed_command(home):
    result = subprocess.run(
        [sys.executable, "-m", "loomrl.cli", "models", "prepare", "no-such-model"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert "unknown model 'no-such-model'" in flat(result.stderr)
    assert "Traceback" not in result.stdout + result.stderr


def test_models_prepare_prints_the_path_of_each_model(home, tmp_path, capsys):
    model = tmp_path / "local-model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (model / name).write_text("{}")
    (model / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")
    assert cli.main(["models", "prepare", str(model)]) == 0
    assert str(model.resolve()) in capsys.readouterr().out.replace("\n", "")


def test_console_script_is_installed():
    scripts = {ep.name: ep.value for ep in metadata.entry_points(group="console_scripts")}
    assert scripts.get("loomrl") == "loomrl.cli:main"
