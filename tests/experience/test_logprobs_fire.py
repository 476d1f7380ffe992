"""Tokens sampled at another temperature (FIRE's hot first tokens) are scored at it: the
batch carries each span's temperature, and ``compute_logprobs`` divides each token's
logits by its own, in both layouts, against the naive reference of tests/test_logprobs."""

from __future__ import annotations

import math

import pytest
import torch
from test_logprobs import ATOL, make_trajs, model, naive  # noqa: F401 (the model fixture)

from loomrl.experience import compute_logprobs, pack, pad

SCALAR = 0.7


def fired():
    """Three trajectories: FIRE spans at 2.0 then regular ones at 0.7, glue between turns,
    and one with no recorded temperatures (an older record)."""
    trajs = make_trajs([(4, 6, [1, 1, 1, 1, 0, 1]), (3, 5, [1, 1, 1, 0, 1]), (2, 3, [1, 1, 1])])
    trajs[0].spans, trajs[0].span_temperatures = [(0, 2), (2, 4), (5, 6)], [2.0, SCALAR, 2.0]
    trajs[0].finish_reasons = ["fire", "stop", "stop"]
    trajs[1].spans, trajs[1].span_temperatures = [(0, 1), (1, 3), (4, 5)], [2.0, SCALAR, SCALAR]
    trajs[1].finish_reasons = ["fire", "stop", "stop"]
    trajs[2].spans = [(0, 3)]
    return trajs


def expected(model, trajs):  # noqa: F811
    """Each completion token from the naive reference at the temperature its span says."""
    hot, regular = naive(model, trajs, 2.0), naive(model, trajs, SCALAR)
    out = []
    for traj, h, r in zip(trajs, hot, regular, strict=True):
        want = r.clone()
        for (start, end), t in zip(traj.spans, traj.span_temperatures, strict=False):
            if t == 2.0:
                want[start:end] = h[start:end]
        out.append(want)
    return out


@pytest.mark.parametrize("build", [pad, pack])
def test_each_token_is_scored_at_its_sampling_temperature(model, build):  # noqa: F811
    trajs = fired()
    batch = build(trajs)
    got = batch.per_sample(compute_logprobs(model, batch, temperature=SCALAR, max_tokens=12))
    for i, (g, want) in enumerate(zip(got, expected(model, trajs), strict=True)):
        assert torch.allclose(g.double()[1:], want.double()[1:], atol=ATOL), i
    flat = batch.per_sample(compute_logprobs(model, batch, temperature=SCALAR, max_tokens=12))
    one = naive(model, trajs, SCALAR)  # scoring all at one temperature would differ here
    assert not torch.allclose(flat[0].double()[:2], one[0].double()[:2], atol=1e-2)


def test_the_batch_holds_span_temperatures_and_nan_elsewhere():
    trajs = fired()
    batch = pad(trajs)
    rows = batch.per_sample(batch.temperatures)
    assert rows[0].tolist()[:6] == pytest.approx(
        [2.0, 2.0, SCALAR, SCALAR, math.nan, 2.0], nan_ok=True
    )
    assert all(math.isnan(x) for x in rows[2].tolist())
    prompt_cols = batch.temperatures[:, : batch.prompt_width]
    assert torch.isnan(prompt_cols).all()


def test_a_greedy_token_cannot_be_scored(model):  # noqa: F811
    trajs = fired()
    trajs[0].span_temperatures = [0.0, SCALAR, 2.0]
    with pytest.raises(ValueError, match="temperature 0"):
        compute_logprobs(model, pad(trajs), temperature=SCALAR)


@pytest.mark.parametrize("build", [pad, pack])
def test_a_mini_batch_keeps_its_own_samples_temperatures(build):
    """PPO mini-batches slice the temperatures with the tokens: each sample keeps its own."""
    from loomrl.train import minibatch

    trajs = fired()
    batch = build(trajs)
    for first, end in [(0, 1), (1, 3), (2, 3)]:
        sub, _ = minibatch.select(batch, first, end)
        alone = build(trajs[first:end])
        assert sub.temperatures.shape == sub.input_ids.shape
        if alone.temperatures is None:  # none recorded: the same as NaN everywhere
            assert torch.isnan(sub.temperatures).all()
        else:
            torch.testing.assert_close(sub.temperatures, alone.temperatures, equal_nan=True)
