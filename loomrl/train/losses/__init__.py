"""Policy losses, registered by name: ``pg`` (token-level clipped PG), ``gspo``, ``cpgd``,
``cispo``; ``compute(name, ...)`` is the one way in. Each loss module states its paper's
equation; every loss is ``Σ_t w_t ℓ_t`` over aggregation weights from ``token_weights``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import Tensor

from loomrl.train.losses.aggregation import AGGREGATIONS, Aggregation, token_weights
from loomrl.train.losses.base import LossParts
from loomrl.train.losses.cispo import cispo_loss
from loomrl.train.losses.cpgd import cpgd_loss
from loomrl.train.losses.gspo import gspo_loss
from loomrl.train.losses.pg import policy_loss

LossFn = Callable[..., LossParts]
LOSSES: dict[str, LossFn] = {
    "pg": policy_loss,
    "gspo": gspo_loss,
    "cpgd": cpgd_loss,
    "cispo": cispo_loss,
}


def compute(
    name: str, logp: Tensor, old: Tensor, advantages: Tensor, weights: Tensor, **inputs: Any
) -> LossParts:
    """The loss registered as ``name``; of the keyword ``inputs`` (``owner``,
    ``num_samples``, clip ranges, ``drift_coef``, ``sampler``, ``is_cap``, ``ref``,
    ``kl_coef``) it gets those it takes.
    Unknown ``name`` → ``ValueError`` naming the known ones."""
    fn = LOSSES.get(name)
    if fn is None:
        raise ValueError(f"unknown loss {name!r}; known: {sorted(LOSSES)}")
    taken = inspect.signature(fn).parameters
    return fn(logp, old, advantages, weights, **{k: v for k, v in inputs.items() if k in taken})


__all__ = [
    "AGGREGATIONS",
    "LOSSES",
    "Aggregation",
    "LossParts",
    "cispo_loss",
    "compute",
    "cpgd_loss",
    "gspo_loss",
    "policy_loss",
    "token_weights",
]
