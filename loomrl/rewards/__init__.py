"""Rewards: per-sample functions combined by a ``Rubric``, batch ``RewardSource``s (local
reward models, remote HTTP servers, LLM judges), and ``Recipe``s that route each sample to
the sources its label needs.

Everything scores ``RewardSample`` records. A ``RewardSource`` is ``await src(samples) ->
list[float]``; a ``Scorer`` (``Rubric``, ``Recipe``) returns a ``RewardScore`` per sample
(raw values, weights, weighted ``components`` summing to ``total``, weight-0 ``metrics``)
and is a source itself. ``loomrl.envs.scored.RubricEnv(env, scorer)`` makes a scorer an
environment's ``score``; ``loomrl.rewards.config.RewardConfig`` (``reward = ...`` in a
run's config) names functions, a rubric, a reward model, a remote server and a judge, and
``loomrl.rewards.build.build_reward`` turns it into one weighted ``Recipe``. Importing this
package imports neither torch nor transformers (a ``RewardModel`` does when it is built).
"""

from __future__ import annotations

from loomrl.rewards.base import (
    PerSample,
    RewardError,
    RewardFn,
    RewardSample,
    RewardScore,
    RewardSource,
    Scorer,
    per_sample,
)
from loomrl.rewards.funcs import (
    answer_format,
    choice,
    exact,
    length_penalty,
    math_verify,
    num_chars,
    regex,
)
from loomrl.rewards.judge import Judge, JudgeParseError, Verdict
from loomrl.rewards.model import RewardModel
from loomrl.rewards.recipe import Recipe
from loomrl.rewards.registry import available, load, register
from loomrl.rewards.remote import RemoteReward, RemoteRewardError
from loomrl.rewards.rubric import Rubric

__all__ = [
    "Judge",
    "JudgeParseError",
    "PerSample",
    "Recipe",
    "RemoteReward",
    "RemoteRewardError",
    "RewardError",
    "RewardFn",
    "RewardModel",
    "RewardSample",
    "RewardScore",
    "RewardSource",
    "Rubric",
    "Scorer",
    "Verdict",
    "answer_format",
    "available",
    "choice",
    "exact",
    "length_penalty",
    "load",
    "math_verify",
    "num_chars",
    "per_sample",
    "regex",
    "register",
]
