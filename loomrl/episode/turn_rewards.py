"""How per-turn rewards (``EnvStep.reward``) and the episode's final score make one reward.

An environment chooses with its ``turn_reward`` attribute (a run may override it):

- ``final``: the final score alone (per-turn rewards are recorded, not counted);
- ``sum``: the sum of the per-turn rewards alone (the final score is not counted);
- ``final+sum``: the final score plus the sum of the per-turn rewards;
- ``discounted``: the return from the first turn, ``Σ_t γ^t r_t + γ^(T-1) · final``, with
  the final score arriving with the last of the ``T`` turn rewards (``γ = turn_discount``).

A turn with no reward (``None``) counts 0. The parts stay visible as reward components:
the final score's own components (or ``final`` for a plain number), scaled by
``γ^(T-1)`` under ``discounted``, and ``turns`` for the per-turn part; the reward is the
sum of the components it keeps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol, TypeVar, get_args

TurnReward = Literal["final", "sum", "final+sum", "discounted"]
MODES: tuple[str, ...] = get_args(TurnReward)
TURNS = "turns"  # the component holding the per-turn part


def check_mode(mode: str, discount: float) -> None:
    """Raise ``ValueError`` for an unknown mode or a discount outside ``[0, 1]``."""
    if mode not in MODES:
        raise ValueError(f"turn_reward {mode!r} is not one of {', '.join(MODES)}")
    if not 0.0 <= discount <= 1.0 or math.isnan(discount):
        raise ValueError(f"turn_discount must lie in [0, 1], got {discount}")


def combine(
    mode: str,
    final: float,
    components: Mapping[str, float],
    turn_rewards: Sequence[float | None],
    discount: float = 1.0,
) -> tuple[float, dict[str, float]]:
    """``(reward, components)`` of one episode under ``mode`` (see the module docstring).

    ``components`` are the final score's (empty when it was a plain number); ``final``
    is their sum. Under ``final`` the inputs come back unchanged."""
    check_mode(mode, discount)
    if mode == "final":
        return final, dict(components)
    parts = dict(components) if components else {"final": final}
    if TURNS in parts:
        raise ValueError(
            f"the score has a component named {TURNS!r}, which turn_reward={mode!r} "
            "uses for the per-turn rewards; rename it"
        )
    rewards = [0.0 if r is None else r for r in turn_rewards]
    if mode == "discounted":
        turns = math.fsum(discount**t * r for t, r in enumerate(rewards))
        scale = discount ** max(len(rewards) - 1, 0)
        parts = {name: scale * value for name, value in parts.items()}
    else:
        turns = math.fsum(rewards)
    if mode == "sum":
        parts = {}
    parts[TURNS] = turns
    return math.fsum(parts.values()), parts


class _Counting(Protocol):
    turn_reward: str
    turn_discount: float


class _Override(Protocol):
    turn_reward: str | None
    turn_discount: float | None


E = TypeVar("E", bound=_Counting)


def counting_turns(env: E, config: _Override) -> E:
    """``env`` with a run's ``turn_reward`` / ``turn_discount`` (when set) in place of its
    own: a config overrides how an environment's per-turn rewards count."""
    if config.turn_reward is not None:
        env.turn_reward = config.turn_reward
    if config.turn_discount is not None:
        env.turn_discount = config.turn_discount
    check_mode(env.turn_reward, env.turn_discount)
    return env
