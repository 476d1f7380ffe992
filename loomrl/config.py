"""Pydantic configs: one class per component, a docstring per field.

The same object is a TOML file (``--config FILE``) and CLI flags (a flag overrides the
file), and it is written back into every run directory as ``config.toml``. TOML has no
null, so a field that was ``None`` is absent there: ``load_run_config`` reads it back as
``None``, not as the field's default.
"""

from __future__ import annotations

import difflib
import json
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from loomrl.data import DataConfig
from loomrl.distributed.config import RayConfig
from loomrl.engines.pool_config import PoolConfig
from loomrl.engines.replicas import check_replicas
from loomrl.episode.turn_rewards import TurnReward
from loomrl.models import DEFAULT_MODEL
from loomrl.redact import redact_text
from loomrl.rewards.config import RewardConfig

# Examples a rollout draws from an env's generator when not told how many.
DEFAULT_EXAMPLES = 8
# Examples a run draws up front (a few hundred bytes each): a bound far above real runs
# that turns a mistyped count into an error instead of exhausting memory.
MAX_EXAMPLES = 10_000_000
# Seeds reach numpy's generator (in vLLM), which takes 0 .. 2**32 - 1.
MAX_SEED = 2**32 - 1


# How a run overrides its environment's per-turn reward rule (rollout, train, train tasks).
TURN_REWARD: Any = Field(
    None,
    description="how per-turn rewards count: final, sum, final+sum or discounted "
    "(default: the environment's own; docs/environments.md)",
)
TURN_DISCOUNT: Any = Field(
    None, ge=0, le=1,
    description="per-turn discount for turn_reward = 'discounted' (default: the environment's own)",
)  # fmt: skip
ENGINES: Any = Field(
    default_factory=list,
    description="engine replicas, each a server URL (`loomrl serve`) or the model's own spec "
    "(in process); two or more make a pool (docs/scaling-out.md). Empty: one in-process engine",
)
POOL: Any = Field(
    default_factory=PoolConfig,
    description="how a pool of two or more replicas routes and health-checks ([pool] table; "
    "--routing, --probe-interval, --request-timeout, --max-inflight)",
)
RAY: Any = Field(
    None,
    description="engine replicas and environments as Ray actors ([ray] table, --ray; "
    "docs/distributed.md). None: no Ray",
)
FIRST_TOKEN_TEMPERATURE: Any = Field(
    None, gt=0, allow_inf_nan=False,
    description="FIRE sampling: the temperature of each turn's first tokens (None: off)",
)  # fmt: skip
FIRST_TOKENS: Any = Field(1, ge=1, description="FIRE sampling: how many first tokens run hot")
FIRE_TURNS: Any = Field(
    "all", description="FIRE sampling on every turn ('all') or the episode's first ('first')"
)
REWARD: Any = Field(
    None,
    description="the run's reward in place of the environment's score: a function name "
    "(`math_verify`) or a table of rubric, model, remote and judge (docs/training.md#rewards; "
    "None: the environment's own)",
)
MAX_OBS_TOKENS: Any = Field(
    None, ge=1,
    description="tokens an env message may take; a longer one is cut in the middle "
    "(default: the environment's own; docs/tools.md)",
)  # fmt: skip


class RolloutConfig(BaseModel):
    """``loomrl rollout``: which model plays which environment, how often, within what limits."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field("guess_number", description="environment name (see `loomrl envs`)")
    env_args: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments for the environment"
    )
    model: str = Field(
        DEFAULT_MODEL, description="model spec, local HF directory, or Hub name org/name[@rev]"
    )
    data: DataConfig | None = Field(
        None, description="examples from a data file instead of the env's generator"
    )
    examples: int | None = Field(
        None, ge=1, le=MAX_EXAMPLES,
        description="examples drawn from the env's generator (default 8); with data, the "
        "rows used (default: all)",
    )  # fmt: skip
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of the examples and of sampling")
    n: int = Field(4, ge=1, description="samples per example (one group)")
    max_turns: int | None = Field(None, ge=1, description="turn limit (default: the env's)")
    max_len: int = Field(2048, ge=2, description="prompt + completion token budget")
    max_tokens: int = Field(64, ge=1, description="tokens per model turn")
    temperature: float = Field(1.0, ge=0, allow_inf_nan=False, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    first_token_temperature: float | None = FIRST_TOKEN_TEMPERATURE
    first_tokens: int = FIRST_TOKENS
    fire_turns: Literal["all", "first"] = FIRE_TURNS
    concurrency: int = Field(64, ge=1, description="trajectories in flight at once")
    env_timeout: float | None = Field(30.0, gt=0, description="seconds per env call")
    turn_reward: TurnReward | None = TURN_REWARD
    turn_discount: float | None = TURN_DISCOUNT
    max_obs_tokens: int | None = MAX_OBS_TOKENS
    reward: RewardConfig | None = REWARD
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
    engines: list[str] = ENGINES
    pool: PoolConfig = POOL
    ray: RayConfig | None = RAY

    @model_validator(mode="after")
    def _replicas_serve_the_model(self) -> RolloutConfig:
        check_replicas(self.model, self.engines, ray=self.ray is not None)
        return self

    @classmethod
    def load(cls, path: Path | None, overrides: dict[str, Any]) -> RolloutConfig:
        """The TOML file's values (if any), then every override that is not None."""
        data = table_of(read_toml(path), "rollout", path) if path is not None else {}
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(data)


Config = TypeVar("Config", bound=BaseModel)


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file's top-level table; a missing, unreadable or malformed file raises an
    error that names it (and, for a syntax error, the line and column)."""
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a TOML file")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such config file")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a TOML file (not UTF-8 text)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: invalid TOML: {exc}") from None


def table_of(data: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    """The ``[name]`` table of a config file, or its top level when there is none; keys
    beside the table are refused rather than silently dropped."""
    if name not in data:
        return data
    stray = sorted(set(data) - {name})
    if stray:
        raise ValueError(f"{path}: {stray} sit outside the [{name}] table; move them in")
    if not isinstance(data[name], dict):
        raise ValueError(f"{path}: {name} must be a [{name}] table")
    return dict(data[name])


class ConfigError(ValueError):
    """A config that does not validate, as one line naming the file (or flag) and field."""


def describe(
    exc: ValidationError,
    source: Path | str | None,
    flags: Mapping[str, str] | None = None,
    model: type[BaseModel] | None = None,
) -> str:
    """Pydantic's errors as one line: each names where the value came from (``source``,
    a file, or the flag in ``flags`` that set the field), the field, the value and why it
    was refused; an unknown field gets the nearest known name of ``model`` if any."""
    flags = flags or {}
    parts = []
    for err in exc.errors(include_url=False):
        loc = [str(x) for x in err["loc"]]
        field = ".".join(loc) or "config"
        by_flag = flags.get(loc[0]) if len(loc) == 1 else None
        where = str(source) if source is not None else "config"
        if by_flag:
            parts.append(f"{by_flag}: {err['msg']}")
        elif err["type"] == "extra_forbidden":
            near = difflib.get_close_matches(loc[-1], list(model.model_fields) if model else [])
            hint = f" (did you mean {near[0]!r}?)" if near and len(loc) == 1 else ""
            parts.append(f"{where}: unknown field {field!r}{hint}")
        elif err["type"] == "missing":
            parts.append(f"{where}: {field} is required")
        elif not loc:  # a rule across fields: its message names them, not the input
            parts.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
        else:
            parts.append(f"{where}: {field} = {_shown(err.get('input'))}: {err['msg']}")
    return "; ".join(parts)


def _shown(value: Any) -> str:
    """A refused value as the error shows it: JSON, URLs redacted, at most 80 characters."""
    try:
        text = redact_text(json.dumps(value, default=str))
    except (TypeError, ValueError):
        text = redact_text(repr(value))
    return text if len(text) <= 80 else text[:77] + "..."


def load_run_config(cls: type[Config], path: Path, table: str) -> Config:
    """The config a run directory recorded in ``path`` (its ``config.toml``): a field the
    file lacks that may be ``None`` was ``None`` when written (TOML has no null). A file
    that does not validate raises ``ConfigError`` naming it and the field."""
    data = table_of(read_toml(path), table, path)
    if not data:  # a run always records its settings; none at all is a damaged file
        raise ConfigError(f"{path} records no settings: it is empty or not a run's config")
    for name, field in cls.model_fields.items():
        if name not in data and _allows_none(field.annotation):
            data[name] = None
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe(exc, path, model=cls)) from None


def _allows_none(annotation: Any) -> bool:
    if annotation is None or annotation is type(None):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_allows_none(arg) for arg in typing.get_args(annotation))
    return False
