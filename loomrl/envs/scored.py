"""An environment scored by a reward ``Scorer`` instead of its own ``score``: ``RubricEnv``,
``sample_of`` (a finished episode as a ``RewardSample``) and ``with_reward`` (a run's
``reward = ...`` config applied to an environment).

The rewards sit below the environments (they never import them); this module is where
the two meet. ``with_reward`` builds the config's sources (a reward model is loaded, a
judge's engine opened) and ``close_rewards`` closes what they opened when the run ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from loomrl.envs.base import Environment, EnvState
from loomrl.rewards.base import RewardSample, Scorer
from loomrl.rewards.build import BuiltReward, JudgeEngineMaker, build_reward, check_reward
from loomrl.rewards.config import RewardConfig


def sample_of(state: EnvState, label: str = "default") -> RewardSample:
    """The episode's last assistant reply as the completion (``""`` if there is none).

    Messages after that reply (an environment's closing record) are not part of the
    sample's conversation; they stay reachable through ``state``.
    """
    last = max(
        (i for i, m in enumerate(state.messages) if m.get("role") == "assistant"),
        default=len(state.messages),
    )
    before = state.messages[:last]
    completion = state.messages[last].get("content") if last < len(state.messages) else ""
    prompt = next((m.get("content") for m in reversed(before) if m.get("role") == "user"), "")
    return RewardSample(
        prompt=str(prompt or ""),
        completion=str(completion or ""),
        example=state.example,
        messages=tuple(before),
        label=label,
        state=state,
    )


async def score_state(scorer: Scorer, state: EnvState, label: str = "default") -> dict[str, float]:
    """Weighted components of a finished episode: what ``Environment.score`` returns."""
    return (await scorer.score(sample_of(state, label))).components


class RubricEnv(Environment):
    """``env`` with its ``score`` replaced by a ``Scorer`` (a ``Rubric`` or a ``Recipe``).

    ``reset``, ``step``, ``record_turn``, ``cleanup`` and ``dataset`` are the wrapped
    environment's own (bound as they are, sync or async; ``use_chat_template`` too), and
    so are its turn-reward and observation settings. Scores are the scorer's weighted
    ``components``; metrics and the
    whole ``RewardScore`` are left in ``state.data["reward_metrics"]`` and
    ``state.data["reward_score"]``. ``label`` is a string or a function of the example.
    Groups are scored at once through ``score_many`` (one batch per reward source).
    ``built`` is the ``BuiltReward`` the scorer came from, closed by ``aclose``.
    """

    def __init__(
        self,
        env: Environment,
        scorer: Scorer,
        *,
        label: str | Callable[[Mapping[str, Any]], str] = "default",
        built: BuiltReward | None = None,
    ) -> None:
        if not isinstance(scorer, Scorer):
            raise TypeError(f"RubricEnv needs a Rubric or Recipe, got {type(scorer).__name__}")
        self.env, self.scorer, self.label, self.built = env, scorer, label, built
        self.name, self.max_turns = env.name, env.max_turns
        self.system_prompt, self.nonblocking = env.system_prompt, env.nonblocking
        self.turn_reward, self.turn_discount = env.turn_reward, env.turn_discount
        self.max_obs_tokens = env.max_obs_tokens
        self.thread_safe = True  # scoring is async; the scorer runs its own functions
        self.reset = env.reset  # type: ignore[method-assign]
        self.step = env.step  # type: ignore[method-assign]
        self.record_turn = env.record_turn  # type: ignore[method-assign]
        self.cleanup = env.cleanup  # type: ignore[method-assign]
        self.dataset = env.dataset  # type: ignore[method-assign]
        self.run_info = env.run_info  # type: ignore[method-assign]
        self.use_chat_template = env.use_chat_template  # type: ignore[method-assign]
        # Checkpoints store the wrapped environment's state in its own terms.
        self.state_dict = env.state_dict  # type: ignore[method-assign]
        self.load_state_dict = env.load_state_dict  # type: ignore[method-assign]

    async def score(self, state: EnvState) -> dict[str, float]:
        (components,) = await self.score_many([state])
        return components

    async def score_many(self, states: Sequence[EnvState]) -> list[dict[str, float]]:
        samples = [sample_of(s, self._label(s.example)) for s in states]
        results = await self.scorer.score_many(samples)
        for state, result in zip(states, results, strict=True):
            state.data["reward_metrics"] = result.metrics
            state.data["reward_score"] = result
        return [r.components for r in results]

    async def aclose(self) -> None:
        """Close what the reward opened (a judge's engine); the env itself is the run's."""
        if self.built is not None:
            await self.built.close()

    def _label(self, example: Mapping[str, Any]) -> str:
        return self.label(example) if callable(self.label) else self.label

    def __getattr__(self, name: str) -> Any:
        # Anything else the wrapped env offers (an env actor pool's metrics, pids, close).
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def __repr__(self) -> str:
        return f"RubricEnv({self.env.name}, {self.scorer!r})"


def with_reward(
    env: Environment,
    config: RewardConfig | None,
    *,
    judge_engine: JudgeEngineMaker | None = None,
) -> Environment:
    """``env`` scored by the run's reward ``config`` (``env`` itself when it is None)."""
    if config is None:
        return env
    built = build_reward(config, judge_engine=judge_engine)
    return RubricEnv(env, built.scorer, built=built)


async def close_rewards(envs: Iterable[Environment]) -> None:
    """Close what the run's ``envs`` hold for the run: the reward sources ``with_reward``
    opened (a judge's engine) and each environment's own (``Environment.aclose``: a tool
    server it started)."""
    for env in envs:
        if isinstance(env, RubricEnv):
            await env.aclose()
            env = env.env
        own = getattr(env, "aclose", None)  # env actor pools and other wrappers may lack it
        if own is not None:
            await own()


def check_rewards(rewards: Mapping[str, RewardConfig | None]) -> None:
    """``check_reward`` for each ``where -> config`` given (None: the env's own score),
    before any engine starts; a one-line ``ValueError`` naming the key."""
    for where, config in rewards.items():
        if config is not None:
            check_reward(config, where)
