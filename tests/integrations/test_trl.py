"""``loomrl.integrations.trl``: TRL's ``rollout_func`` contract on a scripted engine (the
real engine and real ``GRPOTrainer`` steps: tests/e2e/test_trl_real.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
from trl_fakes import QuestionEnv, fake_trainer

from loomrl.engines import ScriptedEngine
from loomrl.envs.base import EnvState
from loomrl.integrations.trl import (
    component_reward,
    passthrough_reward,
    prompt_example,
    rollout_func,
)

GUESSES = ["10", "30", "25"]  # the n-th assistant turn guesses GUESSES[min(n, 2)]


def secret_example(prompt: str) -> dict:
    return {"question": prompt, "answer": int(prompt.split()[-1])}


@pytest.fixture
def guesser(tokenizer):
    """A reply function that plays GUESSES, reading the turn number off the prompt."""

    def reply(ids, params):
        turn = tokenizer.decode(ids).count("<|im_start|>assistant") - 1
        return GUESSES[min(turn, 2)]

    return reply


@pytest.fixture
def guess_rollout(tokenizer, guesser):
    with rollout_func(
        "guess_number",
        lambda: ScriptedEngine(guesser, tokenizer=tokenizer),
        to_example=secret_example,
        max_turns=4,
    ) as rf:
        yield rf


def test_contract_one_trajectory_per_prompt_in_order(guess_rollout):
    # TRL repeats each prompt num_generations times in a row; each is one trajectory.
    prompts = ["secret 25", "secret 25", "secret 10", "secret 10", "secret 40", "secret 40"]
    out = guess_rollout(prompts)
    assert set(out) == {
        "prompt_ids", "completion_ids", "logprobs", "env_mask",
        "reward", "reward_components", "status",
    }  # fmt: skip
    assert all(len(v) == len(prompts) for v in out.values())
    trajs = guess_rollout.last
    assert [t.group_id for t in trajs] == list(range(6))  # n=1: one group per prompt
    assert out["reward"] == pytest.approx([0.8, 0.8, 1.0, 1.0, 0.0, 0.0])
    assert out["status"] == ["terminated"] * 4 + ["max_turns"] * 2
    assert out["reward_components"][0] == pytest.approx({"solved": 1.0, "turn_penalty": -0.2})
    for i, traj in enumerate(trajs):
        ids, lps, mask = out["completion_ids"][i], out["logprobs"][i], out["env_mask"][i]
        assert len(ids) == len(lps) == len(mask) > 0
        assert out["prompt_ids"][i] == traj.prompt_ids
        assert ids == traj.completion_ids and mask == traj.loss_mask
        assert all(lp == 0.0 for lp, m in zip(lps, mask, strict=True) if m == 0)
        assert all(lp < 0.0 for lp, m in zip(lps, mask, strict=True) if m == 1)
    # Multi-turn: env replies are mask-0 spans between model spans.
    assert trajs[0].turns == 3 and trajs[2].turns == 1
    mask = out["env_mask"][0]
    assert mask[0] == 1 and mask[-1] == 1 and 0 in mask
    starts = [i for i in range(1, len(mask)) if mask[i] == 1 and mask[i - 1] == 0]
    assert len(starts) == 2  # three model turns, two env gaps


def test_group_ids_continue_across_calls(guess_rollout):
    # Distinct group ids give distinct sampling seeds at every training step.
    guess_rollout(["secret 25", "secret 25"])
    guess_rollout(["secret 25", "secret 25"])
    assert [t.group_id for t in guess_rollout.last] == [2, 3]


def test_passthrough_reward_returns_the_env_rewards_in_order(guess_rollout):
    prompts = ["secret 40", "secret 10", "secret 25"]
    out = guess_rollout(prompts)
    completions = ["..."] * 3
    rewards = passthrough_reward(prompts, completions, **out)
    assert rewards == pytest.approx([0.0, 1.0, 0.8])
    assert rewards == [t.reward for t in guess_rollout.last]
    solved, penalty = component_reward("solved"), component_reward("turn_penalty")
    assert solved.__name__ == "solved"  # TRL logs rewards/<__name__>
    assert solved(prompts, completions, **out) == [0.0, 1.0, 1.0]
    assert penalty(prompts, completions, **out) == pytest.approx([0.0, 0.0, -0.2])
    with pytest.raises(ValueError, match="2 rewards for 3 completions"):
        passthrough_reward(prompts, completions, reward=[1.0, 2.0])


def test_string_and_conversational_prompts(tokenizer):
    conversational = [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "abc"}],
        [{"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "image"}]}],
    ]
    assert prompt_example("hello") == {"question": "hello"}
    assert prompt_example(conversational[0]) == {"question": "abc", "prompt": conversational[0]}
    assert prompt_example(conversational[1])["question"] == "ab"
    with pytest.raises(ValueError, match="no user message"):
        prompt_example([{"role": "system", "content": "x"}])
    engine = ScriptedEngine(["ok"] * 4, tokenizer=tokenizer)
    with rollout_func(QuestionEnv(), engine, sync_weights=False) as rf:
        assert rf(["hello"])["reward"] == [5.0]
        out = rf(conversational)
        assert out["reward"] == [3.0, 2.0]
        assert rf.last[0].messages[-2] == {"role": "user", "content": "abc"}
    asyncio.run(engine.close())


class BrokenEnv(QuestionEnv):
    name = "broken"

    def reset(self, example: dict) -> EnvState:
        if example["question"] == "bad":
            raise RuntimeError("cannot reset")
        return super().reset(example)


def test_unscored_trajectory_gets_no_reward_and_a_masked_filler_token(tokenizer):
    engine = ScriptedEngine(["ok"] * 2, tokenizer=tokenizer)
    with rollout_func(BrokenEnv(), engine, on_error="isolate", sync_weights=False) as rf:
        out = rf(["good", "bad"])
    asyncio.run(engine.close())
    assert out["status"] == ["terminated", "error"]
    assert out["reward"] == [4.0, None]  # TRL: all rewards None -> NaN, advantage 0
    eos = tokenizer.eos_token_id
    assert out["prompt_ids"][1] == [eos] and out["completion_ids"][1] == [eos]
    assert out["env_mask"][1] == [0] and out["logprobs"][1] == [0.0]
    assert passthrough_reward(["good", "bad"], ["", ""], **out) == [4.0, None]


def test_errors_raise_by_default(tokenizer):
    with (
        rollout_func(
            BrokenEnv(), lambda: ScriptedEngine(tokenizer=tokenizer), sync_weights=False
        ) as rf,
        pytest.raises(RuntimeError, match="cannot reset"),
    ):
        rf(["good", "bad"])


def test_weights_sync_when_the_trainer_step_moves(tokenizer):
    with rollout_func(QuestionEnv(), lambda: ScriptedEngine(tokenizer=tokenizer)) as rf:
        rf(["q"], fake_trainer(0))
        assert rf.engine.weight_updates == []  # fresh engine = initial weights
        rf(["q"], fake_trainer(1))
        rf(["q"], fake_trainer(1))  # same step (e.g. gradient accumulation): no sync
        assert rf.engine.weight_updates == [2]  # Linear: weight and bias
        assert rf.engine.policy_version == 1
        rf(["q"], SimpleNamespace(temperature=1.0))  # old-TRL style args: ignored
        assert rf.engine.weight_updates == [2]
        with pytest.warns(UserWarning, match=r"GRPOConfig.temperature=0.7"):
            rf(["q"], fake_trainer(1, temperature=0.7))


def test_sync_needs_an_engine_that_takes_weights():
    class NoWeights:  # e.g. a remote server behind an API
        async def close(self) -> None:
            pass

    with pytest.raises(TypeError, match="sync_weights=False"):
        rollout_func(QuestionEnv(), NoWeights)


def test_engine_lives_on_one_owned_loop(tokenizer):
    loops, threads = set(), set()

    def reply(ids, params):
        loops.add(id(asyncio.get_running_loop()))
        threads.add(threading.current_thread().name)
        return "ok"

    built = []

    def factory():
        built.append(threading.current_thread().name)
        return ScriptedEngine(reply, tokenizer=tokenizer)

    rf = rollout_func(QuestionEnv(), factory, sync_weights=False)
    rf(["a", "b"])
    rf(["c"])
    rf.close()
    rf.close()  # idempotent
    assert len(loops) == 1 and threads == {"loomrl-trl-loop"} and built == ["loomrl-trl-loop"]
    assert rf.engine._closed  # built here, so closed here
    with pytest.raises(RuntimeError, match="closed"):
        rf(["d"])


def test_import_does_not_import_trl():
    code = "import sys, loomrl.integrations.trl; assert 'trl' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
