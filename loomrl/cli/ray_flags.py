"""``--ray [ADDRESS]``, ``--engine-actors N``, ``--env-actors N``: a run's ``[ray]`` table
from the command line, over the config file's own (docs/distributed.md)."""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from loomrl.cli.output import UsageError
from loomrl.config import describe

FLAGS = {"address": "--ray", "engine_actors": "--engine-actors", "env_actors": "--env-actors"}
Config = TypeVar("Config", bound=BaseModel)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ray", nargs="?", const="local", metavar="ADDRESS",
        help="run the engines as Ray actors: alone, on a Ray cluster started for the run "
        "on this machine; 'auto' or HOST:6379 joins a running one (`ray start --head`)",
    )  # fmt: skip
    parser.add_argument(
        "--engine-actors", type=int, metavar="N", help="engine replicas as Ray actors (default 1)"
    )
    parser.add_argument(
        "--env-actors", type=int, metavar="N",
        help="run the environments' episodes in N Ray actors each (env_placement = 'ray')",
    )  # fmt: skip


def ray_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The ``[ray]`` fields the flags set."""
    fields: dict[str, Any] = {}
    if args.ray is not None:
        fields["address"] = args.ray
    if args.engine_actors is not None:
        fields["engine_actors"] = args.engine_actors
    if args.env_actors is not None:
        fields["env_actors"] = args.env_actors
        fields["env_placement"] = "ray"
    return fields


def with_ray_flags(config: Config, args: argparse.Namespace) -> Config:
    """``config`` with the Ray flags applied over its ``[ray]`` table (if any)."""
    from loomrl.distributed.config import RayConfig

    flags = ray_flags(args)
    if not flags:
        return _installed(config)
    base = getattr(config, "ray", None)
    if base is None and "address" not in flags:
        first = FLAGS[next(k for k in flags if k in FLAGS)]
        raise UsageError(f"{first} needs --ray (or a [ray] table in the config file)")
    fields = base.model_dump(exclude_defaults=True) if base is not None else {}
    try:
        ray = RayConfig.model_validate({**fields, **flags})
    except ValidationError as exc:
        named = {k: f"{FLAGS[k]} {v}" for k, v in flags.items() if k in FLAGS}
        raise UsageError(describe(exc, "ray", named, RayConfig)) from None
    try:
        return _installed(type(config).model_validate({**config.model_dump(), "ray": ray}))
    except ValidationError as exc:
        raise UsageError(describe(exc, None, {"ray": "--ray"}, type(config))) from None


def _installed(config: Config) -> Config:
    """``config``, once Ray is known to be importable when it asks for Ray."""
    if getattr(config, "ray", None) is not None and importlib.util.find_spec("ray") is None:
        raise UsageError(
            "this run uses Ray (--ray or [ray]) but Ray is not installed: pip install 'loomrl[ray]'"
        )
    return config
