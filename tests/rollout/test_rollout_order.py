"""rollout: input order, groups and ids, the token contract on every trajectory, argument
checks and the sync entry point — with latencies that make completion order differ."""

from __future__ import annotations

import asyncio
import random

import pytest

from loomrl import Environment, EnvStep, SamplingParams, Status, rollout, rollout_sync
from loomrl.rollout import Rollouts

N, GROUP = 12, 3


class Staggered(Environment):
    """Up to three turns; example k ends after ``1 + k % 3`` turns. Later examples reset
    faster and steps take random time, so trajectories finish out of input order."""

    name = "staggered"
    max_turns = 3

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    async def reset(self, example):
        await asyncio.sleep(0.002 * (N - example["k"]))
        return super().reset(example)

    async def step(self, state, message):
        await asyncio.sleep(self.rng.random() * 0.004)
        done = state.turn >= 1 + state.example["k"] % 3
        return EnvStep([{"role": "user", "content": f"turn {state.turn} noted"}], done=done)

    def score(self, state):
        return float(state.example["k"]) + 0.5 * len(state.assistant_messages())


def examples() -> list[dict]:
    """Every kind of ``id``: int (used), str / bool / missing (position used instead)."""
    out = []
    for k in range(N):
        example = {"k": k, "question": f"Q{k}: what is {k} + {k}?"}
        if k % 4 == 0:
            example["id"] = 100 + k
        elif k % 4 == 1:
            example["id"] = f"name-{k}"
        elif k % 4 == 2:
            example["id"] = True
        out.append(example)
    return out


def expected_example_id(k: int) -> int:
    return 100 + k if k % 4 == 0 else k


@pytest.fixture
def engine(make_engine, read_prompt):
    """Decode cost makes low questions (long replies) slow and high ones fast."""

    def reply(prompt_ids, params):
        k, turn = read_prompt(prompt_ids)
        return f"For Q{k} turn {turn}: " + "so " * (3 * (N - k))

    return make_engine(reply, step_base_s=0.0005)


@pytest.mark.parametrize("mode", ["continuous", "turn_sync"])
async def test_trajectories_come_back_in_input_order_with_groups(engine, check_contract, mode):
    finished = []
    result = await rollout(
        engine,
        Staggered(),
        examples(),
        n=GROUP,
        first_group_id=40,
        mode=mode,
        sampling=SamplingParams(max_tokens=512),
        on_trajectory=finished.append,
    )
    assert isinstance(result, Rollouts)
    assert len(result) == N * GROUP
    for position, traj in enumerate(result):
        k, s = divmod(position, GROUP)
        assert traj.group_id == 40 + k
        assert traj.sample_index == s
        assert traj.example_id == expected_example_id(k)
        assert traj.env == "staggered"
        assert traj.messages[0]["content"].startswith(f"Q{k}:")
        assert traj.status == Status.TERMINATED
        assert traj.turns == 1 + k % 3
        assert traj.reward == k + 0.5 * traj.turns
        check_contract(traj)
    # Each trajectory is reported once, as it finishes: not in input order here.
    assert sorted(map(id, finished)) == sorted(map(id, result))
    assert [id(t) for t in finished] != [id(t) for t in result]
    assert engine.in_flight == 0


async def test_groups_share_nothing_but_the_example(engine):
    result = await rollout(engine, Staggered(), examples()[:2], n=4)
    groups = [result[i : i + 4] for i in range(0, len(result), 4)]
    assert [[t.group_id for t in g] for g in groups] == [[0] * 4, [1] * 4]
    assert [[t.sample_index for t in g] for g in groups] == [[0, 1, 2, 3]] * 2
    # Distinct records, each with its own token lists.
    assert len({id(t.completion_ids) for t in result}) == len(result)


async def test_first_group_id_defaults_to_zero_and_offsets_groups(engine):
    plain = await rollout(engine, Staggered(), examples()[:3], n=2)
    offset = await rollout(engine, Staggered(), examples()[:3], n=2, first_group_id=7)
    assert [t.group_id for t in plain] == [0, 0, 1, 1, 2, 2]
    assert [t.group_id for t in offset] == [7, 7, 8, 8, 9, 9]
    assert [t.example_id for t in offset] == [100, 100, 1, 1, 2, 2]


async def test_empty_input_gives_empty_result(engine):
    result = await rollout(engine, Staggered(), [], n=3)
    assert list(result) == []
    assert result.metrics.trajectories == 0


async def test_env_may_be_given_by_registered_name(make_engine, check_contract):
    engine = make_engine(lambda ids, p: "Answer: 4")
    result = await rollout(engine, "arith", [{"id": 5, "question": "What is 2 + 2?", "answer": 4}])
    (traj,) = result
    assert traj.env == "arith"
    assert traj.example_id == 5
    assert traj.status == Status.TERMINATED
    assert traj.reward_components["correct"] == 1.0
    assert traj.reward == pytest.approx(1.1)
    check_contract(traj)


def test_rollout_sync_runs_from_plain_sync_code(tokenizer, check_contract):
    from loomrl.engines import ScriptedEngine

    engine = ScriptedEngine(lambda ids, p: "I think so", tokenizer=tokenizer)
    result = rollout_sync(engine, Staggered(), examples()[:4], n=2)
    assert isinstance(result, Rollouts)
    assert [t.group_id for t in result] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(t.status == Status.TERMINATED for t in result)
    for traj in result:
        check_contract(traj)
    assert result.metrics.trajectories == 8


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 0}, "n, concurrency and env_workers must be >= 1"),
        ({"n": -2}, "n, concurrency and env_workers must be >= 1"),
        ({"concurrency": 0}, "n, concurrency and env_workers must be >= 1"),
        ({"env_workers": 0}, "n, concurrency and env_workers must be >= 1"),
        ({"on_error": "x"}, "on_error must be 'raise' or 'isolate', got 'x'"),
        ({"mode": "x"}, "mode must be 'continuous' or 'turn_sync', got 'x'"),
        ({"max_turns": 0}, "max_turns must be >= 1, got 0"),
        ({"max_turns": -1}, "max_turns must be >= 1, got -1"),
    ],
)
async def test_bad_arguments_raise_value_error_before_any_work(make_engine, kwargs, match):
    engine = make_engine()
    resets = []

    class Counting(Staggered):
        async def reset(self, example):
            resets.append(example)
            return await super().reset(example)

    with pytest.raises(ValueError, match=match):
        await rollout(engine, Counting(), examples()[:2], **kwargs)
    assert resets == []
    assert engine.requests_served == 0


def test_bad_arguments_raise_value_error_in_rollout_sync_too(make_engine):
    with pytest.raises(ValueError, match="on_error must be"):
        rollout_sync(make_engine(), Staggered(), examples()[:1], on_error="ignore")


async def test_engine_without_tokenizer_needs_a_chat(make_engine):
    bare = make_engine(tokenizer=None)
    with pytest.raises(ValueError, match="no tokenizer"):
        await rollout(bare, Staggered(), examples()[:1])


async def test_explicit_chat_is_used_when_given(make_engine, chat, tokenizer, check_contract):
    # A reply given as ids (EOS included) needs no engine tokenizer at all.
    ids = [*tokenizer.encode("Sure thing", add_special_tokens=False), tokenizer.eos_token_id]
    bare = make_engine(lambda p, s: ids, tokenizer=None, vocab_size=len(tokenizer))
    (traj,) = await rollout(bare, Staggered(), examples()[:1], chat=chat)
    assert traj.status == Status.TERMINATED
    assert traj.completion_ids == ids
    check_contract(traj)
