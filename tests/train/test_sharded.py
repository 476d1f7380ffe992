"""Several learner ranks (FSDP2 over gloo on this CPU): two ranks, their models built on the
meta device and loaded by rank 0 alone, take exactly the step one process takes
(gradients, metrics, weights and optimizer state, fp32 within 1e-6) with the chunked,
logits-free head, and a
``loomrl train`` with two ranks that is SIGKILLed resumes with every step once and no rank
left behind; a rank that dies while starting or while the models load is named; a
checkpoint that a rank cannot see (another host, no shared filesystem) is
refused on every rank instead of written without that rank's optimizer shard."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import test_learner
import torch
from test_learner import ADVANTAGES, SHAPES, adv_rows, make_trajs
from train_child import child_script, resume_scripted, rows_logged, step_rows, train_scripted

from loomrl.experience import pad
from loomrl.models import resolve
from loomrl.train.checkpoint import latest_checkpoint
from loomrl.train.learner import Learner, LearnerConfig
from loomrl.train.sharding import load_optimizer

base = test_learner.base  # the fixture
TESTS = Path(__file__).resolve().parents[1]
#: Five samples in micro-batches of one sample each: three on one rank, two and a
#: filler on the other. KL to a (sharded) reference, no clipping of the gradient.
CONFIG = dict(lr=1e-3, autocast=None, max_tokens=16, kl_coef=0.1, max_grad_norm=1e9)


def run_ranks(job: Path, world: int, timeout: float = 180) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    script = str(TESTS / "sharded_child.py")
    procs = [
        subprocess.Popen([sys.executable, script, str(job), str(r), str(world)], env=env)
        for r in range(world)
    ]
    try:
        for proc in procs:
            assert proc.wait(timeout=timeout) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_two_ranks_take_the_step_of_one_process(base, tmp_path):
    trajs = make_trajs(base, [*SHAPES, (4, 2, [1, 1])])
    batch = pad(trajs, adv_rows(trajs, [*ADVANTAGES, 0.3]), pad_token_id=7)
    torch.save(
        {"batch": batch, "config": CONFIG, "state": base.state_dict(),
         "model_dir": resolve("tiny-random")}, tmp_path / "job.pt",
    )  # fmt: skip
    run_ranks(tmp_path, world=2)
    sharded = torch.load(tmp_path / "out.pt", weights_only=False)

    reference = copy.deepcopy(base)
    reference.load_state_dict(
        type(base).from_pretrained(resolve("tiny-random"), dtype=torch.float32).state_dict()
    )
    reference.requires_grad_(False)
    one = Learner(copy.deepcopy(base), LearnerConfig(**CONFIG), reference)
    metrics = one.step(batch)
    assert metrics["micro_batches"] == sharded["metrics"]["micro_batches"] == 5
    for key in ("loss", "kl", "grad_norm", "entropy", "approx_kl", "logprob_gap_p99"):
        assert sharded["metrics"][key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-7), key
    for name, param in one.model.named_parameters():
        assert (sharded["grads"][name] - param.grad).abs().max() <= 1e-6, name
        assert (sharded["weights"][name] - param.detach()).abs().max() <= 1e-6, name
    # every forward pass (the reference's, the old policy's, the update's) on each rank
    # scored its tokens from the hidden states: no [k, V] logits were made
    assert sharded["heads"].get("chunked", 0) >= 3 and "logits" not in sharded["heads"]

    # The two ranks' optimizer shards load into one process (DCP) as its own state.
    fresh = Learner(copy.deepcopy(base), LearnerConfig(**CONFIG), reference)
    load_optimizer(fresh.model, fresh.optimizer, tmp_path / "optimizer")
    mine, loaded = one.optimizer.state_dict()["state"], fresh.optimizer.state_dict()["state"]
    assert mine.keys() == loaded.keys()
    for index, state in mine.items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert (loaded[index][key] - state[key]).abs().max() <= 1e-6


STEPS = 3
TRAIN = dict(
    model="tiny-random", env="arith", env_args={"max_operand": 5}, steps=STEPS,
    prompts_per_step=2, n=3, max_tokens=8, max_len=256, checkpoint_every=1, lr=1e-3,
    learner_world_size=2, micro_batch_tokens=32,
)  # fmt: skip


def ranks_of(pid: int) -> list[psutil.Process]:
    children = psutil.Process(pid).children(recursive=True)
    return [p for p in children if "loomrl.run.learner_rank" in " ".join(p.cmdline())]


async def test_a_sigkilled_two_rank_run_resumes_with_every_step_once(tmp_path, tokenizer):
    script = tmp_path / "child.py"
    script.write_text(child_script(TRAIN, 'f"Answer: {i % 7}"', step_s=0.2))
    out = tmp_path / "run"
    child = subprocess.Popen([sys.executable, str(script), str(out)], start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (out / "checkpoints" / "step-000001" / "state.json").is_file():
            assert child.poll() is None, "training ended before it could be killed"
            assert time.monotonic() < deadline, "no first checkpoint within 180 s"
            time.sleep(0.01)
        ranks = ranks_of(child.pid)
        assert len(ranks) == 1  # rank 1; rank 0 is the driver itself
        os.kill(child.pid, signal.SIGKILL)  # the driver only: its rank must notice
        child.wait()
        _, alive = psutil.wait_procs(ranks, timeout=30)
        assert not alive, "a learner rank outlived its SIGKILLed driver"
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    killed_at = rows_logged(out)
    assert 1 <= killed_at < STEPS
    assert latest_checkpoint(out).step >= 1

    rows = await resume_scripted(TRAIN, out, tokenizer, "Answer: 3")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(len(step_rows(out, step)) == 6 for step in range(1, STEPS + 1))
    assert latest_checkpoint(out).step == STEPS
    assert (latest_checkpoint(out).path / "optimizer" / ".metadata").is_file()
    assert rows[-1]["learner/device"] == "cpu"
    assert rows[-1]["learner/micro_batch_tokens"] == 32


async def test_a_two_rank_run_with_a_critic_trains_as_one_process_does(tmp_path, tokenizer):
    """PPO with a critic, two steps: policy and critic sharded over two ranks log what one
    process logs (bf16 autocast off: fp32 sums in another order stay within 1e-4)."""
    config = {**TRAIN, "estimator": "gae", "steps": 2, "autocast": "none"}

    async def run(world: int) -> list[dict]:
        settings = {**config, "learner_world_size": world}
        return await train_scripted(settings, tmp_path / f"run-{world}", tokenizer)

    one, two = await run(1), await run(2)
    for a, b in zip(one, two, strict=True):
        for key in ("loss", "grad_norm", "value_loss", "critic_grad_norm", "values_mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), key
    critic = latest_checkpoint(tmp_path / "run-2").path
    assert (critic / "critic-optimizer" / ".metadata").is_file()


def test_a_rank_that_dies_while_starting_is_named_not_waited_for(tmp_path, monkeypatch):
    """The driver would otherwise wait in the rendezvous for a rank that never comes."""
    from loomrl.run import learner_ranks
    from loomrl.train.config import TrainConfig

    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'no torch here' >&2\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setattr(learner_ranks.sys, "executable", str(broken))
    config = TrainConfig(**{**TRAIN, "learner_world_size": 3})
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"learner rank 1 exited while starting \(3\)"):
        learner_ranks.LearnerGroup.start(config, None)
    assert time.monotonic() - started < 30


SEES = """import sys, time, torch.distributed as dist
from pathlib import Path
from loomrl.train.sharding import check_shared_dir
job, rank, path = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
dist.init_process_group("gloo", init_method=f"file://{job / 'rendezvous'}", rank=rank, world_size=2)
try:
    if rank == 0:  # rank 0 makes the staging directory late: rank 1 must not look before
        time.sleep(1.0)
        path.mkdir(parents=True)
    check_shared_dir(path)
    (job / f"rank{rank}").write_text("ok")
except Exception as exc:
    (job / f"rank{rank}").write_text(f"{type(exc).__name__}: {exc}")
finally:
    dist.destroy_process_group()
"""


def test_a_rank_that_cannot_see_the_run_directory_fails_the_save_on_every_rank(tmp_path):
    """A rank on a host without the run directory would write its optimizer shard into a
    directory of its own host (DCP makes one) and leave the checkpoint without it: every
    rank is told instead, naming the rank that does not see it."""
    import socket

    script = tmp_path / "sees.py"
    script.write_text(SEES)
    staging = Path("run") / "checkpoints" / ".tmp-step-000001"
    for job in ("shared", "split"):
        where = tmp_path / job
        mine = where / staging  # rank 0's; rank 1 sees it, or a path only its host has
        elsewhere = tmp_path / "other-host" / staging
        paths = (mine, mine) if job == "shared" else (mine, elsewhere)
        where.mkdir()
        procs = [
            subprocess.Popen([sys.executable, str(script), str(where), str(r), str(paths[r])])
            for r in range(2)
        ]
        try:
            for proc in procs:
                assert proc.wait(timeout=120) == 0
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        said = [(where / f"rank{r}").read_text() for r in range(2)]
        if job == "shared":
            assert said == ["ok", "ok"]
            continue
        host = socket.gethostname()
        for text, path in zip(said, paths, strict=True):  # each names the path it was given
            assert text == (
                f"CheckpointError: learner rank 1 (on {host}) does not see {path}, the "
                f"checkpoint rank 0 (on {host}) is writing, which every rank adds its "
                "optimizer shard to: learner ranks on other hosts need the run directory "
                "(out) on a filesystem every host shares, at the same path"
            )
        assert not elsewhere.exists()  # nothing was written on the "other host"


BROKEN_RANK = """import sys
import loomrl.run.train_models as train_models
def unreadable(*args, **kwargs):
    raise OSError("the model's files are not on this host")
train_models.empty_lm = unreadable
from loomrl.run.learner_rank import main
sys.exit(main())
"""


def test_a_rank_that_dies_while_the_models_load_is_named(tmp_path, monkeypatch):
    """Rank 1 fails before its shards are filled: the driver, waiting in the broadcast,
    names it instead of raising the backend's "Connection closed by peer"."""
    from types import SimpleNamespace

    from loomrl.run import learner_ranks
    from loomrl.train.config import TrainConfig

    rank = tmp_path / "broken_rank.py"
    rank.write_text(BROKEN_RANK)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {rank}\n")
    python.chmod(0o755)
    monkeypatch.setattr(learner_ranks.sys, "executable", str(python))
    plan = SimpleNamespace(config=TrainConfig(**TRAIN), checkpoint=None, memory=None)
    with pytest.raises(RuntimeError, match=r"^learner rank 1 exited \(1\); see its error above$"):
        learner_ranks.open_models(plan)
