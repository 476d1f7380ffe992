"""Environments: the ``Environment`` contract, ``ToolEnv``, the registry, built-ins.

``load(name, **kw)`` builds a registered environment; ``available()`` lists them.
"""

from __future__ import annotations

from loomrl.envs.base import (
    Environment,
    EnvState,
    EnvStep,
    Message,
    Score,
    TurnLimits,
    advance,
    call,
    make_dataset,
    split_score,
)
from loomrl.envs.registry import available, load, register, register_family
from loomrl.envs.tools import ToolEnv, ToolResult

__all__ = [
    "EnvState",
    "EnvStep",
    "Environment",
    "Message",
    "Score",
    "ToolEnv",
    "ToolResult",
    "TurnLimits",
    "advance",
    "available",
    "call",
    "load",
    "make_dataset",
    "register",
    "register_family",
    "split_score",
]
