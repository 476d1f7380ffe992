"""Quiet by default: the libraries' output (Python warnings, logging, C-level writes,
child processes) lands in ``RUN_DIR/run.log``; loomrl's console and error lines stay on
the terminal. Run in a subprocess whose descriptors 1 and 2 are real pipes, as a user's
terminal is."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from loomrl.cli.quiet import verbose_requested

SCRIPT = textwrap.dedent(
    """
    import logging, os, subprocess, sys, warnings
    from pathlib import Path
    from loomrl.cli.output import console, print_note
    from loomrl.cli.quiet import libraries_to_run_log
    from loomrl.terminal import status

    run, verbose, resume, fail = Path(sys.argv[1]), *(a == "1" for a in sys.argv[2:5])
    console._force_terminal = True  # as on a terminal: live displays catch other output
    try:
        with libraries_to_run_log(run, verbose=verbose, resume=resume):
            console.print("progress: 3/3")
            with status(console, "starting the engine"):  # vLLM starts under a spinner
                print("a library's print under a spinner")
                logging.getLogger("vllm").warning("WARNING a warning under a spinner")
            print_note("a note for the user")
            warnings.warn("a library's deprecation notice")
            logging.getLogger("vllm").warning("WARNING libtcmalloc is not found")
            os.write(2, b"[W1128 utils.cpp:68] NUMA binding\\n")
            subprocess.run(["sh", "-c", "echo engine core says hello >&2"], check=True)
            if fail:
                logging.getLogger("vllm").error("ERROR EngineCore failed to start")
                raise SystemExit(3)
        console.print("summary table")
    except SystemExit:
        raise
    """
)


def _run(tmp_path, *, verbose=False, resume=False, fail=False):
    flags = [str(int(x)) for x in (verbose, resume, fail)]
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "run"), *flags],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


LIBRARY_LINES = (
    "deprecation notice", "libtcmalloc", "NUMA binding", "engine core says",
    "print under a spinner", "warning under a spinner",
)  # fmt: skip


def test_library_output_goes_to_the_run_log_and_loomrls_to_the_terminal(tmp_path):
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "progress: 3/3" in done.stdout and "summary table" in done.stdout
    assert "note: a note for the user" in done.stderr
    for line in LIBRARY_LINES:
        assert line not in done.stdout + done.stderr
    log = (tmp_path / "run" / "run.log").read_text()
    for line in LIBRARY_LINES:
        assert line in log
    assert "progress" not in log and "a note for the user" not in log


def test_a_new_run_starts_a_new_log_and_a_resumed_one_appends(tmp_path):
    _run(tmp_path)
    _run(tmp_path)
    assert (tmp_path / "run" / "run.log").read_text().count("engine core says") == 1
    _run(tmp_path, resume=True)
    assert (tmp_path / "run" / "run.log").read_text().count("engine core says") == 2


def test_a_failed_run_shows_the_libraries_errors_and_where_the_log_is(tmp_path):
    done = _run(tmp_path, fail=True)
    assert done.returncode == 3
    assert "EngineCore failed to start" in done.stderr
    assert f"is in {tmp_path / 'run' / 'run.log'}" in done.stderr
    assert "libtcmalloc" not in done.stderr  # warnings stay in the log


def test_verbose_leaves_everything_on_the_terminal(tmp_path):
    done = _run(tmp_path, verbose=True)
    assert done.returncode == 0
    for line in LIBRARY_LINES:
        assert line in done.stdout + done.stderr
    assert not (tmp_path / "run" / "run.log").exists()


@pytest.mark.parametrize(("flag", "env", "verbose"), [
    (False, "", False), (True, "", True), (False, "debug", True), (False, "DEBUG", True),
    (False, "info", False),
])  # fmt: skip
def test_loomrl_log_debug_is_the_same_as_verbose(monkeypatch, flag, env, verbose):
    monkeypatch.setenv("LOOMRL_LOG", env)
    assert verbose_requested(flag) is verbose
