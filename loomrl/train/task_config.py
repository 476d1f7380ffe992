"""One task of a multi-task training run (``[train.tasks.NAME]``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from loomrl.config import TURN_DISCOUNT, TURN_REWARD
from loomrl.data import DataConfig
from loomrl.episode.turn_rewards import TurnReward
from loomrl.rewards.config import RewardConfig


class TaskConfig(BaseModel):
    """One task of a multi-task run: its environment, the environment's arguments, its
    data (if any) and its share."""

    model_config = ConfigDict(extra="forbid")

    weight: float = Field(1.0, gt=0, allow_inf_nan=False, description="share of each step's groups")
    env: str | None = Field(
        None, description="environment name (default: the task's name); two tasks may share one"
    )
    env_args: dict[str, Any] = Field(default_factory=dict, description="environment kwargs")
    data: DataConfig | None = Field(
        None, description="examples from a data file (cycled in epochs) instead of the env's"
    )
    turn_reward: TurnReward | None = TURN_REWARD
    turn_discount: float | None = TURN_DISCOUNT
    reward: RewardConfig | None = Field(
        None, description="the task's reward in place of its env's score (default: [train]'s)"
    )
