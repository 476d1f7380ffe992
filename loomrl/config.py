"""Pydantic configs: one class per component, a docstring per field.

The same object is a TOML file (``--config FILE``) and CLI flags (a flag overrides the
file), and it is written back into every run directory as ``config.toml``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from loomrl.models import DEFAULT_MODEL


class RolloutConfig(BaseModel):
    """``loomrl rollout``: which model plays which environment, how often, within what limits."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field("guess_number", description="environment name (see `loomrl envs`)")
    env_args: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments for the environment"
    )
    model: str = Field(DEFAULT_MODEL, description="model spec or local HF directory")
    examples: int = Field(8, ge=1, description="examples drawn from the env's generator")
    seed: int = Field(0, description="seed of the example generator and of sampling")
    n: int = Field(4, ge=1, description="samples per example (one group)")
    max_turns: int | None = Field(None, ge=1, description="turn limit (default: the env's)")
    max_len: int = Field(2048, ge=2, description="prompt + completion token budget")
    max_tokens: int = Field(64, ge=1, description="tokens per model turn")
    temperature: float = Field(1.0, ge=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    concurrency: int = Field(64, ge=1, description="trajectories in flight at once")
    env_timeout: float | None = Field(30.0, gt=0, description="seconds per env call")
    on_error: Literal["raise", "isolate"] = Field(
        "isolate", description="'isolate': a failing trajectory gets status error; others go on"
    )
    mode: Literal["continuous", "turn_sync"] = Field(
        "continuous", description="'turn_sync' is the turn-synchronous baseline"
    )
    out: Path | None = Field(None, description="run directory (default runs/rollout-TIME)")
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="extra VLLMEngine / vLLM engine arguments"
    )

    @classmethod
    def load(cls, path: Path | None, overrides: dict[str, Any]) -> RolloutConfig:
        """The TOML file's values (if any), then every override that is not None."""
        data: dict[str, Any] = {}
        if path is not None:
            with open(path, "rb") as f:
                data = tomllib.load(f)
            data = data.get("rollout", data)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(data)
