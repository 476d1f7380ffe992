"""ProducerConfig: how many groups a step needs and how production may run ahead."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field


class ProducerConfig(BaseModel):
    """Batch shape, staleness bound and over-sampling of a producer."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(4, ge=1, description="samples per group (one example)")
    batch_size: int = Field(8, ge=1, description="groups per training step")
    max_staleness: int | None = Field(
        0,
        ge=0,
        description="max policy versions between a group's oldest token and the step that "
        "trains on it (0 = on-policy; None = unbounded)",
    )
    partial_rollout: bool = Field(
        True,
        description="across a weight update, keep the tokens generated so far (stamped with "
        "their version) and continue; off: restart from the prompt",
    )
    over_sample_threshold: float = Field(
        0.0, ge=0, allow_inf_nan=False,
        description="launch batch_size * (1 + this) groups per step; use the first",
    )  # fmt: skip
    max_in_flight: int | None = Field(
        None, ge=1, description="groups running at once (default: the over-sampled batch)"
    )
    buffer_size: int | None = Field(
        None, ge=1, description="cap on groups not yet final (waiting, running, completed)"
    )
    drop_zero_variance: bool = Field(
        False, description="filter groups whose rewards are all equal (dynamic sampling)"
    )
    tail_after: int = Field(
        2, ge=1, description="expirations after which a group joins the tail batch"
    )
    tail_batch_size: int = Field(
        0,
        ge=0,
        description="tail groups that trigger a tail batch, run to the end without expiry "
        "(AsyncProducer; 0 = off)",
    )

    @property
    def launch_width(self) -> int:
        """Groups launched per step: the batch plus the over-sampling margin."""
        return math.ceil(self.batch_size * (1 + self.over_sample_threshold))

    @property
    def in_flight_limit(self) -> int:
        return self.max_in_flight or self.launch_width
