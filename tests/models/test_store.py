"""build_atomically: the final directory exists only when complete, a failed or killed
build leaves nothing that looks finished, and concurrent processes build once.

The build callables are cheap fakes that write the files of a model directory; the
processes, the file lock and the file system are real.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from loomrl.models.store import MARKER, build_atomically, missing_parts, models_dir

NAME = "fake-model"
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LOOMRL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def write_fake_model(out: Path) -> None:
    for name in MODEL_FILES:
        (out / name).write_text(json.dumps({"file": name}))


def tmp_dirs(name: str = NAME) -> list[Path]:
    return sorted(models_dir().glob(f".tmp-{name}@*"))


def wait_for(path: Path, proc: subprocess.Popen | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode}: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.01)


# -- in one process ------------------------------------------------------------------------


def test_build_runs_in_a_hidden_sibling_and_lands_complete(home):
    final = models_dir() / NAME
    seen = {}

    def build(out: Path) -> None:
        seen["out"] = out
        seen["empty"] = not any(out.iterdir())
        write_fake_model(out)
        seen["final_during_build"] = final.exists()
        seen["marker_during_build"] = (out / MARKER).exists()

    result = build_atomically(NAME, build, {"source": "test", "n": 1})

    assert result == final
    assert seen["out"].parent == models_dir()
    assert seen["out"].name.startswith(f".tmp-{NAME}@")
    assert seen["empty"]
    assert not seen["final_during_build"]
    assert not seen["marker_during_build"]
    assert not seen["out"].exists()  # renamed, not copied
    assert json.loads((final / MARKER).read_text()) == {"source": "test", "n": 1}
    assert not missing_parts(final)
    assert stat.S_IMODE(final.stat().st_mode) == 0o755
    assert tmp_dirs() == []


def test_marker_is_written_after_every_model_file(home):
    def build(out: Path) -> None:
        write_fake_model(out)
        time.sleep(0.02)  # leave the file system clock room to tell the writes apart
        (out / "late-file.txt").write_text("written last by the build")

    final = build_atomically(NAME, build, {})
    marker_time = (final / MARKER).stat().st_mtime_ns
    others = [p for p in final.iterdir() if p.name != MARKER]
    assert len(others) == len(MODEL_FILES) + 1
    assert all(p.stat().st_mtime_ns <= marker_time for p in others)


def test_a_finished_model_is_not_built_again(home):
    calls = []

    def build(out: Path) -> None:
        calls.append(out)
        write_fake_model(out)

    first = build_atomically(NAME, build, {})
    second = build_atomically(NAME, build, {})
    assert first == second
    assert len(calls) == 1


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_a_build_that_raises_leaves_nothing_behind(home, error):
    def build(out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise error

    with pytest.raises(type(error)):
        build_atomically(NAME, build, {})
    assert not (models_dir() / NAME).exists()
    assert tmp_dirs() == []
    # and the next attempt starts clean and succeeds
    assert (build_atomically(NAME, write_fake_model, {}) / MARKER).is_file()


def test_an_incomplete_build_is_an_error_naming_what_it_left_out(home):
    def build(out: Path) -> None:
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_text("")

    with pytest.raises(RuntimeError) as info:
        build_atomically(NAME, build, {})
    message = str(info.value)
    assert repr(NAME) in message
    assert "tokenizer (tokenizer.json or tokenizer.model)" in message
    assert "tokenizer_config.json" in message
    assert "weights" not in message
    assert not (models_dir() / NAME).exists()
    assert tmp_dirs() == []


def test_stale_temporary_dirs_of_this_model_are_removed(home):
    models_dir().mkdir(parents=True)
    stale = models_dir() / f".tmp-{NAME}@abc123"
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    other = models_dir() / ".tmp-another-model@abc123"
    other.mkdir()
    longer_name = models_dir() / f".tmp-{NAME}-v2@abc123"  # a model whose name extends ours
    longer_name.mkdir()

    build_atomically(NAME, write_fake_model, {})
    assert not stale.exists()
    assert other.exists()  # another model's build is not ours to clean
    assert longer_name.exists()


def test_a_final_dir_without_marker_is_replaced(home):
    final = models_dir() / NAME
    final.mkdir(parents=True)
    (final / "half-copied.bin").write_text("junk")

    assert build_atomically(NAME, write_fake_model, {"fresh": True}) == final
    assert not (final / "half-copied.bin").exists()
    assert json.loads((final / MARKER).read_text()) == {"fresh": True}


# -- across processes ----------------------------------------------------------------------

BUILDER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from loomrl.models.store import build_atomically

    sync, mode = Path(sys.argv[1]), sys.argv[2]
    pid = os.getpid()

    def build(out):
        with open(sync / "builds.log", "a") as log:
            log.write(f"{pid}\\n")
        for name in ("config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"):
            (out / name).write_text(json.dumps({"file": name}))
        (sync / f"building-{pid}").touch()
        if mode == "hang":
            time.sleep(600)
        if mode == "wait":
            while not (sync / "go").exists():
                time.sleep(0.01)
        if mode == "slow":
            time.sleep(0.5)

    (sync / f"calling-{pid}").touch()
    print(build_atomically(sys.argv[3], build, {"by": pid}), flush=True)
    """
)


def start_builder(tmp_path: Path, mode: str, name: str = NAME) -> subprocess.Popen:
    script = tmp_path / "builder.py"
    script.write_text(BUILDER)
    sync = tmp_path / "sync"
    sync.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, str(script), str(sync), mode, name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),  # carries LOOMRL_HOME
    )


def builds_logged(tmp_path: Path) -> list[int]:
    log = tmp_path / "sync" / "builds.log"
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out.strip()


def test_killed_build_leaves_no_final_dir_and_the_next_build_recovers(home, tmp_path):
    proc = start_builder(tmp_path, "hang")
    try:
        wait_for(tmp_path / "sync" / f"building-{proc.pid}", proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    assert not (models_dir() / NAME).exists()
    leftovers = tmp_dirs()
    assert len(leftovers) == 1  # the half-built directory, with all files but no marker
    assert not (leftovers[0] / MARKER).exists()

    calls = []

    def build(out: Path) -> None:
        calls.append(out)
        write_fake_model(out)

    final = build_atomically(NAME, build, {"after": "kill"})
    assert len(calls) == 1
    assert json.loads((final / MARKER).read_text()) == {"after": "kill"}
    assert tmp_dirs() == []


def test_a_process_arriving_during_a_build_waits_and_reuses_it(home, tmp_path):
    sync = tmp_path / "sync"
    first = start_builder(tmp_path, "wait")
    wait_for(sync / f"building-{first.pid}", first)
    second = start_builder(tmp_path, "wait")
    wait_for(sync / f"calling-{second.pid}", second)
    time.sleep(0.3)  # let it reach the lock, which the first process holds
    assert second.poll() is None  # blocked, not finished with a half-built model
    (sync / "go").touch()

    paths = {finish(first), finish(second)}
    final = models_dir() / NAME
    assert paths == {str(final)}
    assert builds_logged(tmp_path) == [first.pid]
    assert json.loads((final / MARKER).read_text()) == {"by": first.pid}
    assert not missing_parts(final)
    assert tmp_dirs() == []


def test_two_processes_started_together_build_once(home, tmp_path):
    procs = [start_builder(tmp_path, "slow") for _ in range(2)]
    paths = {finish(proc) for proc in procs}
    final = models_dir() / NAME
    assert paths == {str(final)}
    builders = builds_logged(tmp_path)
    assert len(builders) == 1
    assert builders[0] in {proc.pid for proc in procs}
    assert json.loads((final / MARKER).read_text()) == {"by": builders[0]}
    assert tmp_dirs() == []
