"""The report's per-step summaries, held to naive references (numpy's quantiles)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from loomrl.report import stats

finite = st.floats(-1e6, 1e6, allow_nan=False)


@given(st.lists(finite, min_size=1, max_size=50), st.floats(0, 1))
def test_quantile_matches_numpy(values, q):
    got = stats.quantile(sorted(values), q)
    assert math.isclose(got, float(np.quantile(values, q)), rel_tol=1e-9, abs_tol=1e-6)


@given(st.lists(finite, min_size=1, max_size=50))
def test_box_orders_its_five_numbers(values):
    b = stats.box(values)
    assert b["min"] <= b["q1"] <= b["median"] <= b["q3"] <= b["max"]
    assert math.isclose(b["mean"], float(np.mean(values)), rel_tol=1e-9, abs_tol=1e-6)


def test_reward_by_step_counts_only_scored_trajectories():
    steps = [1, 1, 1, 2, 2]
    rewards = [1.0, 0.0, 5.0, 0.5, 0.5]
    statuses = ["terminated", "truncated", "error", "max_turns", "aborted"]
    got = stats.reward_by_step(steps, rewards, statuses)
    assert got == {1: (0.5, 0.5), 2: (0.5, 0.0)}


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(stats.STATUSES)), min_size=1))
def test_status_rates_sum_to_one_per_step(rows):
    steps = [s for s, _ in rows]
    rates = stats.status_rates(steps, [st_ for _, st_ in rows])
    for step in set(steps):
        assert math.isclose(sum(r[step] for r in rates.values()), 1.0)


def test_group_spread_counts_groups_whose_scored_rewards_differ():
    groups = [(1, 0), (1, 0), (1, 1), (1, 1), (2, 0), (2, 0)]
    rewards = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    statuses = ["terminated"] * 5 + ["error"]
    assert stats.group_spread(groups, rewards, statuses) == (1, 2)


def test_a_run_from_before_the_clip_fraction_was_renamed_still_plots_it(tmp_path):
    """Runs that logged the clip fraction only as ``clip_frac`` keep their curve."""
    import pyarrow as pa

    from loomrl.report.figures_rows import series
    from loomrl.report.load import Run

    old = [{"step": 1, "clip_frac": 0.25}, {"step": 2, "clip_frac": 0.5}]
    new = [{"step": 1, "clip_fraction": 0.125}]
    for rows, expected in ((old, ([1, 2], [0.25, 0.5])), (new, ([1], [0.125]))):
        run = Run(tmp_path, "train", {}, rows, pa.table({}))
        assert series(run, "clip_fraction") == expected
