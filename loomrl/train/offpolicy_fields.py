"""``TrainConfig``'s off-policy fields (sampler truncation replayed by the learner, the
named correction, PPO mini-batch hygiene, dynamic sampling), defined here so the config
module stays one screen per concern; ``docs/training.md`` explains each."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

Correction = Literal["tis", "mis", "icepop", "seq_tis", "seq_mask", "geo_mask", "none"]

TOP_P: Any = Field(
    1.0, gt=0, le=1, description="sampling nucleus; the learner scores under the same cut"
)
TOP_K: Any = Field(-1, ge=-1, description="sampling top-k (-1: off); replayed by the learner")
MIN_P: Any = Field(0.0, ge=0, lt=1, description="sampling min-p; replayed by the learner")
CORRECTION: Any = Field(
    "tis",
    description="off-policy correction of the sampler gap (loomrl.algos.corrections); "
    "is_cap is the cap of tis / seq_tis / mis",
)
CORRECTION_LOW: Any = Field(
    None, ge=0, description="lower bound of icepop / seq_mask / geo_mask (None: its default)"
)
CORRECTION_HIGH: Any = Field(
    None, gt=0, description="upper bound of icepop / seq_mask / geo_mask (None: its default)"
)
DUAL_CLIP: Any = Field(
    None, gt=1, description="pg: cap the loss of A < 0 tokens at -A·c (verl: 3; None: off)"
)
SHUFFLE: Any = Field(True, description="reshuffle samples into mini-batches every PPO epoch")
DYNAMIC_SAMPLING: Any = Field(
    False,
    description="DAPO's dynamic sampling: groups whose rewards all agree are dropped as they "
    "finish and others drawn in their place, until the batch is full",
)
MAX_DRAW_BATCHES: Any = Field(
    10, ge=1, description="dynamic sampling draws at most this many batches' worth of groups "
    "per step (over the run; DAPO's max_num_gen_batches)",
)  # fmt: skip
