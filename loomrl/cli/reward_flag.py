"""``--reward NAME`` (rollout, train, eval): the reward by name.

An environment that chooses its reward by name (one that takes a ``reward`` argument,
like ``qa``) gets it as that argument (``env_args.reward = NAME``), so its prompt asks
for the matching answer form; any other environment is scored by the reward function
``NAME`` in place of its own score (``reward = "NAME"``: ``loomrl.rewards.funcs``).
"""

from __future__ import annotations

from typing import Any

from loomrl.rewards.config import RewardConfig


def takes_reward(env: str) -> bool:
    """Whether the environment ``env`` has a ``reward`` argument (an unknown name counts
    as yes: loading it then says it is unknown)."""
    from loomrl.envs.registry import check_args

    try:
        check_args(env, {"reward": None})
    except (TypeError, ValueError) as exc:
        return "has no argument" not in str(exc)
    return True


def with_reward_flag(
    env: str, env_args: dict[str, Any], reward: RewardConfig | None, name: str | None
) -> tuple[dict[str, Any], RewardConfig | None]:
    """``(env_args, reward)`` with ``--reward name`` applied (module rules)."""
    if name is None:
        return env_args, reward
    if takes_reward(env):
        return {**env_args, "reward": name}, reward
    return env_args, RewardConfig.model_validate(name)
