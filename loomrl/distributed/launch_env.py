"""The standard environment a launcher gives each process it starts (``torchrun``, a
Slurm script that sets it, ``torch.distributed.run``): ``MASTER_ADDR``, ``MASTER_PORT``,
``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``. Read only: nothing here joins a group.

``local_rank()`` is this process's device index on its host for every way learner ranks
start: the launcher's ``LOCAL_RANK``, the one loomrl sets for the ranks it starts itself
(a local subprocess: its rank; a Ray actor: 0, the one GPU Ray gives it), else 0.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

NAMES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class LaunchEnv:
    """One process of a launched group, as its environment describes it."""

    master_addr: str
    master_port: int
    rank: int
    world_size: int
    local_rank: int

    @property
    def driver(self) -> bool:
        """Rank 0 drives the run (rollouts, engine, run directory); the others serve it."""
        return self.rank == 0


def launched(env: Mapping[str, str] | None = None) -> LaunchEnv | None:
    """The launcher's description of this process when it started several (``WORLD_SIZE
    > 1``), else None. A partial or malformed set is a ``ValueError`` naming the variable."""
    env = os.environ if env is None else env
    if int(_number(env, "WORLD_SIZE", "1")) <= 1:
        return None
    missing = [name for name in NAMES[:4] if not env.get(name)]
    if missing:
        raise ValueError(
            f"WORLD_SIZE={env['WORLD_SIZE']} but {', '.join(missing)} is not set: start the "
            "processes with torchrun (or set all of MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)"
        )
    found = LaunchEnv(
        env["MASTER_ADDR"], int(_number(env, "MASTER_PORT")), int(_number(env, "RANK")),
        int(_number(env, "WORLD_SIZE")), int(_number(env, "LOCAL_RANK", "0")),
    )  # fmt: skip
    if not 0 <= found.rank < found.world_size:
        raise ValueError(f"RANK={found.rank} is outside WORLD_SIZE={found.world_size}")
    return found


def local_rank() -> int:
    """This process's device index on its host (see the module docstring)."""
    return int(_number(os.environ, "LOCAL_RANK", "0"))


def _number(env: Mapping[str, str], name: str, default: str | None = None) -> str:
    value = env.get(name, default)
    if value is None or not value.strip().isdigit():
        raise ValueError(f"{name}={value!r} is not a non-negative integer")
    return value.strip()
