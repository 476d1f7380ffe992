"""loomrl: token-exact experience for reinforcement-learning post-training of LLMs.

``loomrl.rollout`` is the async rollout function (its implementation lives in the
``loomrl.rollout`` package, over the producer: ``loomrl.rollout.rollouts``).
"""

from loomrl.envs import Environment, EnvState, EnvStep, ToolEnv
from loomrl.rollout import RolloutMetrics, Rollouts, rollout, rollout_sync
from loomrl.types import Completion, SamplingParams, Status, Trajectory

__all__ = [
    "Completion",
    "EnvState",
    "EnvStep",
    "Environment",
    "RolloutMetrics",
    "Rollouts",
    "SamplingParams",
    "Status",
    "ToolEnv",
    "Trajectory",
    "rollout",
    "rollout_sync",
]
__version__ = "0.1.0"
