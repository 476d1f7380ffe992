"""Forks: an environment that rewrites the conversation (``EnvStep.fork``) closes the
trajectory's segment and continues in a new one rendered afresh; each segment keeps the
token contract, and segments survive the replay-buffer log, Parquet and experience."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import loomrl
from loomrl.envs.base import Environment, EnvState, EnvStep
from loomrl.experience import make_experience
from loomrl.experience.maker import episode_value
from loomrl.integrations.trl import to_trl
from loomrl.producer.records import traj_from_row, traj_to_row
from loomrl.runs import load_trajectories, write_trajectories
from loomrl.types import Status

SUMMARY = [
    {"role": "system", "content": "Earlier turns were summarised."},
    {"role": "user", "content": "Q1 again, briefly."},
]


class Rewriter(Environment):
    """Turn 1 is answered with a rewritten history (a fork), turn 2 with more input,
    turn 3 ends the episode."""

    name = "rewriter"
    max_turns = 5

    def step(self, state: EnvState, message: dict) -> EnvStep:
        if state.turn == 1:
            return EnvStep(messages=[dict(m) for m in SUMMARY], done=False, fork=True)
        if state.turn == 2:
            return EnvStep(messages=[{"role": "user", "content": "And then?"}], done=False)
        return EnvStep(messages=[], done=True)

    def __init__(self) -> None:
        self.scored = itertools.count()

    def score(self, state: EnvState) -> float:
        return float(next(self.scored))  # differs within a group: advantages are not 0


async def forked(make_engine, n: int = 2, **kwargs):
    engine = make_engine(lambda prompt, params: "Thinking it over.")
    examples = [{"id": i, "question": f"Q{i}"} for i in range(2)]
    return await loomrl.rollout(engine, Rewriter(), examples, n=n, **kwargs)


async def test_a_fork_closes_the_segment_and_renders_the_new_history(
    make_engine, chat, check_contract
):
    results = await forked(make_engine)
    for traj in results:
        assert traj.status == Status.TERMINATED and traj.turns == 3
        (first,) = traj.segments
        assert first.turns == 1 and first.messages[-1]["role"] == "assistant"
        assert first.messages[0]["content"] == f"Q{traj.example_id}"
        assert traj.prompt_ids == chat.prompt_ids(SUMMARY, None)  # rendered afresh
        assert traj.messages[:2] == SUMMARY and len(traj.messages) == 5
        assert traj.env_metrics["forks"] == 1
        assert sum(traj.loss_mask) + sum(first.loss_mask) == sum(
            e - s for seg in traj.all_segments() for s, e in seg.spans
        )
        check_contract(traj)  # every segment on its own


async def test_a_fork_that_cannot_fit_ends_truncated_without_a_segment(make_engine):
    engine = make_engine(lambda prompt, params: "x")
    long = [{"role": "user", "content": "word " * 400}]

    class Huge(Rewriter):
        def step(self, state, message):
            return EnvStep(messages=long, done=False, fork=True)

    [traj] = await loomrl.rollout(engine, Huge(), [{"id": 0, "question": "Q0"}], max_len=200)
    assert traj.status == Status.TRUNCATED and not traj.segments
    assert traj.messages[-1]["role"] == "assistant" and traj.turns == 1


async def test_segments_round_trip_through_the_log_and_parquet(make_engine, tmp_path):
    results = await forked(make_engine)
    for traj in results:
        again = traj_from_row(*traj_to_row(traj))
        assert again == traj  # exact: token lists, logprob bits, messages, spans
    write_trajectories(tmp_path / "t.parquet", results)
    loaded = load_trajectories(tmp_path / "t.parquet")
    for traj, back in zip(results, loaded, strict=True):
        assert len(back.segments) == 1 and back.policy_version == traj.policy_version
        for a, b in zip(traj.all_segments(), back.all_segments(), strict=True):
            assert (a.prompt_ids, a.completion_ids, a.loss_mask) == (
                b.prompt_ids, b.completion_ids, b.loss_mask,
            )  # fmt: skip
            assert a.spans == b.spans and a.messages == b.messages and a.turns == b.turns
            assert all(
                math.isclose(x, y, rel_tol=1e-6)
                for x, y in zip(a.logprobs, b.logprobs, strict=True)
            )


def test_a_row_without_a_segments_column_reads_back_unforked(tmp_path):
    import pyarrow.parquet as pq

    from loomrl.runs import trajectory_table
    from loomrl.types import Trajectory

    traj = Trajectory(0, 0, 0, "e", prompt_ids=[1], completion_ids=[2], logprobs=[-0.5],
                      loss_mask=[1], spans=[(0, 1)], span_versions=[0], finish_reasons=["stop"],
                      turns=1)  # fmt: skip
    table = trajectory_table([traj]).drop_columns(["segments"])
    pq.write_table(table, tmp_path / "old.parquet")
    [back] = load_trajectories(tmp_path / "old.parquet")
    assert back.segments == []


async def test_experience_trains_every_segment_with_the_episodes_advantage(make_engine):
    results = await forked(make_engine)
    exp = make_experience(results, "grpo")
    assert len(exp.trajectories) == 8 and exp.stats["segments"] == 4
    assert exp.stats["trajectories_used"] == 4
    for traj, adv in zip(exp.trajectories[:4], exp.advantages[:4], strict=True):
        value = next(a for a, bit in zip(adv, traj.loss_mask, strict=True) if bit)
        seg_row = exp.trajectories[4:][exp.trajectories[:4].index(traj)]
        seg_adv = exp.advantages[4:][exp.trajectories[:4].index(traj)]
        assert seg_row.prompt_ids == traj.segments[0].prompt_ids and not seg_row.segments
        assert seg_row.reward == traj.reward
        assert seg_adv == [value if bit else 0.0 for bit in seg_row.loss_mask]
    assert {round(v, 6) for adv in exp.advantages for v in adv} - {0.0}  # not all zero
    batch = exp.packed()
    assert batch.num_samples == 8


async def test_token_level_advantages_on_a_forked_episode_are_refused(make_engine):
    results = await forked(make_engine, n=1)
    traj = results[0]
    ramp = torch.tensor([float(i) * bit for i, bit in enumerate(traj.loss_mask)])
    mask = torch.tensor(traj.loss_mask, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"token-level advantages.*outcome estimator"):
        episode_value(traj, ramp, ramp, mask, "gae")


async def test_trl_refuses_forked_episodes(make_engine):
    results = await forked(make_engine, n=1)
    with pytest.raises(ValueError, match="forked episode of 2 segments"):
        to_trl(results, filler_id=0)


def test_policy_version_is_the_oldest_over_segments():
    from loomrl.types import Trajectory

    traj = Trajectory(0, 0, 0, "e", spans=[(0, 1)], span_versions=[5], finish_reasons=["stop"])
    traj.fork([1, 2], [])
    traj.spans, traj.span_versions, traj.finish_reasons = [(0, 1)], [7], ["stop"]
    assert traj.policy_version == 5 and traj.segments[0].turns == 1
    assert torch.tensor([traj.policy_version]).item() == 5


async def test_a_critic_estimator_is_refused_for_forked_episodes_whatever_its_values(make_engine):
    results = await forked(make_engine, n=1)
    width = max(len(t.completion_ids) for t in results)
    zeros = torch.zeros((len(results), width))  # values that would give constant advantages
    with pytest.raises(ValueError, match=r"'gae' with \['values'\] gives token-level"):
        make_experience(results, "gae", inputs={"values": zeros})
