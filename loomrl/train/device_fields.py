"""``TrainConfig``'s device fields (where the learner trains, how its steps are cut, how
many processes share it, how weights reach the engines, whether the engine shares the
learner's device), defined here so the config module stays one screen per
concern; ``docs/training.md`` ("Devices") explains each."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

Budget = Annotated[int, Field(ge=1)] | Literal["auto"]

DEVICE: Any = Field(
    "auto", description="the learner's device: 'auto' is the GPU when there is one, else cpu"
)
GRADIENT_CHECKPOINTING: Any = Field(
    False, description="recompute activations in backward (less memory, ~30% more compute)"
)
COMPILE: Any = Field(False, description="torch.compile the policy's decoder")
LEARNER_WORLD_SIZE: Any = Field(
    1, ge=1, description="learner processes (FSDP2: weights, gradients and AdamW sharded)"
)
MICRO_BATCH_TOKENS: Any = Field(
    "auto",
    description="tokens per forward/backward ('auto': what the run's memory plan leaves for "
    "activations, loomrl.train.memory_plan)",
)
WEIGHT_SYNC: Any = Field(
    "transfer",
    description="weights to engines: vLLM's transfer API over TCP (any host), its NCCL or "
    "CUDA IPC backends (GPU engines), or a shared file",
)
Colocate = bool | Literal["auto"]

COLOCATE: Any = Field(
    "auto",
    description="the in-process engine sleeps (vLLM sleep mode) while the learner trains "
    "('auto': on where one GPU holds the learner and the engine and the settings allow it)",
)
SLEEP_LEVEL: Any = Field(
    1, description="colocate's vLLM sleep level: 1 keeps the weights on the host, 2 drops them"
)
