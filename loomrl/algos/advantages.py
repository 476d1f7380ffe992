"""Advantage estimators, registered by name; ``compute(name, **inputs)`` is the one way in.

Shapes: ``B`` sequences, ``T`` token positions. ``rewards [B]`` are sequence rewards,
``group_ids [B]`` int64 ids of the prompt each sample answers (groups of any sizes, in any
order), ``mask [B, T]`` the loss mask (1 on model tokens). Every estimator returns an
``AdvantageOutput`` of token-level ``advantages [B, T]`` and ``returns [B, T]``, both 0
wherever the mask is 0. ``compute`` runs estimators under ``torch.no_grad``.

Built-ins and where they depart from the papers or the reference implementations:

- ``grpo`` (DeepSeekMath, Shao et al. 2024): ``A_i = (r_i - mean_g) / (std_g + eps)``.
  The paper does not say which std; loomrl uses the *unbiased* (Bessel) std by default,
  as verl (``torch.std``) and TRL (``Tensor.std``) both do, with ``unbiased=False`` for
  the population std. ``eps`` defaults to verl's 1e-6 (TRL adds 1e-4). ``scale``:
  ``"group"`` (std of the group), ``"batch"`` (std of all B rewards, TRL's
  ``scale_rewards="batch"``; the baseline stays the group mean), ``"none"`` (Dr. GRPO's
  advantage, Liu et al. 2025 — its length-normalisation fix belongs to the loss, not here).
  A group of one gets advantage 0 (verl uses mean 0, std 1 there, i.e. ``A = r``).
- ``rloo`` (Ahmadian et al. 2024): ``A_i = r_i - mean_{j≠i} r_j``; a group of one gets 0
  (verl keeps ``r`` or asserts ``n > 1``).
- ``reinforce_pp`` (REINFORCE++, Hu 2025): token rewards ``-kl_coef · kl`` plus ``r`` on
  the last model token, reward-to-go ``G_t`` over model tokens with ``gamma``, then one
  global whitening over all mask-1 tokens of the batch. ``returns`` are the un-whitened
  ``G_t``. Multi-turn: mask-0 tokens are skipped by the recursion (see
  ``loomrl.algos.returns``); verl resets the running return at every mask-0 token, which
  would cut the outcome reward off from earlier turns; OpenRLHF discounts across mask-0
  positions (identical to loomrl when ``gamma = 1``). Whitening is unbiased (verl);
  OpenRLHF's is biased — ``unbiased=False``.
- ``reinforce_pp_baseline``: as OpenRLHF's ``reinforce_baseline``: the group mean is
  subtracted from the sequence reward first (group of one → 0), then KL tokens, returns
  and whitening exactly as ``reinforce_pp``. (verl's ``reinforce_plus_plus_baseline``
  subtracts the group mean of the *summed token rewards* and skips the reward-to-go.)
- ``gae`` (Schulman et al. 2016): token-level GAE over model tokens only; environment
  tokens get advantage 0 and do not break the recursion — the next model token's value
  bootstraps across them, exactly as verl's multi-turn ``compute_gae_advantage_return``
  (which leaves carried values, not 0, at mask-0 positions). Not whitened (verl and
  OpenRLHF whiten GAE advantages): compose with ``loomrl.algos.shaping.whiten``.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from loomrl.algos.kl import kl_penalty_in_reward
from loomrl.algos.returns import discounted_returns
from loomrl.algos.returns import gae as gae_recursion
from loomrl.algos.shaping import whiten
from loomrl.algos.stats import as_bool_mask, group_stats, last_token_mask


@dataclass(frozen=True, slots=True)
class AdvantageOutput:
    """Token-level ``advantages [B, T]`` and ``returns [B, T]`` (0 where the mask is 0)."""

    advantages: Tensor
    returns: Tensor


Estimator = Callable[..., AdvantageOutput]
_ESTIMATORS: dict[str, Estimator] = {}


def register(name: str, *, replace: bool = False) -> Callable[[Estimator], Estimator]:
    """Decorator: make ``compute(name, **inputs)`` call the decorated function.

    The function takes keyword inputs (tensors and options) and returns an
    ``AdvantageOutput``; its docstring's first line is its description in ``available()``.
    A taken name needs ``replace=True``.
    """
    if not name or name != name.strip():
        raise ValueError(f"invalid estimator name {name!r}")

    def decorator(fn: Estimator) -> Estimator:
        if name in _ESTIMATORS and not replace:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        _ESTIMATORS[name] = fn
        return fn

    return decorator


def _lookup(name: str) -> Estimator:
    fn = _ESTIMATORS.get(name)
    if fn is None:
        raise ValueError(
            f"unknown advantage estimator {name!r}; known: {', '.join(sorted(_ESTIMATORS))}"
        )
    return fn


def accepted_inputs(name: str) -> tuple[str, ...]:
    """The keyword inputs estimator ``name`` accepts (to pick them from a batch)."""
    return tuple(inspect.signature(_lookup(name)).parameters)


def option_hints(name: str) -> dict[str, Any]:
    """Resolved type hints of estimator ``name``'s parameters ({} if they do not resolve),
    to check options against before a run."""
    try:
        return typing.get_type_hints(_lookup(name))
    except Exception:  # unresolvable hints only mean that nothing is checked
        return {}


def required_inputs(name: str) -> tuple[str, ...]:
    """The keyword inputs estimator ``name`` cannot run without (no default)."""
    params = inspect.signature(_lookup(name)).parameters.values()
    return tuple(p.name for p in params if p.default is inspect.Parameter.empty)


def compute(name: str, **inputs: Any) -> AdvantageOutput:
    """Run the estimator registered as ``name`` on keyword ``inputs`` (no autograd).

    Unknown ``name`` → ``ValueError`` listing the registered names; an input the estimator
    does not accept → ``TypeError`` listing the ones it does (see ``accepted_inputs``).
    """
    fn = _lookup(name)
    accepted = inspect.signature(fn).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        unexpected = sorted(set(inputs) - set(accepted))
        if unexpected:
            raise TypeError(
                f"estimator {name!r} got unexpected inputs {unexpected}; "
                f"it accepts {list(accepted)}"
            )
    with torch.no_grad():
        out = fn(**inputs)
    if not isinstance(out, AdvantageOutput):
        raise TypeError(f"estimator {name!r} returned {type(out).__name__}, not AdvantageOutput")
    if out.advantages.shape != out.returns.shape:
        raise ValueError(
            f"estimator {name!r} returned advantages {tuple(out.advantages.shape)} "
            f"but returns {tuple(out.returns.shape)}"
        )
    return out


def available() -> dict[str, str]:
    """``{name: one-line description}`` of every registered estimator, sorted by name."""
    return {
        name: (inspect.getdoc(_ESTIMATORS[name]) or "").split("\n")[0]
        for name in sorted(_ESTIMATORS)
    }


# --------------------------------------------------------------------------- helpers


def _float(x: Tensor) -> Tensor:
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def _check_batch(rewards: Tensor, mask: Tensor, group_ids: Tensor | None = None) -> None:
    if rewards.dim() != 1 or mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"expected rewards [B] and mask [B, T], got {tuple(rewards.shape)} "
            f"and {tuple(mask.shape)}"
        )
    if group_ids is not None and group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids {tuple(group_ids.shape)} must be [B] like rewards")


def _broadcast(per_sequence: Tensor, mask: Tensor) -> Tensor:
    """``[B]`` → ``[B, T]``: the value on every mask-1 token, 0 elsewhere."""
    m = as_bool_mask(mask)
    return torch.where(m, per_sequence.unsqueeze(1), 0.0)


# ------------------------------------------------------------------------ estimators


@register("grpo")
def grpo(
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    scale: Literal["group", "batch", "none"] = "group",
    unbiased: bool = True,
    eps: float = 1e-6,
) -> AdvantageOutput:
    """GRPO: reward minus group mean, over the group / batch std or unscaled (Dr. GRPO).

    ``A_i = (r_i - mean_{g(i)}) / (s_i + eps)`` with ``s_i = std_{g(i)}`` (``"group"``),
    ``std(r_1..r_B)`` (``"batch"``) or ``s_i + eps = 1`` (``"none"``); broadcast to
    ``[B, T]`` on mask-1 tokens. ``returns`` = ``advantages``. Inputs: ``rewards [B]``,
    ``group_ids [B]``, ``mask [B, T]``.
    """
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    if not 0 <= eps < math.inf:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    _check_batch(rewards, mask, group_ids)
    r = _float(rewards)
    stats = group_stats(r, group_ids, unbiased=unbiased)  # fields [B]
    centred = r - stats.mean  # [B]
    if scale == "group":
        centred = centred / (stats.std + eps)
    elif scale == "batch":
        batch = group_stats(r, torch.zeros_like(group_ids), unbiased=unbiased)
        centred = centred / (batch.std + eps)
    adv = _broadcast(centred, mask)  # [B, T]
    return AdvantageOutput(adv, adv)


@register("rloo")
def rloo(rewards: Tensor, group_ids: Tensor, mask: Tensor) -> AdvantageOutput:
    """RLOO: reward minus the mean of the other members of its group (0 for a group of one).

    ``A_i = r_i - (Σ_{j∈g} r_j - r_i) / (n_g - 1)`` for ``n_g > 1``, else 0; broadcast to
    ``[B, T]`` on mask-1 tokens. ``returns`` = ``advantages``.
    """
    _check_batch(rewards, mask, group_ids)
    r = _float(rewards)
    stats = group_stats(r, group_ids)
    others = (stats.size - 1).to(r.dtype)  # [B]
    baseline = (stats.total - r) / others.clamp(min=1)
    adv = torch.where(stats.size > 1, r - baseline, torch.zeros_like(r))  # [B]
    adv = _broadcast(adv, mask)
    return AdvantageOutput(adv, adv)


def _reinforce_pp(
    rewards: Tensor, mask: Tensor, kl: Tensor | None, kl_coef: float, gamma: float, unbiased: bool,
    token_rewards: Tensor | None = None,
) -> AdvantageOutput:  # fmt: skip
    m = as_bool_mask(mask)
    if kl is None and kl_coef != 0.0:
        raise ValueError(f"kl_coef={kl_coef} needs the per-token kl [B, T]")
    if kl is None:
        per_token = torch.where(last_token_mask(m), rewards.unsqueeze(1), 0.0)  # [B, T]
    else:
        per_token = kl_penalty_in_reward(rewards, kl, m, kl_coef)  # [B, T]
    if token_rewards is not None:
        if token_rewards.shape != m.shape:
            raise ValueError(
                f"token_rewards must be [B, T] like mask {tuple(m.shape)}, "
                f"got {tuple(token_rewards.shape)}"
            )
        per_token = per_token + _float(token_rewards).to(per_token.dtype)
    returns = discounted_returns(per_token, m, gamma)  # [B, T]
    return AdvantageOutput(whiten(returns, m, unbiased=unbiased), returns)


@register("reinforce_pp")
def reinforce_pp(
    rewards: Tensor,
    mask: Tensor,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    unbiased: bool = True,
    token_rewards: Tensor | None = None,
) -> AdvantageOutput:
    """REINFORCE++: reward-to-go of (outcome reward - kl_coef·kl), whitened over the batch.

    ``r_t = -kl_coef · kl_t + r · [t = last model token] + token_rewards_t``;
    ``G_t = r_t + gamma · G_{next model token}``; ``A = whiten(G)`` over all mask-1 tokens.
    Inputs: ``rewards [B]``, ``mask [B, T]``, optional per-token ``kl [B, T]`` and
    ``token_rewards [B, T]`` (e.g. turn rewards on their turns, ``turn_credit = "turn"``).
    ``returns`` = ``G`` (not whitened).
    """
    _check_batch(rewards, mask)
    return _reinforce_pp(_float(rewards), mask, kl, kl_coef, gamma, unbiased, token_rewards)


@register("reinforce_pp_baseline")
def reinforce_pp_baseline(
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    unbiased: bool = True,
) -> AdvantageOutput:
    """REINFORCE++-baseline: REINFORCE++ on rewards minus their group mean (OpenRLHF order).

    ``r'_i = r_i - mean_{g(i)}``, then exactly ``reinforce_pp`` on ``r'``.
    Inputs: ``rewards [B]``, ``group_ids [B]``, ``mask [B, T]``, optional ``kl [B, T]``.
    """
    _check_batch(rewards, mask, group_ids)
    r = _float(rewards)
    centred = r - group_stats(r, group_ids).mean  # [B]
    return _reinforce_pp(centred, mask, kl, kl_coef, gamma, unbiased)


@register("gae")
def gae(
    values: Tensor,
    mask: Tensor,
    rewards: Tensor | None = None,
    token_rewards: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> AdvantageOutput:
    """GAE over model tokens; environment (mask-0) tokens are skipped, not terminal.

    Token rewards are ``token_rewards [B, T]`` plus, if given, the sequence reward
    ``rewards [B]`` on each row's last mask-1 token (at least one of the two is needed;
    rewards at mask-0 positions are ignored). With ``next(t)`` the next mask-1 position::

        δ_t = r_t + gamma · V_{next(t)} - V_t,   A_t = δ_t + gamma · lam · A_{next(t)}

    (``V``, ``A`` = 0 after the last model token), ``returns = A + V`` on mask-1 tokens.
    ``values [B, T]``, ``mask [B, T]``. Batch-vectorised; a Python loop over ``T``.
    """
    if values.dim() != 2 or values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} differ")
    if rewards is None and token_rewards is None:
        raise ValueError("gae needs rewards [B], token_rewards [B, T], or both")
    v = _float(values)
    m = as_bool_mask(mask)
    r = torch.zeros_like(v) if token_rewards is None else _float(token_rewards).to(v.dtype)
    if rewards is not None:
        _check_batch(rewards, mask)
        outcome = torch.where(last_token_mask(m), rewards.to(v.dtype).unsqueeze(1), 0.0)
        r = r + outcome
    adv, returns = gae_recursion(r, v, m, gamma, lam)
    return AdvantageOutput(adv, returns)
