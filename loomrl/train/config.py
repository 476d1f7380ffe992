"""``TrainConfig``: one TOML file (``loomrl train FILE``) describes a whole training run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from loomrl.config import (
    ENGINES,
    FIRE_TURNS,
    FIRST_TOKEN_TEMPERATURE,
    FIRST_TOKENS,
    MAX_OBS_TOKENS,
    MAX_SEED,
    POOL,
    RAY,
    REWARD,
    TURN_DISCOUNT,
    TURN_REWARD,
    read_toml,
    table_of,
)
from loomrl.data import DataConfig
from loomrl.distributed.config import RayConfig
from loomrl.engines.pool_config import PoolConfig
from loomrl.engines.replicas import check_replicas
from loomrl.episode.turn_rewards import TurnReward
from loomrl.experience.shaping_config import TURN_CREDIT, ShapingConfig
from loomrl.experience.truncation import Truncation
from loomrl.experience.turn_credit import TurnCredit
from loomrl.models import DEFAULT_MODEL
from loomrl.rewards.config import RewardConfig
from loomrl.train import device_fields as devices
from loomrl.train import offpolicy_fields as offpolicy
from loomrl.train.config_rules import check_knobs, check_pool, check_single_env
from loomrl.train.critic import CriticConfig, check_critic
from loomrl.train.learner import LearnerConfig
from loomrl.train.lora import LoraConfig
from loomrl.train.placement import Device, Placement, place
from loomrl.train.presets import Algorithm, apply_preset

if TYPE_CHECKING:
    from loomrl.train.evaluate import EvalSettings
from loomrl.train.task_config import TaskConfig


class TrainConfig(BaseModel):
    """GRPO-style training: each step rolls out ``prompts_per_step`` examples ``n`` times,
    turns them into advantages, takes ``ppo_epochs`` × mini-batches optimizer steps (one by
    default) and syncs the engine's weights. ``algorithm`` fills fields from a preset."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field("arith", description="environment name (see `loomrl envs`)")
    env_args: dict[str, Any] = Field(default_factory=dict, description="environment kwargs")
    data: DataConfig | None = Field(
        None, description="the single env's examples from a data file (cycled in epochs)"
    )
    model: str = Field(DEFAULT_MODEL, description="model spec or local HF directory")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of examples, sampling and learner")
    steps: int = Field(40, ge=1, description="optimizer steps")
    prompts_per_step: int = Field(
        8, ge=1, validate_default=True, description="examples per step (groups)"
    )
    n: int = Field(8, ge=1, description="samples per example (group size)")
    max_turns: int | None = Field(None, ge=1, description="turn limit (default: the env's)")
    max_len: int = Field(512, ge=2, description="prompt + completion token budget")
    max_tokens: int = Field(64, ge=1, description="tokens per model turn")
    temperature: float = Field(
        1.0, gt=0, allow_inf_nan=False, description="sampling (and learner) temperature"
    )
    top_p: float = offpolicy.TOP_P
    top_k: int = offpolicy.TOP_K
    min_p: float = offpolicy.MIN_P
    first_token_temperature: float | None = FIRST_TOKEN_TEMPERATURE
    first_tokens: int = FIRST_TOKENS
    fire_turns: Literal["all", "first"] = FIRE_TURNS
    concurrency: int = Field(64, ge=1, description="trajectories in flight")
    env_timeout: float | None = Field(30.0, gt=0, description="seconds per env call")
    turn_reward: TurnReward | None = TURN_REWARD
    turn_discount: float | None = TURN_DISCOUNT
    max_obs_tokens: int | None = MAX_OBS_TOKENS
    reward: RewardConfig | None = REWARD
    tasks: dict[str, TaskConfig] = Field(
        default_factory=dict,
        description="task name -> env (default: the name), weight, env_args and data; several "
        "tasks share each step by weight (empty: the single `env`)",
    )
    producer: Literal["sync", "async"] = Field(
        "sync", description="'async' keeps producing while the learner trains"
    )
    max_staleness: int = Field(
        1, ge=0, description="max policy versions between a group's oldest token and its step"
    )
    partial_rollout: bool = Field(
        True, description="continue generations a weight update cut, stamping each version"
    )
    over_sample_threshold: float = Field(
        0.0, ge=0, allow_inf_nan=False,
        description="launch prompts_per_step * (1 + this) groups; train on the first",
    )  # fmt: skip
    algorithm: Algorithm | None = Field(
        None,
        description="preset: sets estimator, loss, aggregation, clip ranges and KL as the "
        "algorithm's paper does (docs/training.md); fields set explicitly win",
    )
    estimator: str = Field("grpo", description="advantage estimator (loomrl.algos registry)")
    estimator_options: dict[str, Any] = Field(default_factory=dict, description="its options")
    drop_zero_variance: bool = Field(False, description="drop groups whose rewards all agree")
    turn_credit: TurnCredit = TURN_CREDIT
    dynamic_sampling: bool = offpolicy.DYNAMIC_SAMPLING
    max_draw_batches: int = offpolicy.MAX_DRAW_BATCHES
    layout: Literal["packed", "padded"] = Field(
        "padded", description="training batch layout (packed pays off with varlen attention)"
    )
    device: Device = devices.DEVICE
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="learner weights")
    autocast: Literal["auto", "bfloat16", "none"] = Field(
        "auto",
        description="mixed-precision matmuls in forward/backward ('none': dtype; 'auto': "
        "bfloat16 where the learner's device multiplies it natively, else none)",
    )
    gradient_checkpointing: bool = devices.GRADIENT_CHECKPOINTING
    compile: bool = devices.COMPILE
    learner_world_size: int = devices.LEARNER_WORLD_SIZE
    lr: float = Field(1e-5, gt=0, allow_inf_nan=False, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, allow_inf_nan=False, description="AdamW weight decay")
    warmup_steps: int = Field(0, ge=0, description="linear warm-up steps")
    cosine_decay: bool = Field(False, description="cosine-decay the LR to 10% over `steps`")
    max_grad_norm: float = Field(1.0, gt=0, description="global gradient-norm clip")
    clip_low: float = Field(0.2, ge=0, description="PPO ratio clip below 1")
    clip_high: float = Field(0.2, ge=0, description="PPO ratio clip above 1 (DAPO: 0.28)")
    aggregation: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "constant"] = (
        Field("token-mean", description="how token losses are averaged")
    )
    constant_normaliser: float = Field(
        1024.0, gt=0, allow_inf_nan=False, description="Dr. GRPO's constant"
    )
    kl_coef: float = Field(
        0.0, ge=0, allow_inf_nan=False, description="β of the KL to the reference (0: no reference)"
    )
    is_cap: float | None = Field(
        2.0, gt=0, description="truncated importance weight cap for the sampler gap (None: off)"
    )
    correction: offpolicy.Correction = offpolicy.CORRECTION
    dual_clip: float | None = offpolicy.DUAL_CLIP
    shuffle_mini_batches: bool = offpolicy.SHUFFLE
    correction_low: float | None = offpolicy.CORRECTION_LOW
    correction_high: float | None = offpolicy.CORRECTION_HIGH
    loss: Literal["pg", "gspo", "cpgd", "cispo"] = Field(
        "pg",
        description="policy loss: 'pg' token-level clipped PG, 'gspo' sequence-level ratio, "
        "'cpgd' clipped log-ratio + policy drift, 'cispo' clipped IS weight on REINFORCE",
    )
    drift_coef: float = Field(
        0.0, ge=0, allow_inf_nan=False, description="cpgd's policy-drift coefficient (α)"
    )
    ppo_epochs: int = Field(
        1, ge=1, description="passes over each rollout batch (one optimizer step per mini-batch)"
    )
    mini_batch_size: int | None = Field(
        None, ge=1, description="trajectories per optimizer step (None: the whole batch)"
    )
    old_logprobs: Literal["learner", "sampler"] = Field(
        "learner",
        description="π_old of the PPO ratio: the learner's recompute before the first update, "
        "or the engine's sampling logprobs",
    )
    eval_every: int | None = Field(
        None, ge=0,
        description="steps between evaluations on held-out examples, also before the first "
        "step and after the last (0 or None: off)",
    )  # fmt: skip
    eval_examples: int = Field(64, ge=1, description="held-out examples per task per evaluation")
    eval_n: int = Field(
        4, ge=1, description="samples per eval example at `temperature`, for pass@k (k = eval_n)"
    )
    eval_pass_threshold: float = Field(
        1.0, allow_inf_nan=False,
        description="a sample passes if its `correct` reward component is >= 1, or (an env "
        "without one) its reward is >= this",
    )  # fmt: skip
    eval_data: DataConfig | None = Field(
        None,
        description="the single env's eval examples from this data file (default: data's "
        "held-out rows, or the env's generator disjoint from the training examples)",
    )
    lora: LoraConfig | None = Field(
        None,
        description="train LoRA adapters {r, alpha, dropout, targets} on the frozen model "
        "instead of all its weights (None: full fine-tuning; needs loomrl[lora])",
    )
    micro_batch_tokens: devices.Budget = devices.MICRO_BATCH_TOKENS
    # Shaping, KL and sync knobs (loomrl.train.shaping; docs/training.md "Knobs").
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
        None, ge=1, description="the overlong limit L_max (default max_tokens × max_turns)"
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="per-token KL estimator")
    kl_in: Literal["loss", "reward"] = Field(
        "loss", description="KL to the reference as a loss term or a per-token reward penalty"
    )
    kl_target: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="adapt kl_coef towards this KL (None: fixed)"
    )
    kl_horizon: int = Field(10000, ge=1, description="the adaptive KL controller's horizon")
    entropy_coef: float = Field(0.0, ge=0, allow_inf_nan=False, description="entropy bonus")
    ref_refresh_every: int | None = Field(
        None, ge=1, description="reference <- current policy every N steps (None: never)"
    )
    sync_weights_interval: int = Field(
        1, ge=1, description="push the policy into the engine every k steps"
    )
    weight_sync: Literal["transfer", "file", "nccl", "ipc"] = devices.WEIGHT_SYNC
    colocate: devices.Colocate = devices.COLOCATE
    sleep_level: Literal[1, 2] = devices.SLEEP_LEVEL
    critic: bool | None = Field(
        None,
        description="train a value model for the estimator's values (None: exactly when the "
        "estimator takes values, i.e. 'gae')",
    )
    critic_model: str | None = Field(
        None, description="the critic's model spec (default: a copy of `model`; same tokenizer)"
    )
    critic_lr: float = Field(1e-5, gt=0, allow_inf_nan=False, description="critic AdamW LR")
    value_clip: float | None = Field(
        0.5, gt=0, allow_inf_nan=False, description="clip new values to old ± this (None: off)"
    )
    vf_coef: float = Field(
        0.5, gt=0, allow_inf_nan=False, description="value loss scale (c · squared error)"
    )
    checkpoint_every: int = Field(10, ge=1, description="steps between checkpoints")
    report_every: int = Field(
        10, ge=0, description="steps between refreshes of report.html (0: only at the end)"
    )
    log_to: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=list, description="metric sinks besides metrics.jsonl (extras)"
    )
    out: Path | None = Field(None, description="run directory (default runs/train-TIME)")
    engine_args: dict[str, Any] = Field(default_factory=dict, description="VLLMEngine args")
    engines: list[str] = ENGINES
    pool: PoolConfig = POOL
    ray: RayConfig | None = RAY

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        """Fill the fields ``algorithm`` sets that the config leaves out."""
        if not isinstance(data, dict):
            return data
        defaults = {name: f.default for name, f in cls.model_fields.items()}
        return apply_preset(data, defaults)

    @model_validator(mode="after")
    def _replicas_serve_the_model(self) -> TrainConfig:
        check_replicas(self.model, self.engines, ray=self.ray is not None)
        return self

    @model_validator(mode="after")
    def _critic_fits(self) -> TrainConfig:
        """``gae`` implies the critic; a critic no estimator reads is refused."""
        self.critic = check_critic(self.estimator, self.critic, self.critic_model)
        return self

    @model_validator(mode="after")
    def _knobs_fit(self) -> TrainConfig:
        """The loss, shaping, KL and sync knobs' cross-field rules
        (``loomrl.train.config_rules``)."""
        check_knobs(self)
        self.learner().corrector()  # its band: low < high
        return self

    @field_validator("prompts_per_step")
    @classmethod
    def _pool_fits(cls, value: int, info: ValidationInfo) -> int:
        check_pool(info.data.get("steps"), value)
        return value

    @field_validator("tasks", "eval_data")
    @classmethod
    def _single_env_fields(cls, value: Any, info: ValidationInfo) -> Any:
        """Data and env arguments are the single env's: with tasks, each task has its own."""
        check_single_env(info.field_name or "", value, info.data)
        return value

    def overlong_limit(self) -> int:
        """L_max of the overlong penalty: ``overlong_max_tokens``, or the generation
        budget ``max_tokens × max_turns`` (one turn when unset)."""
        return self.overlong_max_tokens or self.max_tokens * (self.max_turns or 1)

    @classmethod
    def load(cls, path: Path | None, overrides: dict[str, Any] | None = None) -> TrainConfig:
        """The TOML file's values (its ``[train]`` table or top level), then overrides."""
        data = table_of(read_toml(path), "train", path) if path is not None else {}
        data.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls.model_validate(data)

    def task_specs(self) -> dict[str, TaskConfig]:
        """The tasks to train on: ``tasks``, or the single ``env`` with ``env_args`` and
        ``data``; each with its ``env`` set (a task's defaults to its name)."""
        if not self.tasks:
            return {
                self.env: TaskConfig(
                    env=self.env,
                    env_args=self.env_args,
                    data=self.data,
                    turn_reward=self.turn_reward,
                    turn_discount=self.turn_discount,
                    reward=self.reward,
                )
            }
        return {
            name: spec.model_copy(
                update={
                    "env": spec.env or name,
                    "turn_reward": spec.turn_reward or self.turn_reward,
                    "turn_discount": (
                        self.turn_discount if spec.turn_discount is None else spec.turn_discount
                    ),
                    "reward": spec.reward or self.reward,
                }
            )
            for name, spec in self.tasks.items()
        }

    def learner(self) -> LearnerConfig:
        return LearnerConfig(
            lr=self.lr, weight_decay=self.weight_decay, warmup_steps=self.warmup_steps,
            total_steps=self.steps if self.cosine_decay else 0,
            max_grad_norm=self.max_grad_norm, clip_low=self.clip_low, clip_high=self.clip_high,
            aggregation=self.aggregation, constant_normaliser=self.constant_normaliser,
            kl_coef=self.kl_coef, is_cap=self.is_cap, correction=self.correction,
            correction_low=self.correction_low, correction_high=self.correction_high,
            temperature=self.temperature,
            truncation=Truncation(self.top_p, self.top_k, self.min_p),
            max_tokens=self._budget(),
            autocast=self.resolved_autocast(),
            loss=self.loss, drift_coef=self.drift_coef, ppo_epochs=self.ppo_epochs,
            mini_batch_size=self.mini_batch_size, old_logprobs=self.old_logprobs,
            kl_estimator=self.kl_estimator, entropy_coef=self.entropy_coef,
            shuffle=self.shuffle_mini_batches, seed=self.seed, dual_clip=self.dual_clip,
        )  # fmt: skip

    def shaping(self) -> ShapingConfig:
        """The shaping section: the fields of the same names, the overlong limit resolved."""
        fields = {name: getattr(self, name) for name in ShapingConfig.model_fields}
        limit = self.overlong_limit() if self.overlong_buffer else None
        return ShapingConfig(**{**fields, "overlong_max_tokens": limit})

    def critic_config(self) -> CriticConfig:
        """The critic's optimiser: its own LR, the policy's PPO schedule and clip norm."""
        return CriticConfig(
            lr=self.critic_lr, weight_decay=self.weight_decay, max_grad_norm=self.max_grad_norm,
            value_clip=self.value_clip, vf_coef=self.vf_coef, ppo_epochs=self.ppo_epochs,
            mini_batch_size=self.mini_batch_size, max_tokens=self._budget(),
            autocast=self.resolved_autocast(),
        )  # fmt: skip

    def eval_settings(self) -> EvalSettings:
        """The held-out evaluation's settings: the run's sampling, ``eval_n``, threshold."""
        from loomrl.train.evaluate import EvalSettings

        return EvalSettings(
            n=self.eval_n, temperature=self.temperature, max_tokens=self.max_tokens,
            max_turns=self.max_turns, max_len=self.max_len, concurrency=self.concurrency,
            env_timeout=self.env_timeout, seed=self.seed, pass_threshold=self.eval_pass_threshold,
        )  # fmt: skip

    def _budget(self) -> int:
        """``micro_batch_tokens``; ``auto`` is resolved before the models load
        (``loomrl.train.budget``), until then the fixed default stands in."""
        return 2048 if self.micro_batch_tokens == "auto" else self.micro_batch_tokens

    def placement(self, rank: int = 0) -> Placement:
        """Learner rank ``rank``'s device, weight dtype and autocast, resolved."""
        return place(self.device, self.dtype, self.autocast, rank)

    def resolved_autocast(self) -> str | None:
        """The learner's matmul dtype: ``auto`` is bf16 only with hardware for it on the
        learner's device (a GPU, or a CPU with AVX512-BF16/AMX); emulated bf16 was 24x
        slower than fp32 here."""
        return self.placement().autocast
