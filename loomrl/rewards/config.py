"""``RewardConfig``: a run's reward as data (``reward = ...`` in ``[rollout]``, ``[train]``,
``[train.tasks.NAME]``; ``--reward NAME``).

Forms, all combined into one weighted ``Recipe`` whose components are named terms::

    reward = "math_verify"                       # one function, weight 1

    [train.reward]                               # or [rollout.reward], [train.tasks.NAME.reward]
    rubric = [
      { fn = "math_verify", weight = 1.0 },
      { fn = "format", weight = 0.1, answer_format = "boxed" },
    ]
    model = "tiny-reward"                        # or { path = DIR, weight = 0.5, ... }
    remote = { url = "https://rm.example/score", token_env = "RM_TOKEN" }
    judge = { engine = "http://127.0.0.1:8000", prompt = "{question} ... {answer} ..." }

A rubric term's other keys are the function's arguments (``loomrl.rewards.funcs``).
A weight of 0 makes a term a metric (recorded, never part of the reward). When a config
is written into a run's ``config.toml``, URLs are redacted (``loomrl.runs.toml_ready``);
secrets are never in the config: a bearer token is named by its environment variable.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

WEIGHT: Any = Field(
    1.0, allow_inf_nan=False, description="the term's weight in the reward (0: a metric only)"
)


class RubricTerm(BaseModel):
    """One named reward function with its weight; other keys are its arguments."""

    model_config = ConfigDict(extra="allow")

    fn: str = Field(description="the function's name (loomrl.rewards.funcs.FUNCTIONS)")
    weight: float = WEIGHT
    name: str | None = Field(
        None, description="the component's name in the trajectory (default: fn)"
    )

    @property
    def args(self) -> dict[str, Any]:
        """The function's keyword arguments: every key besides fn, weight and name."""
        return dict(self.model_extra or {})

    @property
    def component(self) -> str:
        return self.name or self.fn


class ModelRewardConfig(BaseModel):
    """A local sequence-classification reward model (``loomrl.rewards.RewardModel``)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        description="a model spec (`tiny-reward`) or a local HF sequence-classification directory"
    )
    weight: float = WEIGHT
    name: str = Field("model", description="the component's name")
    input: Literal["chat", "completion"] = Field(
        "chat", description="what it reads: the chat-templated conversation, or the reply alone"
    )
    batch_size: int = Field(8, ge=1, description="texts per forward pass")
    max_length: int | None = Field(
        None, ge=1, description="cut longer inputs from the left (None: refuse them)"
    )
    device: str | None = Field(None, description="torch device (None: cuda when there, else cpu)")
    label_index: int | None = Field(
        None, ge=0, description="the logit that is the reward (None: a one-label model's)"
    )

    @model_validator(mode="before")
    @classmethod
    def _spec_alone(cls, data: Any) -> Any:
        return {"path": data} if isinstance(data, str) else data


class RemoteRewardConfig(BaseModel):
    """An HTTP JSON reward server (``loomrl.rewards.RemoteReward``; protocol there)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="http(s) URL the batches are POSTed to (no user:pass@)")
    weight: float = WEIGHT
    name: str = Field("remote", description="the component's name")
    token_env: str | None = Field(
        None, description="environment variable holding the bearer token (never the token)"
    )
    timeout_s: float = Field(30.0, gt=0, description="seconds per request attempt")
    retries: int = Field(3, ge=0, le=20, description="retries of a failed request")
    batch_size: int = Field(64, ge=1, description="samples per request")
    max_concurrency: int = Field(4, ge=1, description="requests in flight")

    @model_validator(mode="before")
    @classmethod
    def _url_alone(cls, data: Any) -> Any:
        return {"url": data} if isinstance(data, str) else data


class JudgeConfig(BaseModel):
    """An LLM judge (``loomrl.rewards.Judge``) on its own engine, closed with the run."""

    model_config = ConfigDict(extra="forbid")

    engine: str = Field(
        description="the judge's model spec (served in process by vLLM) or a server URL "
        "(`loomrl serve`)"
    )
    tokenizer: str | None = Field(
        None,
        description="model spec whose tokenizer renders the judge's prompt (default: the "
        "engine's own; a server's when its model directory exists here)",
    )
    prompt: str | None = Field(
        None,
        description="the prompt template: {question}, {answer} (required: the reply), "
        "{reference}, {low}, {high} (None: a built-in one asking for `Score: N`)",
    )
    parser: Literal["score"] = Field(
        "score",
        description="how the reply is read: 'score', exactly one line `Score: N` with N in "
        "[low, high], mapped to [0, 1]",
    )
    system: str | None = Field(None, description="the judge's system prompt")
    low: float = Field(0.0, allow_inf_nan=False, description="the lowest score")
    high: float = Field(10.0, allow_inf_nan=False, description="the highest score")
    reference_key: str = Field("answer", description="the example's key shown as {reference}")
    max_tokens: int = Field(512, ge=1, description="tokens of the judge's reply")
    on_parse_error: Literal["raise", "fallback"] = Field(
        "raise", description="an unreadable reply fails the sample, or scores `fallback`"
    )
    fallback: float = Field(0.0, allow_inf_nan=False, description="score of an unreadable reply")
    weight: float = WEIGHT
    name: str = Field("judge", description="the component's name")


class RewardConfig(BaseModel):
    """A run's reward, replacing its environments' own scores: named functions, a reward
    model, a remote server and a judge, summed with their weights."""

    model_config = ConfigDict(extra="forbid")

    rubric: list[RubricTerm] = Field(
        default_factory=list, description="reward functions by name with weights and arguments"
    )
    model: ModelRewardConfig | None = Field(
        None, description="a local reward model: a spec or directory, or a table"
    )
    remote: RemoteRewardConfig | None = Field(None, description="a remote reward server")
    judge: JudgeConfig | None = Field(None, description="an LLM judge")

    @model_validator(mode="before")
    @classmethod
    def _name_alone(cls, data: Any) -> Any:
        """``reward = "NAME"`` is a one-function rubric."""
        return {"rubric": [{"fn": data}]} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _terms_fit(self) -> RewardConfig:
        names = [t.component for t in self.rubric]
        names += [s.name for s in (self.model, self.remote, self.judge) if s is not None]
        if not names:
            raise ValueError("a reward needs a rubric, a model, a remote server or a judge")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"reward component names must differ: {twice} given twice")
        return self

    def summary(self) -> str:
        """What the reward is made of, one line (for progress messages)."""
        parts = [f"{t.component}={t.weight:g}" for t in self.rubric]
        parts += [
            f"{s.name}={s.weight:g}" for s in (self.model, self.remote, self.judge) if s is not None
        ]
        return ", ".join(parts)
