"""What environments count (``EnvStep.info["metrics"]``) is summed per episode into
``env_metrics`` and summarised per call: per-episode means and per-call tool error rates."""

from __future__ import annotations

import pytest

from loomrl import Environment, EnvStep, Status, rollout
from loomrl.episode.metrics import compute_metrics, env_summary
from loomrl.types import Trajectory


class Counting(Environment):
    """Reports two tool calls per turn, one failing on odd turns; ends after 3 turns."""

    name = "counting"
    max_turns = 3

    def __init__(self, bad: object = None) -> None:
        self.bad = bad

    def step(self, state, message):
        metrics = {"tool_calls": 2, "tool_errors": state.turn % 2, "sandbox_s": 0.5}
        if state.turn % 2:
            metrics["tool_errors/timeout"] = 1
        if self.bad is not None:
            metrics["weird"] = self.bad
        return EnvStep(
            [{"role": "user", "content": "again"}], done=state.turn == 3, info={"metrics": metrics}
        )

    def score(self, state):
        return 1.0


async def test_step_counts_are_summed_per_episode_and_summarised(make_engine):
    trajs = await rollout(make_engine(lambda ids, p: "go"), Counting(), [{"question": "Q0"}], n=2)
    for traj in trajs:
        assert traj.env_metrics == {
            "tool_calls": 6.0, "tool_errors": 2.0, "sandbox_s": 1.5, "tool_errors/timeout": 2.0
        }  # fmt: skip
    metrics = trajs.metrics.as_dict()
    assert metrics["tool_calls_per_episode"] == 6.0
    assert metrics["tool_error_rate"] == pytest.approx(2 / 6)
    assert metrics["tool_error_rate/timeout"] == pytest.approx(2 / 6)
    assert metrics["sandbox_s"] == 3.0 and metrics["sandbox_s_per_episode"] == 1.5


@pytest.mark.parametrize("bad", ["3", float("nan"), [1]])
async def test_env_metrics_must_be_numbers(make_engine, bad):
    (traj,) = await rollout(
        make_engine(lambda ids, p: "go"), Counting(bad), [{"question": "Q0"}], on_error="isolate"
    )
    assert traj.status == Status.ERROR
    assert "info['metrics']['weird'] must be a finite number" in traj.error


def test_no_counts_means_no_entries_and_failed_episodes_count_in_the_means():
    empty = Trajectory(example_id=0, group_id=0, sample_index=0, env="e")
    assert env_summary([empty]) == {}
    assert compute_metrics([empty], 1, 1.0).as_dict().keys().isdisjoint({"tool_error_rate"})
    counted = Trajectory(example_id=1, group_id=1, sample_index=0, env="e")
    counted.env_metrics = {"tool_calls": 4.0}
    summary = env_summary([empty, counted])
    assert summary == {"tool_calls_per_episode": 2.0, "tool_error_rate": 0.0}
