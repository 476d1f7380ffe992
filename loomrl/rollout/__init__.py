"""Multi-turn rollouts: ``rollout()`` over the producer, its result type and metrics.

The turn loop, pacing and scoring live in ``loomrl.episode``; the scheduling loop is the
producer's (``loomrl.producer``).
"""

from loomrl.episode.metrics import RolloutMetrics
from loomrl.episode.turn_loop import PromptTooLong
from loomrl.rollout.rollouts import Rollouts, rollout, rollout_sync

__all__ = ["PromptTooLong", "RolloutMetrics", "Rollouts", "rollout", "rollout_sync"]
