"""``ShapingConfig``: what turns one step's rewards into advantages (the stages of
``loomrl.experience.pipeline``), as one section that ``loomrl train`` (``TrainConfig.shaping``)
and ``loomrl experience`` (flags or a ``--config`` TOML) fill with the same field names."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from loomrl.experience.turn_credit import TurnCredit, check_turn_credit

TURN_CREDIT: Any = Field(
    "episode",
    description="'turn': each turn's reward on its last model token, for gae / reinforce_pp "
    "and the critic ('episode': the whole reward on the episode's last token)",
)


def clip_range(value: tuple[float, float] | float | None) -> tuple[float, float] | None:
    """``reward_clip`` as ``(low, high)``: a bound ``b`` is ``(-b, b)``; ``ValueError`` for a
    bound <= 0 or a range with ``low >= high``."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"reward_clip = {float(value)}: a bound must be > 0")
        value = (-float(value), float(value))
    low, high = float(value[0]), float(value[1])
    if not low < high:
        raise ValueError(f"reward_clip = {[low, high]}: need low < high")
    return (low, high)


class ShapingConfig(BaseModel):
    """Reward and advantage shaping of one step, in the pipeline's order: overlong penalty,
    reward normalisation, clipping, the zero-variance filter, KL in the reward, the
    estimator, advantage whitening and clipping (docs/training.md "Knobs")."""

    model_config = ConfigDict(extra="forbid")

    estimator: str = Field("grpo", description="advantage estimator (loomrl.algos registry)")
    estimator_options: dict[str, Any] = Field(default_factory=dict, description="its options")
    drop_zero_variance: bool = Field(False, description="drop groups whose rewards all agree")
    turn_credit: TurnCredit = TURN_CREDIT
    reward_norm: Literal["none", "batch", "running"] = Field(
        "none", description="normalise rewards by the step's or a running mean and std"
    )
    reward_clip: tuple[float, float] | float | None = Field(
        None, description="clip rewards to [low, high], or to [-b, b] for a bound b"
    )
    whiten_advantages: bool = Field(False, description="whiten advantages over the batch")
    advantage_clip: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="clip advantages to [-c, c]"
    )
    overlong_buffer: int = Field(
        0, ge=0, description="DAPO overlong penalty ramp: the last N tokens of the limit (0: off)"
    )
    overlong_penalty_factor: float = Field(
        1.0, ge=0, allow_inf_nan=False, description="the overlong penalty at the limit"
    )
    overlong_max_tokens: int | None = Field(
        None, ge=1, description="the overlong limit L_max (needed with overlong_buffer)"
    )
    kl_coef: float = Field(
        0.0, ge=0, allow_inf_nan=False, description="β of the KL to the reference (0: none)"
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="per-token KL estimator")
    kl_in: Literal["loss", "reward"] = Field(
        "loss", description="KL to the reference as a loss term or a per-token reward penalty"
    )
    kl_target: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="adapt kl_coef towards this KL (None: fixed)"
    )
    kl_horizon: int = Field(10000, ge=1, description="the adaptive KL controller's horizon")
    ref_refresh_every: int | None = Field(
        None, ge=1, description="reference <- current policy every N steps (None: never)"
    )

    @model_validator(mode="after")
    def _fits(self) -> ShapingConfig:
        """The cross-field rules, each naming its fields."""
        self.reward_clip = clip_range(self.reward_clip)
        if self.overlong_buffer and self.overlong_max_tokens is None:
            raise ValueError("overlong_buffer needs overlong_max_tokens (the limit L_max)")
        if self.overlong_max_tokens is not None and self.overlong_buffer > self.overlong_max_tokens:
            raise ValueError(
                f"overlong_buffer = {self.overlong_buffer} exceeds the overlong limit "
                f"{self.overlong_max_tokens} (overlong_max_tokens)"
            )
        off = {"overlong_penalty_factor": 1.0, "overlong_max_tokens": None}  # the defaults
        for name, default in off.items():
            if getattr(self, name) != default and not self.overlong_buffer:
                raise ValueError(f"{name} needs overlong_buffer > 0 (the penalty is off)")
        needs_ref = [n for n in ("kl_target", "ref_refresh_every") if getattr(self, n)]
        needs_ref += ["kl_in = 'reward'"] if self.kl_in == "reward" else []
        if needs_ref and not self.kl_coef:
            raise ValueError(f"{', '.join(needs_ref)} needs a reference: set kl_coef > 0")
        if self.turn_credit == "turn":
            check_turn_credit(self.estimator, self.reward_norm)
        return self

    @property
    def kl_in_reward(self) -> bool:
        """Whether a policy and a reference model must score each step's batch."""
        return self.kl_in == "reward" and self.kl_coef > 0
