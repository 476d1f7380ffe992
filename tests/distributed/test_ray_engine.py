"""RayEngine: a ScriptedEngine in a Ray actor behaves as the same engine in process
(tokens, logprobs, abort, cancellation), and a pool's weight update reaches every actor
through one copy in the object store."""

from __future__ import annotations

import asyncio

import pytest
import ray
from PIL import Image
from ray_parts import LONG_TOKENS, Scripted

from loomrl.distributed.engine_actor import RayEngine, start_engine_actors
from loomrl.engines.pool import EnginePool
from loomrl.types import SamplingParams

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(120)]

# Byte-level engines (no tokenizer to load in the actor) for abort, cancel and weights.
BYTES = Scripted(step_base_s=0.02, tokenizer=False)  # a long request takes 5 s
LONG = SamplingParams(max_tokens=LONG_TOKENS + 50)


@pytest.fixture(scope="module")
async def engines(ray_cluster):
    started = await start_engine_actors(BYTES, 2, num_cpus=0.5)
    yield started
    for engine in started:
        await engine.close()


def actor_engine(engine: RayEngine, read):
    """``read(the ScriptedEngine inside the actor)``, run in the actor."""
    return ray.get(engine.actor.__ray_call__.remote(lambda actor: read(actor._engine)), timeout=30)


async def until(condition, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


async def test_generate_matches_the_same_engine_in_process(ray_cluster, tokenizer):
    factory = Scripted()  # loads the default model's tokenizer, in the actor and here
    (remote,) = await start_engine_actors(factory, 1, num_cpus=0.5, tokenizer=tokenizer)
    local = factory()
    cases = [
        ([1, 2, 3], SamplingParams(max_tokens=16), "a:0"),
        (list(range(100, 140)), SamplingParams(max_tokens=2), "b:0"),  # cut: length
        ([7] * 9, SamplingParams(max_tokens=16, stop=["ss"]), "c:0"),  # stop string
    ]
    outs = []
    try:
        assert (remote.vocab_size, remote.max_model_len) == (local.vocab_size, local.max_model_len)
        for prompt, params, rid in cases:
            outs.append(await remote.generate(prompt, params, rid))
            assert outs[-1] == await local.generate(prompt, params, rid)
        assert remote.in_flight == 0
    finally:
        await remote.close()
        await local.close()
    assert [o.finish_reason for o in outs] == ["stop", "length", "stop"]
    assert outs[2].stop_reason == "ss" and len(outs[0].logprobs) == len(outs[0].token_ids) > 1
    assert outs[0].token_ids[-1] == tokenizer.eos_token_id  # the tokenizer's ids, not bytes


async def test_images_reach_the_engine_in_the_actor(engines):
    engine = engines[0]
    shown = [Image.new("RGB", (8, 8), (255, 0, 0)), Image.new("RGB", (4, 6), (0, 9, 200))]
    out = await engine.generate([1, 2, 3], SamplingParams(max_tokens=4), "img:0", images=shown)
    text = await engine.generate([1, 2, 3], SamplingParams(max_tokens=4), "txt:0")
    assert out.token_ids == text.token_ids  # a scripted reply does not look at images
    seen = actor_engine(engine, lambda e: {k: v for k, v in e.images_seen.items()})
    assert list(seen) == ["img:0"]  # the text request was sent without images
    assert [(im.size, im.tobytes()) for im in seen["img:0"]] == [
        (im.size, im.tobytes()) for im in shown
    ]  # pickled through Ray: the same pixels, in order
    assert not engine.vision and engine.model_path is None  # a scripted engine's model


async def test_abort_ends_a_request_in_the_actor_with_the_tokens_so_far(engines):
    engine = engines[1]
    task = asyncio.create_task(engine.generate([5, 6, 7], LONG, "long:0"))
    aborted: list[str] = []

    async def abort_once_in_flight() -> None:  # until the actor has queued it
        while not aborted:
            aborted.extend(await engine.abort("long:0"))
            await asyncio.sleep(0.02)

    await asyncio.wait_for(abort_once_in_flight(), 10)
    out = await asyncio.wait_for(task, 10)
    assert aborted == ["long:0"]
    assert out.finish_reason == "abort" and out.request_id == "long:0"
    assert len(out.token_ids) < LONG.max_tokens
    assert actor_engine(engine, lambda e: e.in_flight) == 0
    assert await engine.abort("long:0") == []  # nothing left to abort


async def test_a_cancelled_generate_is_cancelled_in_the_actor(engines):
    engine = engines[1]
    task = asyncio.create_task(engine.generate([5, 6, 7], LONG, "gone:0"))
    await until(lambda: actor_engine(engine, lambda e: e.in_flight) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Left alone it would decode for seconds more: the actor dropped it instead.
    await until(lambda: actor_engine(engine, lambda e: e.in_flight) == 0, timeout=3.0)
    assert engine.in_flight == 0


async def test_pool_update_weights_reaches_every_actor_through_one_put(engines, monkeypatch):
    put = ray.put
    puts: list[object] = []

    def counting_put(value, *args, **kwargs):
        puts.append(value)
        return put(value, *args, **kwargs)

    monkeypatch.setattr(ray, "put", counting_put)
    pool = EnginePool(engines)
    start = pool.policy_version
    weights = {"layer.weight": [1.0, 2.0], "layer.bias": [0.5]}
    await pool.update_weights(weights, version=start + 1)
    assert len(puts) == 1  # one copy in the object store for both replicas
    assert [e.policy_version for e in engines] == [start + 1] * 2
    assert pool.policy_version == start + 1
    for engine in engines:
        updates, version = actor_engine(engine, lambda e: (e.weight_updates, e.policy_version))
        assert updates[-1] == 2 and version == start + 1  # the actor's engine loaded both
        out = await engine.generate([1, 2], SamplingParams(max_tokens=8))
        assert out.policy_version == start + 1

    await pool.update_weights({"layer.weight": [3.0]})  # a new state dict: put again
    assert len(puts) == 2 and puts[1] == {"layer.weight": [3.0]}
    assert [e.policy_version for e in engines] == [start + 2] * 2
    assert [actor_engine(e, lambda e: e.weight_updates[-1]) for e in engines] == [1, 1]
