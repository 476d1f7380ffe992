"""``loomrl.runs.load_trajectories``: a written run reads back as the same trajectories,
and each kind of malformed row is refused with its row index and the problem."""

from __future__ import annotations

import itertools
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loomrl.runs import TRAJECTORY_SCHEMA, load_trajectories, trajectory_table, write_run
from loomrl.types import Status, Trajectory


def mask_runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of every maximal run of 1s, by grouping equal neighbours."""
    runs, pos = [], 0
    for bit, group in itertools.groupby(mask):
        n = len(list(group))
        if bit == 1:
            runs.append((pos, pos + n))
        pos += n
    return runs


def make_traj(k: int, mask: list[int], status=Status.TERMINATED, reward=1.0, version=0):
    return Trajectory(
        example_id=10 + k, group_id=k // 2, sample_index=k % 2, env="hand",
        prompt_ids=[1, 2, 3 + k], completion_ids=[40 + j for j in range(len(mask))],
        logprobs=[-0.5 - j / 4 if b else 0.0 for j, b in enumerate(mask)], loss_mask=mask,
        messages=[{"role": "user", "content": f"q{k}"}], turns=len(mask_runs(mask)),
        span_versions=[version] * len(mask_runs(mask)), spans=mask_runs(mask),
        status=status, reward=reward, reward_components={"acc": 1.0, "len": -0.5}, error=None,
    )  # fmt: skip


TRAJS = [
    make_traj(0, [1, 1, 0, 0, 1], version=3),
    make_traj(1, [1, 0, 1, 0, 1, 1], reward=0.25),
    make_traj(2, [0, 0, 1, 1], status=Status.MAX_TURNS, reward=-2.0, version=1),
    make_traj(3, [1, 1, 1], status=Status.TRUNCATED, reward=0.0),
    make_traj(4, [], status=Status.ERROR, reward=float("nan")),
    make_traj(5, [1, 1], status=Status.ABORTED, reward=0.5, version=7),
]


def test_write_run_then_load_gives_the_same_trajectories(tmp_path):
    write_run(tmp_path, TRAJS, {}, {})
    loaded = load_trajectories(tmp_path / "trajectories.parquet")
    assert len(loaded) == len(TRAJS)
    for got, want in zip(loaded, TRAJS, strict=True):
        assert isinstance(got, Trajectory) and isinstance(got.status, Status)
        for name in ("example_id", "group_id", "sample_index", "env", "prompt_ids"):
            assert getattr(got, name) == getattr(want, name), name
        assert got.completion_ids == want.completion_ids
        assert got.loss_mask == want.loss_mask
        assert got.logprobs == want.logprobs  # all exact in float32
        assert got.status == want.status
        assert got.reward == want.reward or (math.isnan(got.reward) and math.isnan(want.reward))
        assert got.spans == mask_runs(want.loss_mask) == want.spans
        assert got.policy_version == want.policy_version
        assert got.span_versions == [want.policy_version] * len(want.spans)
        assert got.num_completion_tokens == want.num_completion_tokens
        assert got.num_env_tokens == want.num_env_tokens
        assert got.messages == want.messages and got.turns == want.turns
        assert got.reward_components == want.reward_components


def test_turn_rewards_and_env_metrics_round_trip_and_older_files_read(tmp_path):
    traj = make_traj(0, [1, 0, 1])
    traj.turn_rewards, traj.env_metrics = [0.5, None], {"tool_calls": 2.0, "sandbox_s": 0.25}
    write_run(tmp_path, [traj], {}, {})
    (got,) = load_trajectories(tmp_path / "trajectories.parquet")
    assert got.turn_rewards == [0.5, None] and got.env_metrics == traj.env_metrics
    older = trajectory_table([traj]).drop_columns(["turn_rewards", "env_metrics"])
    pq.write_table(older, tmp_path / "old.parquet")
    (old,) = load_trajectories(tmp_path / "old.parquet")
    assert old.turn_rewards == [] and old.env_metrics == {}
    assert old.completion_ids == traj.completion_ids


def good_row(k: int) -> dict:
    return trajectory_table([make_traj(k, [1, 0, 1])]).to_pylist()[0]


def write_rows(path, rows) -> None:
    pq.write_table(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA), path)


BAD = {
    "unequal lengths": ({"logprobs": [-0.5, 0.0]}, "3 completion_ids, 2 logprobs and 3 loss_mask"),
    "mask value 2": ({"loss_mask": [1, 2, 1]}, "loss_mask has values other than 0 and 1: [2]"),
    "positive logprob": ({"logprobs": [-0.5, 0.0, 0.25]}, "logprob > 0, -inf or NaN under mask 1"),
    "NaN logprob": ({"logprobs": [float("nan"), 0.0, -1.0]}, "logprob > 0, -inf or NaN under"),
    "-inf logprob": ({"logprobs": [float("-inf"), 0.0, -1.0]}, "logprob > 0, -inf or NaN under"),
    "unknown status": ({"status": "finished"}, "unknown status 'finished'"),
    "NaN reward": ({"reward": float("nan")}, "reward is nan"),
    "null reward": ({"reward": None}, "reward is None"),
    "null ids": ({"completion_ids": None}, "must not be null"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_malformed_rows_are_refused_with_row_and_problem(tmp_path, case):
    change, problem = BAD[case]
    rows = [good_row(0), good_row(1), {**good_row(2), **change}, good_row(3)]
    write_rows(tmp_path / "t.parquet", rows)
    with pytest.raises(ValueError) as info:
        load_trajectories(tmp_path / "t.parquet")
    message = str(info.value)
    assert "row 2 (example 12)" in message
    assert problem in message
    assert str(tmp_path / "t.parquet") in message


def test_the_first_bad_row_is_named(tmp_path):
    rows = [good_row(0), {**good_row(1), "status": "x"}, {**good_row(2), "status": "y"}]
    write_rows(tmp_path / "t.parquet", rows)
    with pytest.raises(ValueError, match=r"row 1 \(example 11\): unknown status 'x'"):
        load_trajectories(tmp_path / "t.parquet")


@pytest.mark.parametrize("status", ["error", "env_timeout", "aborted"])
@pytest.mark.parametrize("reward", [float("nan"), None])
def test_missing_reward_is_accepted_on_failed_rows(tmp_path, status, reward):
    rows = [good_row(0), {**good_row(1), "status": status, "reward": reward}]
    write_rows(tmp_path / "t.parquet", rows)
    loaded = load_trajectories(tmp_path / "t.parquet")
    assert loaded[1].status == Status(status)
    assert loaded[1].reward is None if reward is None else math.isnan(loaded[1].reward)
    assert loaded[0].reward == 1.0


def test_logprob_zero_under_mask_1_and_glue_logprob_zero_are_fine(tmp_path):
    rows = [{**good_row(0), "logprobs": [0.0, 0.0, -3.0]}]
    write_rows(tmp_path / "t.parquet", rows)
    (traj,) = load_trajectories(tmp_path / "t.parquet")
    assert traj.logprobs == [0.0, 0.0, -3.0] and traj.spans == [(0, 1), (2, 3)]


def test_nan_logprob_on_a_glue_token_is_refused(tmp_path):
    """Glue tokens carry logprob 0.0 (the Trajectory contract); a NaN there would pass
    into Batch.logprobs and turn any masked-by-multiplication loss into NaN."""
    rows = [good_row(0), {**good_row(1), "logprobs": [-0.5, float("nan"), -0.5]}]
    write_rows(tmp_path / "t.parquet", rows)
    with pytest.raises(ValueError, match=r"row 1 \(example 11\)"):
        load_trajectories(tmp_path / "t.parquet")
