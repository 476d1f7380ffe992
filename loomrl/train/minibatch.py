"""PPO mini-batches: consecutive runs of whole samples of a training batch, each a
``Batch`` of its own (so its loss is normalised over its own tokens); ``permute`` reorders
a batch's samples first, so that each epoch's mini-batches mix other samples (the batch
arrives group after group: unshuffled, a mini-batch would hold a few whole groups)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import Tensor

from loomrl.experience import Batch
from loomrl.vision.pixels import Pixels


def ranges(num_samples: int, size: int | None) -> list[tuple[int, int]]:
    """``[first, end)`` sample ranges of at most ``size`` samples (None: one range)."""
    if size is None or size >= num_samples:
        return [(0, num_samples)]
    return [(i, min(i + size, num_samples)) for i in range(0, num_samples, size)]


def select(batch: Batch, first: int, end: int, *aligned: Tensor) -> tuple[Batch, list[Tensor]]:
    """Samples ``[first, end)`` of ``batch`` as a batch of the same layout, and the same
    slice of each token-aligned tensor in ``aligned`` (shaped like ``batch.input_ids``).

    Padded: the rows, minus the columns that only pad them (every completion still starts
    at the new batch's prompt width): what ``pad`` makes of those samples. Packed: the
    samples' columns, ``cu_seqlens`` shifted to start at 0. The whole range is ``batch``."""
    if (first, end) == (0, batch.num_samples):
        return batch, list(aligned)
    if batch.layout == "padded":
        start = batch.prompt_width - int(batch.prompt_lengths[first:end].max())
        stop = batch.prompt_width + int(batch.completion_lengths[first:end].max())
        at: tuple[slice, slice] = (slice(first, end), slice(start, stop))
        cu = None
    else:
        assert batch.cu_seqlens is not None
        at = (slice(0, 1), slice(int(batch.cu_seqlens[first]), int(batch.cu_seqlens[end])))
        cu = batch.cu_seqlens[first : end + 1] - batch.cu_seqlens[first]
    pixels = None if batch.pixels is None else batch.pixels.of_samples(first, end)
    sub = _rebuilt(batch, lambda t: t[at], slice(first, end), cu, pixels)
    return sub, [t[at] for t in aligned]


def permute(batch: Batch, order: Sequence[int], *aligned: Tensor) -> tuple[Batch, list[Tensor]]:
    """``batch`` with its samples in ``order`` (a permutation of their indices), and each
    token-aligned tensor of ``aligned`` reordered the same way."""
    rows = torch.tensor(list(order), dtype=torch.long)  # the per-sample tensors: on the host
    device = batch.input_ids.device
    if batch.layout == "padded":
        token_rows = rows.to(device, non_blocking=True)

        def take(t: Tensor) -> Tensor:
            return t[token_rows.to(t.device)]

        cu = None
    else:
        assert batch.cu_seqlens is not None
        bounds = batch.cu_seqlens.tolist()
        cols = torch.cat([torch.arange(bounds[i], bounds[i + 1]) for i in order])
        cols = cols.to(device, non_blocking=True)

        def take(t: Tensor) -> Tensor:
            return t[:, cols.to(t.device)]

        lengths = (batch.cu_seqlens[1:] - batch.cu_seqlens[:-1])[rows]
        cu = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(batch.cu_seqlens.dtype)
    pixels = None if batch.pixels is None else batch.pixels.in_order(order)
    moved = _rebuilt(batch, take, rows, cu, pixels)
    return moved, [take(t) for t in aligned]


def _rebuilt(
    batch: Batch,
    take: Callable[[Tensor], Tensor],
    samples: slice | Tensor,
    cu: Tensor | None,
    pixels: Pixels | None,
) -> Batch:
    """``batch`` with every token tensor passed through ``take``, every per-sample tensor
    indexed by ``samples``, and the given ``cu_seqlens`` and images."""
    return replace(
        batch,
        input_ids=take(batch.input_ids), position_ids=take(batch.position_ids),
        attention_mask=None if batch.attention_mask is None else take(batch.attention_mask),
        cu_seqlens=cu, loss_mask=take(batch.loss_mask), logprobs=take(batch.logprobs),
        advantages=take(batch.advantages), returns=take(batch.returns),
        prompt_lengths=batch.prompt_lengths[samples],  # (a host index for host tensors)
        completion_lengths=batch.completion_lengths[samples],
        group_ids=batch.group_ids[samples], example_ids=batch.example_ids[samples],
        policy_versions=batch.policy_versions[samples], rewards=batch.rewards[samples],
        temperatures=None if batch.temperatures is None else take(batch.temperatures),
        pixels=pixels,
    )  # fmt: skip
