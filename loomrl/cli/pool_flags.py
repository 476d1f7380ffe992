"""``--routing``, ``--probe-interval``, ``--request-timeout``, ``--max-inflight``: a run's
``[pool]`` table from the command line, over the config file's own (docs/scaling-out.md)."""

from __future__ import annotations

import argparse
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from loomrl.cli.output import UsageError
from loomrl.config import describe
from loomrl.engines.pool import ROUTINGS
from loomrl.engines.pool_config import PoolConfig

FLAGS = {
    "routing": "--routing", "probe_interval": "--probe-interval",
    "request_timeout": "--request-timeout", "max_inflight": "--max-inflight",
}  # fmt: skip
Config = TypeVar("Config", bound=BaseModel)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--routing", choices=ROUTINGS,
        help="how a pool of replicas routes requests (default affinity)",
    )  # fmt: skip
    parser.add_argument(
        "--probe-interval", type=float, metavar="S",
        help="seconds between a pool's health probes (default 2)",
    )  # fmt: skip
    parser.add_argument(
        "--request-timeout", type=float, metavar="S",
        help="seconds one request to a server may take before it fails over (default 600)",
    )  # fmt: skip
    parser.add_argument(
        "--max-inflight", type=int, metavar="N", help="requests one replica holds at most"
    )


def with_pool_flags(config: Config, args: argparse.Namespace) -> Config:
    """``config`` with the pool flags applied over its ``[pool]`` table."""
    flags: dict[str, Any] = {k: getattr(args, k) for k in FLAGS if getattr(args, k) is not None}
    if not flags:
        return config
    base = getattr(config, "pool", PoolConfig())
    try:
        pool = PoolConfig.model_validate({**base.model_dump(exclude_defaults=True), **flags})
    except ValidationError as exc:
        named = {k: f"{FLAGS[k]} {v}" for k, v in flags.items()}
        raise UsageError(describe(exc, "pool", named, PoolConfig)) from None
    return type(config).model_validate({**config.model_dump(), "pool": pool})
