"""``[ray]`` in a run's TOML (``--ray`` on the CLI): where the Ray cluster is, how many
engine actors serve the model and on what resources, where environments run, and where a
training run's learner ranks run."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RayConfig(BaseModel):
    """Engine replicas and environments as Ray actors (docs/distributed.md)."""

    model_config = ConfigDict(extra="forbid")

    address: str = Field(
        "local",
        min_length=1,
        description="'local' starts a Ray cluster on this machine for the run; 'auto' joins "
        "the one `ray start --head` started here; HOST:6379 or ray://HOST:10001 one elsewhere",
    )
    engine_actors: int = Field(1, ge=1, description="engine replicas, one Ray actor each")
    engine_cpus: float = Field(1.0, ge=0, description="CPUs Ray reserves per engine actor")
    engine_gpus: float = Field(
        0.0, ge=0, description="GPUs per engine actor (1 on GPU nodes: vLLM uses the one Ray gives)"
    )
    placement: Literal["pack", "spread"] | None = Field(
        None,
        description="reserve the engine actors as one placement group: 'pack' (fewest nodes) "
        "or 'spread' (across nodes); none: Ray places each actor",
    )
    env_placement: Literal["local", "ray"] = Field(
        "local",
        description="'ray': each task's environment runs in env_actors Ray actors (heavy "
        "environments); 'local': in the rollout's process",
    )
    env_actors: int = Field(
        2, ge=1, description="Ray actors per environment (with env_placement = 'ray')"
    )
    env_cpus: float = Field(0.5, ge=0, description="CPUs Ray reserves per env actor")
    on_env_actor_death: Literal["fail", "retry"] = Field(
        "retry",
        description="an env actor died: 'retry' moves its episodes to another actor from their "
        "last checkpointed turn; 'fail' ends them with status error",
    )
    object_store_gib: float = Field(
        1.0, gt=0, description="object store of a local cluster (weights pass through it)"
    )
    learner_ranks: Literal["local", "cluster"] = Field(
        "local",
        description="learner ranks 1..N-1 (learner_world_size = N): 'local' as processes the "
        "driver starts on its host; 'cluster' as Ray actors in a placement group spread over "
        "the nodes, one GPU each (one CPU on CPU learners), the driver holding rank 0",
    )

    @model_validator(mode="after")
    def _ranks_reach_the_driver(self) -> RayConfig:
        """Ranks on the cluster meet the driver at its own address: a Ray Client driver
        (``ray://``) is not on any node of the cluster."""
        if self.learner_ranks == "cluster" and self.address.startswith("ray://"):
            raise ValueError(
                f"learner_ranks = 'cluster' meets the learner ranks at the driver's address, "
                f"but {self.address!r} is Ray Client (the driver is off the cluster): run "
                "loomrl on a node of the cluster with address = 'auto' or HOST:6379"
            )
        return self
