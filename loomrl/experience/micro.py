"""Micro-batches: the slices of a training batch that run in one forward pass each.

Planned on the host from the per-sample lengths alone (``Batch`` keeps them on the CPU),
so cutting a batch that lives on a GPU never waits for it. Samples are taken longest
first and packed first-fit-decreasing into a token budget: a padded micro-batch holds
samples of similar length (few padded cells), a packed one fills its budget. Batches with
images keep their sample order (their pixels are sliced by sample range).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from loomrl.experience.batch import Batch
from loomrl.vision.pixels import Pixels

Index = slice | Tensor


@dataclass(frozen=True)
class MicroBatch:
    """A slice of a batch to run in one forward pass.

    ``rows`` and ``cols`` locate it in the batch's token tensors (a slice, or an index
    tensor when its samples are not adjacent); ``want [b, n]`` marks the tokens whose
    logprob is needed: completion tokens, except a sample's very first token (no prompt),
    which has no context of its own to be scored from. ``keep [k]`` are the columns whose
    logits predict a wanted token (column ``t`` predicts token ``t + 1``). A packed
    micro-batch (one row of whole samples) knows its samples' lengths (``documents``), so
    attention can stay within each without reading the row back from the device.
    """

    rows: Index
    cols: Index
    input_ids: Tensor
    position_ids: Tensor
    attention_mask: Tensor | None
    want: Tensor
    temperatures: Tensor | None = None  # [b, n]: each token's sampling temperature, or NaN
    pixels: Pixels | None = None  # the images of the slice's samples (vision models)
    keep: Tensor | None = None
    documents: tuple[int, ...] | None = None  # a packed row's sample lengths, on the host

    @property
    def logit_columns(self) -> Tensor:
        """``keep``, or (for a hand-made micro-batch) the columns ``want`` implies."""
        if self.keep is not None:
            return self.keep
        return torch.nonzero(self.want[:, 1:].any(dim=0)).flatten()


def micro_batches(batch: Batch, max_tokens: int = 2048) -> Iterator[MicroBatch]:
    """Slices of whole samples with at most ``max_tokens`` tokens (padding included) each;
    a longer sample is a slice of its own."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    _check_temperatures(batch)
    p = batch.prompt_lengths.tolist()
    c = batch.completion_lengths.tolist()
    keep_order = batch.pixels is not None
    if batch.layout == "packed":
        yield from _packed(batch, p, c, max_tokens, keep_order)
    else:
        yield from _padded(batch, p, c, max_tokens, keep_order)


def _padded(
    batch: Batch, p: list[int], c: list[int], max_tokens: int, keep_order: bool
) -> Iterator[MicroBatch]:
    order = list(range(len(p))) if keep_order else sorted(range(len(p)), key=lambda i: -p[i] - c[i])
    width, device = max(p, default=0), batch.input_ids.device
    first = 0
    while first < len(order):
        end, wp, wc = first, 0, 0
        while end < len(order):
            i = order[end]
            np_, nc = max(wp, p[i]), max(wc, c[i])
            if end > first and (end + 1 - first) * (np_ + nc) > max_tokens:
                break
            wp, wc, end = np_, nc, end + 1
        members = sorted(order[first:end])  # in batch order: adjacent ones are a slice
        rows = _index(members, device)
        cols = slice(width - wp, width + wc)
        want = torch.zeros((len(members), wp + wc), dtype=torch.bool)
        want[:, wp:] = torch.arange(wc)[None, :] < torch.tensor([c[i] for i in members])[:, None]
        for r, i in enumerate(members):
            if p[i] == 0 and c[i]:  # the very first token of a sample: nothing to score it from
                want[r, wp] = False
        lo = wp - 1 if any(p[i] and c[i] for i in members) else wp
        keep = torch.arange(lo, max(lo, wp + wc - 1))
        yield _slice(batch, rows, cols, want, keep, members)
        first = end


def _packed(
    batch: Batch, p: list[int], c: list[int], max_tokens: int, keep_order: bool
) -> Iterator[MicroBatch]:
    cu = batch.cu_seqlens.tolist()  # type: ignore[union-attr]
    lengths = [p[i] + c[i] for i in range(len(p))]
    for members in _bins(lengths, max_tokens, keep_order):
        wants, keeps, at = [], [], 0
        for i in members:
            want = torch.zeros(lengths[i], dtype=torch.bool)
            want[p[i] + (0 if p[i] else 1) : p[i] + c[i]] = True
            wants.append(want)
            first_kept = at + max(p[i] - 1, 0)
            keeps.append(torch.arange(first_kept, max(first_kept, at + lengths[i] - 1)))
            at += lengths[i]
        cols: Index = slice(cu[members[0]], cu[members[-1] + 1])
        if not _adjacent(members):
            spans = torch.cat([torch.arange(cu[i], cu[i + 1]) for i in members])
            cols = spans.to(batch.input_ids.device, non_blocking=True)
        keep = torch.cat(keeps) if keeps else torch.zeros(0, dtype=torch.long)
        mb = _slice(batch, slice(0, 1), cols, torch.cat(wants)[None, :], keep, members)
        yield dataclasses.replace(mb, documents=tuple(lengths[i] for i in members))


def _bins(lengths: list[int], budget: int, keep_order: bool) -> list[list[int]]:
    """Sample indices in bins of at most ``budget`` tokens: first-fit decreasing, or
    consecutive runs when the order must stay."""
    if keep_order:
        bins: list[list[int]] = []
        total = budget + 1
        for i, n in enumerate(lengths):
            if total + n > budget:
                bins.append([])
                total = 0
            bins[-1].append(i)
            total += n
        return bins
    bins, room = [], []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(budget - lengths[i])
    return [sorted(members) for members in bins]


def _slice(
    batch: Batch, rows: Index, cols: Index, want: Tensor, keep: Tensor, members: list[int]
) -> MicroBatch:
    device = batch.input_ids.device
    attention = None if batch.attention_mask is None else batch.attention_mask[rows, cols]
    temperatures = None if batch.temperatures is None else batch.temperatures[rows, cols]
    return MicroBatch(
        rows, cols, batch.input_ids[rows, cols], batch.position_ids[rows, cols], attention,
        want.to(device, non_blocking=True), temperatures, _images(batch, members),
        keep.to(device, non_blocking=True),
    )  # fmt: skip


def _index(members: list[int], device: torch.device) -> Index:
    """A slice when ``members`` are adjacent and ascending, else an index tensor."""
    if _adjacent(members):
        return slice(members[0], members[-1] + 1)
    return torch.tensor(members, dtype=torch.long).to(device, non_blocking=True)


def _adjacent(members: list[int]) -> bool:
    return all(b == a + 1 for a, b in itertools.pairwise(members))


def _images(batch: Batch, members: list[int]) -> Pixels | None:
    """The images of the (adjacent) samples ``members``, or None when they have none."""
    if batch.pixels is None:
        return None
    pixels = batch.pixels.of_samples(members[0], members[-1] + 1)
    return pixels if pixels.values.shape[0] else None


def _check_temperatures(batch: Batch) -> None:
    """A token sampled greedily (temperature 0) has no distribution to score it under."""
    if batch.temperatures is not None and bool((batch.temperatures <= 0).any()):
        raise ValueError("a token sampled at temperature 0 (greedy) cannot be scored")
