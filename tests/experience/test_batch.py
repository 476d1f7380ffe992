"""``pad`` and ``pack``: every tensor of a ``Batch`` against a cell-by-cell Python
reference built from the layout's definition, for random shapes, plus the length checks."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loomrl.experience import Batch, pack, pad
from loomrl.types import Trajectory

PROPERTY = settings(max_examples=60, deadline=None)
PAD = 9999


def make_traj(
    prompt: list[int],
    completion: list[int],
    mask: list[int] | None = None,
    logprobs: list[float] | None = None,
    *,
    example_id: int = 0,
    group_id: int = 0,
    reward: float = 0.0,
    versions: tuple[int, ...] = (),
) -> Trajectory:
    mask = [1] * len(completion) if mask is None else mask
    if logprobs is None:
        logprobs = [-0.25 * (j + 1) if bit else 0.0 for j, bit in enumerate(mask)]
    return Trajectory(
        example_id=example_id, group_id=group_id, sample_index=0, env="t",
        prompt_ids=prompt, completion_ids=completion, logprobs=logprobs, loss_mask=mask,
        span_versions=list(versions), reward=reward,
    )  # fmt: skip


@st.composite
def samples(draw):
    """1-5 trajectories with prompts of 1-6 tokens, completions of 0-6 tokens, random mask
    bits, distinct logprobs, and advantage/return rows (some longer than the completion)."""
    n = draw(st.integers(1, 5))
    trajs, advs, rets = [], [], []
    for i in range(n):
        p, c = draw(st.integers(1, 6)), draw(st.integers(0, 6))
        mask = draw(st.lists(st.integers(0, 1), min_size=c, max_size=c))
        extra = draw(st.integers(0, 2))
        ids = [100 * (i + 1) + j for j in range(p + c)]
        lps = [-(i + 1) - j / 8 if bit else 0.0 for j, bit in enumerate(mask)]
        trajs.append(
            make_traj(
                ids[:p],
                ids[p:],
                mask,
                lps,
                example_id=10 + i,
                group_id=i // 2,
                reward=i / 4,
                versions=(i + 3, i + 1),
            )
        )
        advs.append([float(i + 1) + j / 16 for j in range(c + extra)])
        rets.append([-float(i + 1) - j / 16 for j in range(c + extra)])
    return trajs, advs, rets


def expected_padded(trajs, advs, rets):
    """The padded layout cell by cell, straight from its definition."""
    width_p = max(len(t.prompt_ids) for t in trajs)
    width = width_p + max(len(t.completion_ids) for t in trajs)
    cells = {k: [] for k in ("ids", "attn", "mask", "lp", "adv", "ret")}
    for t, adv, ret in zip(trajs, advs, rets, strict=True):
        first = width_p - len(t.prompt_ids)
        tokens = t.prompt_ids + t.completion_ids
        row = {k: [] for k in cells}
        for col in range(width):
            real = first <= col < width_p + len(t.completion_ids)
            row["ids"].append(tokens[col - first] if real else PAD)
            row["attn"].append(1 if real else 0)
            j = col - width_p  # completion index
            on = 0 <= j < len(t.completion_ids)
            row["mask"].append(float(t.loss_mask[j]) if on else 0.0)
            row["lp"].append(t.logprobs[j] if on else 0.0)
            row["adv"].append(adv[j] if on else 0.0)
            row["ret"].append(ret[j] if on else 0.0)
        for k in cells:
            cells[k].append(row[k])
    return cells


def expected_positions(trajs, layout):
    """(row, col, position) for every real token."""
    out = []
    width_p = max(len(t.prompt_ids) for t in trajs)
    offset = 0
    for i, t in enumerate(trajs):
        n = len(t.prompt_ids) + len(t.completion_ids)
        first = width_p - len(t.prompt_ids) if layout == "padded" else offset
        out += [(i if layout == "padded" else 0, first + k, k) for k in range(n)]
        offset += n
    return out


def assert_metadata(batch: Batch, trajs) -> None:
    assert batch.prompt_lengths.tolist() == [len(t.prompt_ids) for t in trajs]
    assert batch.completion_lengths.tolist() == [len(t.completion_ids) for t in trajs]
    assert batch.group_ids.tolist() == [t.group_id for t in trajs]
    assert batch.example_ids.tolist() == [t.example_id for t in trajs]
    assert batch.policy_versions.tolist() == [min(t.span_versions, default=0) for t in trajs]
    assert batch.rewards.tolist() == [t.reward for t in trajs]
    assert batch.rewards.dtype == torch.float32
    for name in ("prompt_lengths", "completion_lengths", "group_ids", "policy_versions"):
        assert getattr(batch, name).dtype == torch.int64
    assert batch.num_samples == len(trajs)
    assert batch.num_tokens == sum(len(t.prompt_ids) + len(t.completion_ids) for t in trajs)


@PROPERTY
@given(samples())
def test_padded_layout_matches_its_definition_cell_by_cell(sample):
    trajs, advs, rets = sample
    batch = pad(trajs, advs, rets, pad_token_id=PAD)
    want = expected_padded(trajs, advs, rets)
    assert batch.layout == "padded" and batch.cu_seqlens is None
    assert batch.input_ids.dtype == torch.int64
    assert batch.input_ids.tolist() == want["ids"]
    assert batch.attention_mask.tolist() == want["attn"]
    for name, key in (("loss_mask", "mask"), ("logprobs", "lp"), ("advantages", "adv")):
        assert getattr(batch, name).dtype == torch.float32
        assert torch.equal(getattr(batch, name), torch.tensor(want[key], dtype=torch.float32))
    assert torch.equal(batch.returns, torch.tensor(want["ret"], dtype=torch.float32))
    for row, col, position in expected_positions(trajs, "padded"):
        assert batch.position_ids[row, col] == position
    assert batch.prompt_width == max(len(t.prompt_ids) for t in trajs)
    assert_metadata(batch, trajs)


@PROPERTY
@given(samples())
def test_packed_layout_concatenates_samples_with_restarting_positions(sample):
    trajs, advs, rets = sample
    batch = pack(trajs, advs, rets)
    lengths = [len(t.prompt_ids) + len(t.completion_ids) for t in trajs]
    assert batch.layout == "packed" and batch.attention_mask is None
    assert batch.cu_seqlens.dtype == torch.int32
    assert batch.cu_seqlens.tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    ids, mask, lps, adv, ret = [], [], [], [], []
    for t, a, r in zip(trajs, advs, rets, strict=True):
        c, zeros = len(t.completion_ids), [0.0] * len(t.prompt_ids)
        ids += t.prompt_ids + t.completion_ids
        mask += zeros + [float(b) for b in t.loss_mask]
        lps += zeros + t.logprobs
        adv += zeros + a[:c]
        ret += zeros + r[:c]
    assert batch.input_ids.tolist() == [ids]
    positions = [0] * len(ids)
    for _, col, position in expected_positions(trajs, "packed"):
        positions[col] = position
    assert batch.position_ids.tolist() == [positions]
    for name, values in (("loss_mask", mask), ("logprobs", lps), ("advantages", adv)):
        assert torch.equal(getattr(batch, name), torch.tensor([values], dtype=torch.float32))
    assert torch.equal(batch.returns, torch.tensor([ret], dtype=torch.float32))
    assert_metadata(batch, trajs)


@PROPERTY
@given(samples())
def test_per_sample_gives_each_completion_in_both_layouts(sample):
    trajs, advs, rets = sample
    padded, packed = pad(trajs, advs, rets), pack(trajs, advs, rets)
    for name in ("loss_mask", "logprobs", "advantages", "returns", "input_ids"):
        a = padded.per_sample(getattr(padded, name))
        b = packed.per_sample(getattr(packed, name))
        assert len(a) == len(b) == len(trajs)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)
    for i, t in enumerate(trajs):
        c = len(t.completion_ids)
        assert packed.per_sample(packed.input_ids)[i].tolist() == t.completion_ids
        assert packed.per_sample(packed.logprobs)[i].tolist() == pytest.approx(t.logprobs)
        assert packed.per_sample(packed.advantages)[i].tolist() == advs[i][:c]
        assert packed.per_sample(packed.loss_mask)[i].tolist() == t.loss_mask


def test_without_advantages_and_returns_they_are_zero():
    trajs = [make_traj([1, 2], [3, 4, 5]), make_traj([6], [7])]
    for batch in (pad(trajs), pack(trajs)):
        assert not batch.advantages.any() and not batch.returns.any()
        assert batch.loss_mask.sum() == 4  # the completions are still marked


def test_hand_example_padded_and_packed():
    trajs = [
        make_traj([1, 2, 3], [4, 5], [1, 0], [-0.5, 0.0], versions=(2,)),
        make_traj([6], [7, 8, 9], [1, 1, 1], [-1.0, -2.0, -3.0]),
    ]
    adv = [[0.5, 0.0], [-1.0, -1.0, -1.0]]
    padded = pad(trajs, adv, pad_token_id=0)
    assert padded.input_ids.tolist() == [[1, 2, 3, 4, 5, 0], [0, 0, 6, 7, 8, 9]]
    assert padded.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert padded.position_ids[1, 2:].tolist() == [0, 1, 2, 3]
    assert padded.position_ids[0, :5].tolist() == [0, 1, 2, 3, 4]
    assert padded.loss_mask.tolist() == [[0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 1, 1]]
    assert padded.advantages.tolist() == [[0, 0, 0, 0.5, 0, 0], [0, 0, 0, -1, -1, -1]]
    packed = pack(trajs, adv)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    assert packed.cu_seqlens.tolist() == [0, 5, 9]
    assert packed.logprobs.tolist() == [[0, 0, 0, -0.5, 0, 0, -1, -2, -3]]
    assert packed.policy_versions.tolist() == [2, 0]


def test_estimator_rows_padded_to_the_batch_width_are_accepted():
    trajs = [make_traj([1], [2]), make_traj([3], [4, 5, 6])]
    rows = [[0.5, 7.0, 7.0], [1.0, 2.0, 3.0]]  # row 0 is padded past its completion
    batch = pad(trajs, rows)
    assert [x.tolist() for x in batch.per_sample(batch.advantages)] == [[0.5], [1.0, 2.0, 3.0]]
    assert 7.0 not in batch.advantages


@pytest.mark.parametrize("build", [pad, pack])
def test_no_trajectories_is_an_error(build):
    with pytest.raises(ValueError, match="no trajectories"):
        build([])


@pytest.mark.parametrize("build", [pad, pack])
@pytest.mark.parametrize(
    "lps, mask", [([-1.0], [1, 1]), ([-1.0, -1.0], [1]), ([-1.0, -1.0, -1.0], [1, 1, 1])]
)
def test_unequal_completion_logprob_and_mask_lengths_name_the_trajectory(build, lps, mask):
    good = make_traj([1], [2, 3])
    bad = make_traj([1], [2, 3], mask, lps, example_id=42)
    with pytest.raises(ValueError, match=r"trajectory 1 \(example 42\)"):
        build([good, bad])


@pytest.mark.parametrize("build", [pad, pack])
def test_advantage_and_return_rows_are_checked(build):
    trajs = [make_traj([1], [2, 3]), make_traj([1], [2, 3, 4], example_id=7)]
    with pytest.raises(ValueError, match="2 trajectories but 1 advantages rows"):
        build(trajs, [[1.0, 1.0]])
    with pytest.raises(ValueError, match="2 trajectories but 3 returns rows"):
        build(trajs, None, [[0.0] * 3] * 3)
    with pytest.raises(ValueError, match=r"trajectory 1 \(example 7\): 2 advantages for 3"):
        build(trajs, [[1.0, 1.0], [1.0, 1.0]])
    with pytest.raises(ValueError, match=r"trajectory 1 \(example 7\): 1 returns for 3"):
        build(trajs, None, [[1.0, 1.0], [1.0]])


def test_per_sample_rejects_misaligned_values():
    batch = pad([make_traj([1], [2, 3])])
    with pytest.raises(ValueError, match="not aligned"):
        batch.per_sample(torch.zeros(1, 2))


@pytest.mark.parametrize("build", [pad, pack])
def test_to_cpu_returns_an_equal_batch(build):
    trajs = [make_traj([1, 2], [3, 4], [1, 0]), make_traj([5], [6], reward=1.5, versions=(4,))]
    batch = build(trajs, [[1.0, 0.0], [2.0]], [[3.0, 0.0], [4.0]])
    moved = batch.to("cpu")
    assert isinstance(moved, Batch) and moved.layout == batch.layout
    names = [f.name for f in fields(Batch)]
    assert len(names) == 17
    for name in names:
        value, other = getattr(batch, name), getattr(moved, name)
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(value, other, rtol=0, atol=0, equal_nan=True)
            assert other.dtype == value.dtype, name
            assert other.device.type == "cpu"
        else:
            assert value == other, name
    assert moved.num_tokens == batch.num_tokens
