"""Target logprobs (and entropy) straight from the last hidden states, a chunk of rows at
a time, recomputed in backward: the full-vocabulary logits never exist at once, and
autograd keeps only the hidden states, not a float32 copy of every chunk.

For a vocabulary of 150k, the logits of 16k positions are 4.9 GB in bf16 and twice that
as the float32 chunks a plain ``log_softmax`` keeps for its backward; here a step holds
one chunk's logits (``rows × V``) at a time, forward and backward alike. The numerics are
those of the model's own head: the matmul in the autocast dtype (or the weights'), the
logits rounded to it as ``lm_head`` returns them, then float32 from there on.

``score_targets`` does the same from logits a model already made (a head it cannot be
bypassed around): there it saves the logits and recomputes the float32 part.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from loomrl.experience.truncation import NONE, Truncation

CHUNK_ROWS = 1024


class _Settings(NamedTuple):
    """What every chunk is computed with (the tensors travel beside it)."""

    temperature: float  # one for all rows (1.0 when each row has its own)
    entropy: bool
    truncation: Truncation
    chunk_rows: int
    dtype: torch.dtype  # of the head's matmul


def score_hidden(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    scale: float | Tensor = 1.0,
    *,
    entropy: bool = False,
    entropy_grad: bool = False,
    truncation: Truncation = NONE,
    chunk_rows: int = CHUNK_ROWS,
) -> tuple[Tensor, Tensor | None]:
    """``[r]`` float32 ``log softmax(truncated(hidden @ weight.T / T))[target]`` for
    ``hidden [r, H]``, ``weight [V, H]`` (the LM head), ``targets [r]``, ``scale`` the
    temperature (one, or ``[r]``); with ``entropy``, also the ``[r]`` entropy of each row's
    distribution (with autograd only when ``entropy_grad``)."""
    dtype = _compute_dtype(hidden, weight)
    return _apply(
        hidden, weight, targets, scale, entropy, entropy_grad, truncation, chunk_rows, dtype
    )


def score_targets(
    logits: Tensor,
    targets: Tensor,
    scale: float | Tensor = 1.0,
    *,
    entropy: bool = False,
    entropy_grad: bool = False,
    truncation: Truncation = NONE,
    chunk_rows: int = CHUNK_ROWS,
) -> tuple[Tensor, Tensor | None]:
    """``score_hidden`` for logits ``[r, V]`` the model computed itself."""
    return _apply(
        logits, None, targets, scale, entropy, entropy_grad, truncation, chunk_rows, logits.dtype
    )


def _apply(
    rows: Tensor, weight: Tensor | None, targets: Tensor, scale: float | Tensor, entropy: bool,
    entropy_grad: bool, truncation: Truncation, chunk_rows: int, dtype: torch.dtype,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    per_row = scale.reshape(-1, 1).float() if isinstance(scale, Tensor) else None
    temperature = float(scale) if per_row is None else 1.0
    settings = _Settings(temperature, entropy, truncation, chunk_rows, dtype)
    logp, spread = _Scores.apply(rows, weight, targets, per_row, settings)
    if not entropy:
        return logp, None
    return logp, (spread if entropy_grad and torch.is_grad_enabled() else spread.detach())


def _compute_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype ``F.linear`` would compute the head in: autocast's, else the weights'."""
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return weight.dtype


def _chunk(
    rows: Tensor, weight: Tensor | None, targets: Tensor, per_row: Tensor | None,
    settings: _Settings, start: int,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """One chunk's float32 logits (scaled, truncated; a fresh tensor, free to overwrite)
    and its targets; ``weight`` is already in the compute dtype."""
    temperature, truncation = settings.temperature, settings.truncation
    end = start + settings.chunk_rows
    if weight is None:
        z = rows[start:end].to(torch.float32, copy=True)
    else:  # the head in its own numerics: logits rounded to its dtype, as lm_head returns
        z = torch.matmul(rows[start:end], weight.t()).float()
    if per_row is not None:
        z.div_(per_row[start:end])
    elif temperature != 1.0:
        z.div_(temperature)
    chunk_targets = targets[start:end]
    return truncation.apply(z, chunk_targets), chunk_targets


def _safe_log(logq: Tensor, p: Tensor, truncation: Truncation) -> Tensor:
    """``logq`` with 0 where the sampler cut (p = 0, log p = -inf), in place."""
    return logq.masked_fill_(p == 0, 0.0) if truncation.active else logq


class _Scores(torch.autograd.Function):
    """Chunked target logprobs and entropies, recomputing each chunk's softmax in backward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, rows: Tensor, weight: Tensor | None, targets: Tensor,
        per_row: Tensor | None, settings: _Settings,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        entropy, truncation, size = settings.entropy, settings.truncation, settings.chunk_rows
        n = rows.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=rows.device)
        norms = torch.empty(n, dtype=torch.float32, device=rows.device)
        spread = torch.empty(n if entropy else 0, dtype=torch.float32, device=rows.device)
        w = None if weight is None else weight.to(settings.dtype)  # cast once, not per chunk
        h = rows if w is None else rows.to(settings.dtype)
        for start in range(0, n, size):
            end = start + size
            z, chunk_targets = _chunk(h, w, targets, per_row, settings, start)
            norm = torch.logsumexp(z, dim=1)
            norms[start:end] = norm
            logp[start:end] = z.gather(1, chunk_targets[:, None])[:, 0] - norm
            if entropy:
                logq = z.sub_(norm[:, None])
                p = logq.exp()
                spread[start:end] = -(p * _safe_log(logq, p, truncation)).sum(dim=1)
        ctx.settings = settings
        ctx.save_for_backward(rows, weight, targets, per_row, norms)
        ctx.set_materialize_grads(False)
        return logp, spread

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_logp: Tensor | None, grad_spread: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        rows, weight, targets, per_row, norms = ctx.saved_tensors
        temperature, entropy, truncation, size, dtype = ctx.settings
        grad_spread = grad_spread if entropy else None
        want_rows, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_rows = torch.empty_like(rows) if want_rows else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            if want_weight
            else None
        )
        if grad_logp is None and grad_spread is None:
            nothing = None if grad_rows is None else grad_rows.zero_()
            return nothing, grad_weight, None, None, None
        w = None if weight is None else weight.to(dtype)
        h = rows if w is None else rows.to(dtype)
        for start in range(0, rows.shape[0], size):
            end = start + size
            z, chunk_targets = _chunk(h, w, targets, per_row, ctx.settings, start)
            logq = z.sub_(norms[start:end, None])
            p = logq.exp()
            g = None if grad_logp is None else grad_logp[start:end, None]
            if grad_spread is None:  # d log p_y / dz = onehot(y) - p
                d = p.mul_(-g)  # type: ignore[operator]
            else:  # dH / dz = -p (log p + H)
                safe = _safe_log(logq, p, truncation)
                spread = -(p * safe).sum(dim=1, keepdim=True)
                coef = safe.add_(spread).mul_(grad_spread[start:end, None])
                d = p.mul_(coef if g is None else coef.add_(g)).neg_()
            if g is not None:
                d.scatter_add_(1, chunk_targets[:, None], g)
            if per_row is not None:
                d.div_(per_row[start:end])
            elif temperature != 1.0:
                d.div_(temperature)
            if w is None:
                grad_rows[start:end] = d  # type: ignore[index]
                continue
            d = d.to(dtype)
            if grad_rows is not None:
                grad_rows[start:end] = torch.matmul(d, w)
            if grad_weight is not None:
                grad_weight.add_(torch.matmul(d.t(), h[start:end]))
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_rows, grad_weight, None, None, None
