"""A run's examples: from its data (``DataConfig``), or from the environment's generator.

``draw`` is what ``loomrl rollout`` and ``loomrl train`` call for each task: rollout
takes the data's rows (capped at ``count`` when given), training cycles them in epochs
up to its pool size (``Epochs``). An environment that generates no examples (its
``dataset`` raises ``TypeError``) and has no data is refused, naming what to set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loomrl.data.config import DataConfig
from loomrl.data.epochs import Epochs
from loomrl.data.errors import DataError
from loomrl.data.record import Fingerprint

if TYPE_CHECKING:  # the data layer sits below the environments
    from loomrl.envs.base import Environment


class NeedsData(DataError):
    """An environment that generates no examples was given no data."""


@dataclass(frozen=True, slots=True)
class Drawn:
    """A task's examples and, when they come from data, the fingerprint of its rows."""

    examples: Sequence[dict[str, Any]]
    fingerprint: Fingerprint | None = None


def draw(
    env_name: str,
    env: Environment,
    data: DataConfig | None,
    count: int,
    seed: int,
    *,
    cycle: bool,
    needs: str,
) -> Drawn:
    """``count`` examples of ``env`` (generated with ``seed``), or of ``data``: its first
    ``count`` rows (reading stops there unless shuffled), or with ``cycle`` exactly
    ``count`` examples drawn from all its rows in epochs. ``needs`` says how to give
    data, for the error when the env cannot generate examples."""
    if data is None:
        try:
            examples = env.dataset(count, seed=seed)
        except TypeError as exc:
            raise NeedsData(
                f"environment {env_name!r} needs {needs} (it generates no examples of its own)"
            ) from exc
        return Drawn(examples)
    if cycle:
        rows = data.load(seed)
        return Drawn(
            Epochs(rows, count, shuffle=data.shuffle, seed=seed), Fingerprint.of(data.path, rows)
        )
    rows = data.model_copy(update={"limit": min(data.limit or count, count)}).load(seed)
    return Drawn(rows, Fingerprint.of(data.path, rows))
