"""Training batches: trajectories as torch tensors, padded or packed.

Every per-token tensor of a ``Batch`` is aligned with ``input_ids``: entry ``t`` belongs to
token ``t`` (its loss mask bit, the logprob it was sampled with, its advantage). Prompt
and padding positions hold 0. The logprob of token ``t`` comes from the logits at
``t - 1``; ``loomrl.experience.compute_logprobs`` returns it at ``t``, so sampling and
recomputed logprobs line up entry for entry.

- **padded** ``[B, L]``: prompts left-padded to the longest prompt ``P``, completions
  right-padded, so every completion starts at column ``P``; ``attention_mask`` marks real
  tokens and ``position_ids`` count from 0 at each sample's first real token.
- **packed** ``[1, N]``: samples concatenated without padding; ``cu_seqlens [B + 1]`` are
  the sample boundaries and ``position_ids`` restart at 0 for each sample (what flash
  attention and transformers' packed-sequence masks read); ``attention_mask`` is None.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Literal

import torch
from torch import Tensor

from loomrl.types import Trajectory
from loomrl.vision.pixels import Pixels

Layout = Literal["padded", "packed"]


@dataclass(frozen=True)
class Batch:
    """B samples as tensors; see the module docstring for the two layouts.

    ``prompt_lengths``, ``completion_lengths``, ``group_ids``, ``example_ids``,
    ``policy_versions`` and ``rewards`` are ``[B]``, one entry per sample in input order.
    """

    layout: Layout
    input_ids: Tensor  # [B, L] | [1, N] int64
    position_ids: Tensor  # same shape, int64
    attention_mask: Tensor | None  # [B, L] int64 (padded) | None (packed)
    cu_seqlens: Tensor | None  # [B + 1] int32 (packed) | None (padded)
    loss_mask: Tensor  # same shape as input_ids, float32 in {0, 1}
    logprobs: Tensor  # float32, sampling logprobs (0 off the model's tokens)
    advantages: Tensor  # float32
    returns: Tensor  # float32
    prompt_lengths: Tensor  # [B] int64
    completion_lengths: Tensor  # [B] int64
    group_ids: Tensor  # [B] int64
    example_ids: Tensor  # [B] int64
    policy_versions: Tensor  # [B] int64
    rewards: Tensor  # [B] float32
    #: Same shape as input_ids, float32: the temperature each model token was sampled at
    #: (``Trajectory.span_temperatures``), NaN where none is recorded (prompt, glue,
    #: padding, older records): scoring uses its own temperature there.
    temperatures: Tensor | None = None
    #: The samples' images (vision-language models), ``Pixels.counts`` per sample; None
    #: for a batch without images.
    pixels: Pixels | None = None

    @property
    def num_samples(self) -> int:
        return int(self.prompt_lengths.numel())

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens, prompts included."""
        return int((self.prompt_lengths + self.completion_lengths).sum())

    @property
    def prompt_width(self) -> int:
        """Padded layout: the column where every completion starts."""
        return int(self.prompt_lengths.max()) if self.num_samples else 0

    def to(self, device: torch.device | str, *, metadata: bool = True) -> Batch:
        """The same batch on ``device``; ``metadata=False`` leaves the per-sample ``[B]``
        tensors and ``cu_seqlens`` on the host, where micro-batches are planned from them
        without waiting for the device."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        host = set() if metadata else {"cu_seqlens", *_METADATA}
        moved: dict[str, Tensor | Pixels] = {
            k: v.to(device, non_blocking=True) if isinstance(v, Tensor) else v.to(device)
            for k, v in values.items()
            if isinstance(v, Tensor | Pixels) and k not in host
        }
        return replace(self, **moved)

    def completion_slices(self) -> list[tuple[int, int, int]]:
        """``(row, start, end)`` of each sample's completion tokens in the token tensors."""
        p = self.prompt_lengths.tolist()
        c = self.completion_lengths.tolist()
        if self.layout == "padded":
            width = self.prompt_width
            return [(i, width, width + c[i]) for i in range(len(p))]
        starts = self.cu_seqlens.tolist() if self.cu_seqlens is not None else []
        return [(0, starts[i] + p[i], starts[i] + p[i] + c[i]) for i in range(len(p))]

    def per_sample(self, values: Tensor) -> list[Tensor]:
        """Each sample's completion part of a token-aligned tensor (``values`` shaped like
        ``input_ids``), e.g. to compare padded and packed results sample by sample."""
        if values.shape != self.input_ids.shape:
            raise ValueError(
                f"values {tuple(values.shape)} are not aligned with input_ids "
                f"{tuple(self.input_ids.shape)}"
            )
        return [values[row, start:end] for row, start, end in self.completion_slices()]

    def _completion_index(self) -> tuple[Tensor, Tensor]:
        """``[B, T]`` flat positions of each sample's completion tokens in the token
        tensors (T the longest completion) and where they are real (``t < c_i``)."""
        c = self.completion_lengths
        width = int(c.max()) if self.num_samples else 0
        t = torch.arange(width, dtype=torch.long)
        if self.layout == "padded":
            length = self.input_ids.shape[1]
            rows = torch.arange(self.num_samples, dtype=torch.long)
            starts = rows * length + self.prompt_width
        else:
            assert self.cu_seqlens is not None
            starts = self.cu_seqlens[:-1].long() + self.prompt_lengths
        return starts[:, None] + t[None, :], t[None, :] < c[:, None]

    def grid(self, values: Tensor) -> Tensor:
        """A token-aligned tensor (shaped like ``input_ids``) as ``[B, T]`` over completion
        tokens, right-padded with 0: what the estimators read."""
        if values.shape != self.input_ids.shape:
            raise ValueError(
                f"values {tuple(values.shape)} are not aligned with input_ids "
                f"{tuple(self.input_ids.shape)}"
            )
        index, real = self._completion_index()
        flat = values.reshape(-1)
        picked = flat[index.clamp(max=max(flat.numel() - 1, 0))] if flat.numel() else flat
        return torch.where(real, picked, torch.zeros((), dtype=values.dtype))

    def tokens(self, grid: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """The inverse of ``grid``: ``[B, T]`` completion values placed on their tokens,
        ``dtype``, 0 on prompt and padding (columns past a row's completion are ignored)."""
        index, real = self._completion_index()
        out = torch.zeros(self.input_ids.numel(), dtype=dtype)
        out[index[real]] = grid[:, : index.shape[1]][real].to(dtype)
        return out.reshape(self.input_ids.shape)


def pad(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[Sequence[float]] | None = None,
    returns: Sequence[Sequence[float]] | None = None,
    *,
    pad_token_id: int = 0,
    pixels: Pixels | None = None,
) -> Batch:
    """A padded batch; ``advantages`` / ``returns`` are per completion token (0 if None);
    ``pixels`` are the trajectories' images (``PixelEncoder.encode``), needed if any has."""
    rows = _rows(trajectories, advantages, returns)
    _check_pixels(trajectories, pixels)
    width_p = max((len(t.prompt_ids) for t in trajectories), default=0)
    width_c = max((len(t.completion_ids) for t in trajectories), default=0)
    b, length = len(trajectories), width_p + width_c
    ids = torch.full((b, length), pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, length), dtype=torch.long)
    token = _token_tensors((b, length))
    for i, (traj, adv, ret) in enumerate(rows):
        p, c = len(traj.prompt_ids), len(traj.completion_ids)
        first, end = width_p - p, width_p + c
        ids[i, first:end] = torch.tensor(traj.prompt_ids + traj.completion_ids, dtype=torch.long)
        attention[i, first:end] = 1
        _fill(token, i, slice(width_p, end), traj, adv, ret)
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    _drop_unrecorded(token, trajectories)
    return Batch(
        layout="padded", input_ids=ids, position_ids=positions, attention_mask=attention,
        cu_seqlens=None, pixels=pixels, **token, **_metadata(trajectories),
    )  # fmt: skip


def pack(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[Sequence[float]] | None = None,
    returns: Sequence[Sequence[float]] | None = None,
    *,
    pixels: Pixels | None = None,
) -> Batch:
    """A packed batch ``[1, N]``; ``advantages`` / ``returns`` / ``pixels`` as in ``pad``."""
    rows = _rows(trajectories, advantages, returns)
    _check_pixels(trajectories, pixels)
    lengths = [len(t.prompt_ids) + len(t.completion_ids) for t in trajectories]
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    n = int(cu[-1])
    ids = torch.tensor(
        [tok for t in trajectories for tok in (*t.prompt_ids, *t.completion_ids)],
        dtype=torch.long,
    ).reshape(1, n)
    positions = torch.cat([torch.arange(k, dtype=torch.long) for k in lengths])
    token = _token_tensors((1, n))
    for i, (traj, adv, ret) in enumerate(rows):
        start = int(cu[i]) + len(traj.prompt_ids)
        _fill(token, 0, slice(start, int(cu[i + 1])), traj, adv, ret)
    _drop_unrecorded(token, trajectories)
    return Batch(
        layout="packed", input_ids=ids, position_ids=positions.reshape(1, n),
        attention_mask=None, cu_seqlens=cu, pixels=pixels, **token, **_metadata(trajectories),
    )  # fmt: skip


def _drop_unrecorded(token: dict[str, Tensor], trajectories: Sequence[Trajectory]) -> None:
    """No temperatures tensor when no trajectory recorded one (scoring then uses its own)."""
    if not any(t.span_temperatures for t in trajectories):
        token["temperatures"] = None  # type: ignore[assignment]


def _check_pixels(trajectories: Sequence[Trajectory], pixels: Pixels | None) -> None:
    """Images travel with their samples: one count per sample, matching what each holds."""
    if pixels is None:
        with_images = [t for t in trajectories if t.images]
        if with_images:
            t = with_images[0]
            raise ValueError(
                f"{len(with_images)} trajectories hold images (the first: example "
                f"{t.example_id}, sample {t.sample_index}): batch them with their pixels "
                "(loomrl.vision.pixels.PixelEncoder.for_model(model_dir).encode(trajectories))"
            )
        return
    counts = pixels.counts.tolist()
    expected = [len(t.images) for t in trajectories]
    if counts != expected:
        raise ValueError(f"pixels hold images per sample {counts}, the trajectories {expected}")


_FLOAT_FIELDS = ("loss_mask", "logprobs", "advantages", "returns")
_METADATA = (
    "prompt_lengths", "completion_lengths", "group_ids", "example_ids", "policy_versions",
    "rewards",
)  # fmt: skip


def _token_tensors(shape: tuple[int, int]) -> dict[str, Tensor]:
    token = {name: torch.zeros(shape, dtype=torch.float32) for name in _FLOAT_FIELDS}
    token["temperatures"] = torch.full(shape, float("nan"), dtype=torch.float32)
    return token


_Row = tuple[Trajectory, Sequence[float] | None, Sequence[float] | None]


def _rows(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[Sequence[float]] | None,
    returns: Sequence[Sequence[float]] | None,
) -> list[_Row]:
    """Pair each trajectory with its token values, checking every length on the way."""
    if not trajectories:
        raise ValueError("no trajectories to batch")
    for name, values in (("advantages", advantages), ("returns", returns)):
        if values is not None and len(values) != len(trajectories):
            raise ValueError(f"{len(trajectories)} trajectories but {len(values)} {name} rows")
    rows: list[_Row] = []
    for i, traj in enumerate(trajectories):
        c = len(traj.completion_ids)
        if not len(traj.logprobs) == len(traj.loss_mask) == c:
            raise ValueError(
                f"trajectory {i} (example {traj.example_id}): {c} completion ids, "
                f"{len(traj.logprobs)} logprobs, {len(traj.loss_mask)} mask bits"
            )
        adv = None if advantages is None else advantages[i]
        ret = None if returns is None else returns[i]
        for name, values in (("advantages", adv), ("returns", ret)):
            if values is not None and len(values) < c:
                raise ValueError(
                    f"trajectory {i} (example {traj.example_id}): {len(values)} {name} "
                    f"for {c} completion tokens"
                )
        rows.append((traj, adv, ret))
    return rows


def _fill(
    token: dict[str, Tensor],
    row: int,
    where: slice,
    traj: Trajectory,
    adv: Sequence[float] | None,
    ret: Sequence[float] | None,
) -> None:
    c = len(traj.completion_ids)
    token["loss_mask"][row, where] = torch.tensor(traj.loss_mask, dtype=torch.float32)
    token["logprobs"][row, where] = torch.tensor(traj.logprobs, dtype=torch.float32)
    if adv is not None:
        token["advantages"][row, where] = torch.as_tensor(adv[:c], dtype=torch.float32)
    if ret is not None:
        token["returns"][row, where] = torch.as_tensor(ret[:c], dtype=torch.float32)
    if traj.span_temperatures:  # each span's tokens at the temperature they were sampled at
        base = where.start
        for (start, end), temperature in zip(traj.spans, traj.span_temperatures, strict=True):
            token["temperatures"][row, base + start : base + end] = temperature


def _metadata(trajectories: Sequence[Trajectory]) -> dict[str, Tensor]:
    def column(values: list[float] | list[int], dtype: torch.dtype) -> Tensor:
        return torch.tensor(values, dtype=dtype)

    ts = trajectories
    return {
        "prompt_lengths": column([len(t.prompt_ids) for t in ts], torch.long),
        "completion_lengths": column([len(t.completion_ids) for t in ts], torch.long),
        "group_ids": column([t.group_id for t in ts], torch.long),
        "example_ids": column([t.example_id for t in ts], torch.long),
        "policy_versions": column([t.policy_version for t in ts], torch.long),
        "rewards": column([float(t.reward) for t in ts], torch.float32),
    }
