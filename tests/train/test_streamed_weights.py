"""A sharded learner's weight sync streams (``loomrl.train.streaming``): two gloo ranks on
this CPU, a small tiny-random-shaped model, ``GatheredWeights`` sent through real
``TransferLink``s. What arrives equals ``full_weights`` exactly, for one engine and for a
pool of two reading at once; rank 0 never holds more than a window plus one tensor of
gathered weights (far below the model); a receiver that fails midway leaves no rank in a
collective and the next sync works. A sync in the engine's dtype casts each shard before
it is gathered (no float32 tensor reaches the host), an NCCL sync's tensors stay on the
learner's device, and the sync dtype is the engines' where the config fixes it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from streamed_child import LinkEngine, received

from loomrl.engines.pool import EnginePool
from loomrl.engines.scripted import ScriptedEngine
from loomrl.models import resolve
from loomrl.train.streaming import GatheredWeights

TESTS = Path(__file__).resolve().parents[1]
BUCKET = 64 << 10
#: tiny-random's layers, more of them, and a vocabulary that leaves the (tied) embedding
#: one tensor among many instead of half the model.
OVERRIDES = {"vocab_size": 512, "num_hidden_layers": 4}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The two ranks' run: every sync of ``streamed_child`` (about 10 s)."""
    where = tmp_path_factory.mktemp("streamed")
    spec = {"model_dir": resolve("tiny-random"), "overrides": OVERRIDES, "bucket": BUCKET}
    torch.save(spec, where / "job.pt")
    root = TESTS.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(TESTS)])}
    script = str(TESTS / "streamed_child.py")
    procs = [
        subprocess.Popen([sys.executable, script, str(where), str(r), "2"], env=env)
        for r in range(2)
    ]
    try:
        for proc in procs:
            assert proc.wait(timeout=120) == 0  # a rank left in a collective would hang
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {
        **torch.load(where / "out.pt", weights_only=False),
        "rank1": torch.load(where / "rank1.pt", weights_only=False),
    }


def same(got: dict[str, torch.Tensor], full: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(full)
    for name, tensor in full.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_the_specs_name_every_tensor_of_the_full_state_dict_without_a_gather(job):
    full = job["full"]
    assert "lm_head.weight" in full and "model.embed_tokens.weight" in full  # tied: both
    want = [(name, t.dtype, tuple(t.shape)) for name, t in full.items()]
    assert job["specs"] == want
    assert job["gathered_for_specs"] == 0


def test_one_engine_and_two_at_once_receive_exactly_the_full_weights(job):
    same(job["one"], job["full"])
    assert len(job["two"]) == 2
    for got in job["two"]:
        same(got, job["full"])
    count = len(job["full"])
    for sync in job["syncs"]:  # each tensor gathered once per sync, however many read it
        assert sync == {**sync, "gathered": count, "finished": True}


def test_rank_0_holds_a_window_and_a_tensor_of_gathered_weights_not_the_model(job):
    sizes = [t.numel() * t.element_size() for t in job["full"].values()]
    model, largest = sum(sizes), max(sizes)
    bound = BUCKET + largest
    one, two = job["syncs"][0]["peak"], job["syncs"][1]["peak"]
    assert 0 < one <= largest  # one reader takes each tensor as it is gathered
    assert 0 < two <= bound
    assert bound * 8 < model, (bound, model)  # far below: the bound means something
    print(f"model {model} B, largest {largest} B, peak one {one} B, two {two} B")


def test_a_receiver_failing_midway_leaves_no_rank_waiting_and_the_next_sync_works(job):
    assert "the worker failed" in job["failed"]
    assert job["mixed_retired"] == [False, True]  # the pool retired the failed replica
    same(job["mixed"], job["full"])  # and the other one got everything
    same(job["after"], job["full"])
    assert job["rank1"]["syncs"] == len(job["syncs"]) == 5  # rank 1 finished every pass


def test_a_reader_that_never_reads_is_released_and_the_pass_finishes():
    model = torch.nn.Linear(4, 3)  # unsharded: gathering is a copy, no collective
    source = GatheredWeights(model, window_bytes=16)
    first, second = source.split(2)
    assert torch.equal(first["weight"], model.weight)
    assert source.held_bytes == 48  # kept for the second reader
    second.close()  # e.g. its engine failed before it read
    assert source.held_bytes == 0 and not source.finished
    first.close()
    assert source.finished and source.gathered == 2
    with pytest.raises(RuntimeError, match="closed reader"):
        first["bias"]


def test_a_reader_a_window_ahead_waits_for_the_slower_one():
    import threading

    model = torch.nn.Sequential(*(torch.nn.Linear(4, 4, bias=False) for _ in range(6)))
    source = GatheredWeights(model, window_bytes=64)  # one 64-byte weight at a time
    fast, slow = source.split(2)
    names = list(source)
    assert torch.equal(slow[names[0]], model.state_dict()[names[0]])  # slow has begun
    taken: list[str] = []
    ahead = threading.Thread(target=lambda: taken.extend(n for n in names if fast[n] is not None))
    ahead.start()
    ahead.join(timeout=0.5)
    assert ahead.is_alive() and taken == names[:2]  # waits for slow to take the second
    for name in names[1:]:
        assert torch.equal(slow[name], model.state_dict()[name])
        assert source.held_bytes <= 2 * 64
    ahead.join(timeout=5)
    assert taken == names and source.peak_bytes <= 2 * 64
    fast.close()
    slow.close()
    assert source.finished


def test_a_reader_that_has_not_begun_holds_no_one_up():
    """A reader yet to begin (its send waits for a thread, or it reads on the event
    loop after the others) could never free a reader that waits for it: none does."""
    model = torch.nn.Sequential(*(torch.nn.Linear(4, 4, bias=False) for _ in range(6)))
    source = GatheredWeights(model, window_bytes=64)
    fast, late = source.split(2)
    names = list(source)
    assert [n for n in names if fast[n] is not None] == names  # no wait, no deadlock
    assert all(torch.equal(late[n], model.state_dict()[n]) for n in names)
    fast.close()
    late.close()
    assert source.finished


def test_train_models_stream_through_the_learner_group_and_no_pass_is_left_open(tmp_path):
    """``TrainModels.weights()`` on a real two-rank group: rank 1 makes each pass's
    gathers, a pass no engine read is finished by the next order and by ``close``."""
    out = tmp_path / "out.pt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    done = subprocess.run(
        [sys.executable, str(TESTS / "streamed_driver.py"), str(out)], env=env, timeout=120
    )
    assert done.returncode == 0
    got = torch.load(out, weights_only=False)
    assert got["kind"] == "GatheredWeights"
    same(got["one"], got["full"])
    for each in got["two"]:
        same(each, got["full"])
    assert got["ranks"] == [0]  # rank 1 left its last pass and exited by itself


class Unreachable(ScriptedEngine):
    """A replica whose update fails before it reads a tensor (a server that went away)."""

    async def update_weights(self, weights: Any, version: int | None = None) -> float:
        raise ConnectionError("the server went away")


@pytest.mark.timeout(60)  # a view left unreleased would hold the other reader forever
async def test_a_replica_failing_before_it_reads_holds_up_no_other():
    model = torch.nn.Sequential(*(torch.nn.Linear(32, 32) for _ in range(8)))  # 8 x 4 KiB
    source = GatheredWeights(model, window_bytes=4096)  # the other waits a window ahead
    healthy, gone = LinkEngine(4096), Unreachable()
    engines = EnginePool([healthy, gone])
    try:
        await asyncio.wait_for(engines.update_weights(source, version=1), 30)
    finally:
        healthy.link.close()
        await engines.close()
    got = received(healthy)
    assert list(got) == list(model.state_dict())
    assert all(torch.equal(got[n], t) for n, t in model.state_dict().items())
    assert [r.retired is not None for r in engines.replicas] == [False, True]
    assert source.finished and source.held_bytes == 0 and source.peak_bytes <= 2 * 4096


@pytest.fixture
def one_rank(tmp_path):
    """A process group of this process alone: FSDP shards (whole ones) and real gathers."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def sharded_tiny() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from loomrl.train.sharding import shard

    config = LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float()
    shard(model)
    return model


class Moves:
    """Every ``Tensor.to`` (the dtype it was called on, where it went) and every gather
    (the dtype gathered)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from torch.distributed.tensor import DTensor

        self.to: list[tuple[torch.dtype, str | None]] = []
        self.gathers: list[torch.dtype] = []
        to, full = torch.Tensor.to, DTensor.full_tensor

        def spy_to(tensor, *args, **kwargs):
            target = kwargs.get("device", next((a for a in args if isinstance(a, str)), None))
            self.to.append((tensor.dtype, None if target is None else str(target)))
            return to(tensor, *args, **kwargs)

        def spy_full(tensor, *args, **kwargs):
            self.gathers.append(tensor.dtype)
            return full(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", spy_to)
        monkeypatch.setattr(DTensor, "full_tensor", spy_full)


def test_a_sharded_sync_casts_to_the_engines_dtype_before_the_gather_and_the_host(
    one_rank, monkeypatch
):
    from loomrl.train.sharding import full_weights
    from loomrl.train.streaming import gather_pass

    model = sharded_tiny()
    whole = full_weights(model)  # float32, as a checkpoint takes it
    moves = Moves(monkeypatch)
    weights = full_weights(model, torch.bfloat16)
    assert list(weights) == list(whole)
    for name, tensor in whole.items():
        assert weights[name].dtype == torch.bfloat16
        assert torch.equal(weights[name], tensor.to(torch.bfloat16)), name
    assert moves.gathers and set(moves.gathers) == {torch.bfloat16}  # half the bytes gathered
    to_host = [dtype for dtype, where in moves.to if where == "cpu"]
    assert to_host and set(to_host) == {torch.bfloat16}  # no float32 tensor reached the host
    moves.gathers.clear()
    gather_pass(model, torch.bfloat16)  # the other ranks' part: the same gathers
    assert set(moves.gathers) == {torch.bfloat16}


def test_an_nccl_sync_keeps_the_gathered_tensors_on_the_learners_device(one_rank, monkeypatch):
    model = sharded_tiny()
    moves = Moves(monkeypatch)
    source = GatheredWeights(model, dtype=torch.bfloat16, on_host=False)
    assert {dtype for _, dtype, _ in source.specs()} == {torch.bfloat16}
    got = {name: source[name] for name in source}
    source.close()
    assert source.finished and {t.dtype for t in got.values()} == {torch.bfloat16}
    assert [where for _, where in moves.to if where is not None] == []  # never moved


def test_the_sync_dtype_is_the_engines_where_the_config_fixes_it():
    from loomrl.run.train_models import _sync_dtype
    from loomrl.train.config import TrainConfig
    from loomrl.train.placement import Placement

    base = {"model": "tiny-random", "env": "arith"}
    gpu = Placement(torch.device("cuda", 0), torch.float32, "bfloat16")
    cpu = Placement(torch.device("cpu"), torch.float32, "bfloat16")
    mixed = TrainConfig(**base, autocast="bfloat16")
    assert _sync_dtype(mixed, gpu) == torch.bfloat16  # the model's config.json: bfloat16
    assert _sync_dtype(mixed, cpu) is None  # vLLM on a CPU picks by the CPU's bf16 support
    fp32 = TrainConfig(**base, autocast="none")
    assert _sync_dtype(fp32, gpu) == torch.float32  # the sampler computes as the learner
    chosen = TrainConfig(**base, autocast="bfloat16", engine_args={"dtype": "float16"})
    assert _sync_dtype(chosen, cpu) == torch.float16
    served = TrainConfig(**base, autocast="bfloat16", engines=["http://127.0.0.1:9"])
    assert _sync_dtype(served, gpu) is None  # a server's dtype is its own
