"""Learner ranks started by torchrun (its own ``MASTER_ADDR``, ``RANK``, ``WORLD_SIZE``, ...):
rank 0 drives, rank 1 serves it; two ranks train two steps, end with their SIGKILLed
driver and resume to a third, and a ``learner_world_size`` that disagrees with
``WORLD_SIZE`` is refused in one line without leaving the other rank waiting."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from train_child import rows_logged, step_rows

from loomrl.distributed.launch_env import LaunchEnv, launched, local_rank
from loomrl.run.torchrun_ranks import check_world
from loomrl.train.checkpoint import latest_checkpoint
from loomrl.train.config import TrainConfig

pytestmark = pytest.mark.timeout(300)
TESTS = Path(__file__).resolve().parents[1]
TRAIN = dict(
    model="tiny-random", env="arith", env_args={"max_operand": 5}, steps=2,
    prompts_per_step=2, n=3, max_tokens=8, max_len=256, checkpoint_every=1, lr=1e-3,
    learner_world_size=2, micro_batch_tokens=32,
)  # fmt: skip
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def torchrun(*args: str) -> subprocess.Popen[str]:
    """``torchrun --standalone --nproc-per-node 2 ARGS`` in a session of its own."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return subprocess.Popen(
        [*cmd, *args], env=env, start_new_session=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def train_run(out: Path, config: dict, step_s: float = 0.0, *extra: str) -> subprocess.Popen[str]:
    script = str(TESTS / "torchrun_train.py")
    return torchrun(script, str(out), json.dumps(config), str(step_s), *extra)


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str]:
    """Its exit status and stderr (killed, with its session, if it outlives ``timeout``)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        raise AssertionError(f"torchrun still running after {timeout} s: {err[-2000:]}") from None
    return proc.returncode, err


def workers(launcher: int) -> dict[str, psutil.Process]:
    """torchrun's worker processes by their RANK."""
    found = {}
    for proc in psutil.Process(launcher).children(recursive=True):
        try:
            rank = proc.environ().get("RANK")
        except psutil.Error:
            continue
        if rank is not None and "torchrun_train.py" in " ".join(proc.cmdline()):
            found[rank] = proc
    return found


def test_two_torchrun_ranks_train_two_steps_die_with_their_driver_and_resume(tmp_path):
    """Rank 0 SIGKILLed once two steps are checkpointed: the launcher and rank 1 end with
    it; the run resumed under torchrun again ends with every step recorded once."""
    out, config = tmp_path / "run", {**TRAIN, "steps": 3}
    proc = train_run(out, config, 0.2)
    try:
        deadline = time.monotonic() + 180
        while not (out / "checkpoints" / "step-000002" / "state.json").is_file():
            assert proc.poll() is None, "training ended before it could be killed"
            assert time.monotonic() < deadline, "no second checkpoint within 180 s"
            time.sleep(0.05)
        ranks = workers(proc.pid)
        assert sorted(ranks) == ["0", "1"]
        ranks["0"].kill()  # the driver alone: the launcher and rank 1 must notice
        _, alive = psutil.wait_procs([ranks["1"]], timeout=30)
        assert not alive, "rank 1 outlived its SIGKILLed driver"
        code, _ = finish(proc, timeout=60)
        assert code != 0  # torchrun reports the failed driver
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert rows_logged(out) == 2
    assert (latest_checkpoint(out).path / "optimizer" / ".metadata").is_file()  # two shards

    code, err = finish(train_run(out, config, 0.0, "resume"))
    assert code == 0, err[-3000:]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2, 3]
    assert all(len(step_rows(out, step)) == 6 for step in (1, 2, 3))
    assert latest_checkpoint(out).step == 3
    assert logged[-1]["learner/device"] == "cpu"


def test_a_world_size_that_disagrees_is_refused_in_one_line(tmp_path):
    """``loomrl train`` as torchrun runs it: the driver refuses before any model loads,
    and rank 1, waiting for it, is told to end instead of left in the rendezvous."""
    config = tmp_path / "train.toml"
    config.write_text('[train]\nmodel = "tiny-random"\nenv = "arith"\nsteps = 1\n')
    started = time.monotonic()
    proc = torchrun("-m", "loomrl.cli", "train", str(config), "--out", str(tmp_path / "run"))
    code, err = finish(proc, timeout=120)
    assert code != 0
    assert (
        "error: learner_world_size = 1 but the launcher started 2 processes (WORLD_SIZE=2): "
        "set learner_world_size = 2, or start as many processes as it says"
    ) in err
    assert time.monotonic() - started < 90
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_driver_that_ends_before_joining_ends_its_ranks(tmp_path):
    """Rank 0 exits without ever loading models (as a refused or printed-only run does):
    rank 1, waiting for it in the rendezvous, is joined and told to end, so the launch
    ends at once instead of waiting out the rendezvous timeout."""
    script = tmp_path / "early.py"
    script.write_text(
        "import os, sys\nfrom pathlib import Path\n"
        "from loomrl.run.torchrun_ranks import serve_unless_driver\n"
        "served = serve_unless_driver()\n"
        "(Path(sys.argv[1]) / ('rank' + os.environ['RANK'])).write_text(repr(served))\n"
    )
    started = time.monotonic()
    code, err = finish(torchrun(str(script), str(tmp_path)), timeout=120)
    assert code == 0, err[-3000:]
    assert (tmp_path / "rank0").read_text() == "None"  # the driver went on
    assert (tmp_path / "rank1").read_text() == "0"  # rank 1 served, and ended cleanly
    assert time.monotonic() - started < 90


def test_the_launchers_environment_is_read_or_refused_by_name():
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "RANK": "3", "WORLD_SIZE": "8",
           "LOCAL_RANK": "1"}  # fmt: skip
    assert launched(env) == LaunchEnv("10.0.0.1", 29500, 3, 8, 1)
    assert launched({}) is None and launched({"WORLD_SIZE": "1", "RANK": "0"}) is None
    with pytest.raises(ValueError, match="WORLD_SIZE=2 but MASTER_ADDR, MASTER_PORT is not set"):
        launched({"RANK": "1", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="RANK='x' is not a non-negative integer"):
        launched({**env, "RANK": "x"})
    with pytest.raises(ValueError, match="RANK=8 is outside WORLD_SIZE=8"):
        launched({**env, "RANK": "8"})
    assert local_rank() == int(os.environ.get("LOCAL_RANK", "0"))


def test_a_launched_run_takes_its_ranks_from_the_launcher_alone():
    launch = LaunchEnv("10.0.0.1", 29500, 0, 2, 0)
    check_world(TrainConfig(**TRAIN), launch)  # agrees
    check_world(TrainConfig(**{**TRAIN, "learner_world_size": 3}), None)  # no launcher
    on_ray = TrainConfig(**TRAIN, ray={"learner_ranks": "cluster"})
    with pytest.raises(ValueError, match=r"\[ray\] learner_ranks = 'cluster' but a launcher"):
        check_world(on_ray, launch)
