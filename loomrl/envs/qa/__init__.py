"""``qa``: a general question-answering environment over data (``QAEnv``), with verifiable
rewards chosen by name (``math_verify``, ``exact``, ``regex``, ``choice``), a format
bonus, and an optional multi-turn retry loop (``max_attempts``)."""

from __future__ import annotations

from loomrl.envs.qa.env import QAEnv
from loomrl.envs.qa.prompts import REWARDS

__all__ = ["REWARDS", "QAEnv"]
