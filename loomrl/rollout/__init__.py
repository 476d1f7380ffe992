"""Multi-turn rollouts: the turn loop, the continuous scheduler and its metrics."""

from loomrl.rollout.metrics import RolloutMetrics
from loomrl.rollout.scheduler import Rollouts, rollout, rollout_sync
from loomrl.rollout.turn_loop import PromptTooLong

__all__ = ["PromptTooLong", "RolloutMetrics", "Rollouts", "rollout", "rollout_sync"]
