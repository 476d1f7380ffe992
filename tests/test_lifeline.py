"""Children die with the process that started them, even when it is SIGKILLed: a child
that armed ``watch_parent`` (what vLLM's processes do through loomrl's plugin) and a
command started with ``preexec_fn=die_with_parent``. The plugin arms only in processes
another process marked, and is registered as a vLLM general plugin."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from loomrl import lifeline

# The lifeline module loaded by path: a child needs no `import loomrl` (seconds).
LOAD = textwrap.dedent(
    f"""
    import importlib.util, os, signal, subprocess, sys, threading, time
    spec = importlib.util.spec_from_file_location("lifeline", {lifeline.__file__!r})
    lifeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lifeline)
    """
)


def start_middle(body: str) -> tuple[subprocess.Popen[str], int]:
    """A middle process running ``body`` (which starts a grandchild and prints its pid),
    then sleeping; returns it and the grandchild's pid."""
    middle = subprocess.Popen(
        [sys.executable, "-c", LOAD + textwrap.dedent(body) + "\ntime.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert middle.stdout is not None
    line = middle.stdout.readline()
    assert line.strip().isdigit(), f"the middle process said {line!r}"
    return middle, int(line)


def kill_main_and_check(middle: subprocess.Popen[str], grandchild: int) -> None:
    """SIGKILL the middle process alone; its child must be gone within 15 s."""
    child = psutil.Process(grandchild)
    try:
        middle.send_signal(signal.SIGKILL)
        middle.wait(timeout=10)
        _, alive = psutil.wait_procs([child], timeout=15)
        assert not alive, f"pid {grandchild} outlived its parent"
    finally:
        with contextlib.suppress(ProcessLookupError):  # what is left of its session
            os.killpg(middle.pid, signal.SIGKILL)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="watch_parent needs os.pidfd_open")
def test_a_child_that_watches_its_parent_dies_with_it():
    body = f"""
    code = {LOAD!r} + "assert lifeline.watch_parent(); print('armed', flush=True); time.sleep(120)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "armed"
    print(child.pid, flush=True)
    """
    middle, pid = start_middle(body)
    kill_main_and_check(middle, pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_command_started_with_die_with_parent_dies_with_it():
    body = """
    child = subprocess.Popen(["sleep", "120"], preexec_fn=lifeline.die_with_parent)
    print(child.pid, flush=True)
    """
    middle, pid = start_middle(body)
    kill_main_and_check(middle, pid)


@pytest.mark.parametrize(
    ("marked", "arms"),
    [("other", True), ("self", False), (None, False)],
)
def test_the_plugin_arms_only_where_another_process_marked_the_environment(marked, arms):
    code = LOAD + textwrap.dedent(
        """
        marked = sys.argv[1]
        if marked == "self":
            lifeline.mark_children()
        elif marked == "other":
            os.environ[lifeline.ENV] = str(os.getppid())
        lifeline.arm_from_env()
        print(any(t.name == "loomrl-lifeline" for t in threading.enumerate()))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != lifeline.ENV}
    done = subprocess.run(
        [sys.executable, "-c", code, str(marked)], capture_output=True, text=True, env=env,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(arms)


def test_child_env_marks_the_child_with_this_process():
    env = lifeline.child_env({"PATH": "/bin"})
    assert env == {"PATH": "/bin", lifeline.ENV: str(os.getpid())}


def test_vllm_loads_the_lifeline_as_a_general_plugin():
    plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
    found = {ep.name: ep.value for ep in plugins}
    assert found.get("loomrl_lifeline") == "loomrl.lifeline:arm_from_env"


def test_the_reaper_kills_what_left_the_group_once_its_process_is_killed():
    """A grandchild in a session of its own (as a daemon or Ray's agents are) has no
    parent to watch once it is reparented; the reaper finds it by the run's mark."""
    code = textwrap.dedent(
        """
        import subprocess, sys, time
        from loomrl import lifeline
        lifeline.start_reaper()
        child = subprocess.Popen(["sleep", "120"], start_new_session=True)
        print(child.pid, lifeline._reaper.pid, flush=True)
        time.sleep(120)
        """
    )
    middle = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert middle.stdout is not None
    child, reaper = (psutil.Process(int(pid)) for pid in middle.stdout.readline().split())
    assert child.environ()["LOOMRL_RUN_MARK"] == middle_mark(middle.pid)
    try:
        middle.send_signal(signal.SIGKILL)
        middle.wait(timeout=10)
        _, alive = psutil.wait_procs([child, reaper], timeout=15)
        assert not alive, "the sleep or the reaper outlived the killed process"
    finally:
        for proc in (child, reaper):
            with contextlib.suppress(psutil.Error):
                proc.kill()


def middle_mark(pid: int) -> str:
    """The run mark a process set in its environment (its reaper's argument)."""
    reapers = [p for p in psutil.Process(pid).children() if "reaper.py" in " ".join(p.cmdline())]
    assert len(reapers) == 1
    return reapers[0].cmdline()[-1]
