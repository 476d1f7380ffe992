"""``--ray``, ``--engine-actors``, ``--env-actors`` over a run's ``[ray]`` table, and the
config's refusal of an in-process engine spec beside Ray (no cluster is started)."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from loomrl.cli import ray_flags
from loomrl.cli.checks import load_config
from loomrl.cli.output import UsageError
from loomrl.config import RolloutConfig
from loomrl.distributed.config import RayConfig
from loomrl.models import DEFAULT_MODEL


def flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ray_flags.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_no_flags_leave_the_config_alone():
    config = RolloutConfig()
    assert ray_flags.with_ray_flags(config, flags()) is config and config.ray is None


@pytest.mark.parametrize("argv", [["--engine-actors", "2"], ["--env-actors", "3"]])
def test_actor_counts_need_ray(argv):
    with pytest.raises(UsageError, match=f"^{argv[0]} needs --ray"):
        ray_flags.with_ray_flags(RolloutConfig(), flags(*argv))


@pytest.mark.parametrize("flag", ["--engine-actors", "--env-actors"])
def test_a_zero_count_names_the_flag(flag):
    with pytest.raises(UsageError, match=f"^{flag} 0: .*greater than or equal to 1"):
        ray_flags.with_ray_flags(RolloutConfig(), flags("--ray", flag, "0"))


def test_flags_set_the_ray_table():
    ray = ray_flags.with_ray_flags(RolloutConfig(), flags("--ray")).ray
    assert ray == RayConfig()  # a local cluster, one engine actor, envs in process
    ray = ray_flags.with_ray_flags(RolloutConfig(), flags("--ray", "auto", "--env-actors", "3")).ray
    assert (ray.address, ray.env_actors, ray.env_placement) == ("auto", 3, "ray")


def test_ray_address_keeps_the_tables_other_fields(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        'env = "arith"\n[ray]\naddress = "auto"\nengine_actors = 3\nengine_gpus = 1.0\n'
        'env_placement = "ray"\non_env_actor_death = "fail"\n'
    )
    config = load_config(RolloutConfig, path, {})
    ray = ray_flags.with_ray_flags(config, flags("--ray", "10.0.0.5:6379")).ray
    assert ray.address == "10.0.0.5:6379"
    assert (ray.engine_actors, ray.engine_gpus, ray.env_placement) == (3, 1.0, "ray")
    assert ray.on_env_actor_death == "fail"
    # Without --ray, an actor count alone applies to the file's table.
    ray = ray_flags.with_ray_flags(config, flags("--engine-actors", "5")).ray
    assert (ray.address, ray.engine_actors, ray.engine_gpus) == ("auto", 5, 1.0)


def test_an_in_process_engine_beside_ray_is_refused():
    with pytest.raises(ValueError, match=f"engines lists '{DEFAULT_MODEL}' beside \\[ray\\]"):
        RolloutConfig(engines=[DEFAULT_MODEL, DEFAULT_MODEL], ray=RayConfig())
    replicas = RolloutConfig(engines=[DEFAULT_MODEL, DEFAULT_MODEL])
    with pytest.raises(UsageError, match=r"ray\.engine_actors") as caught:
        ray_flags.with_ray_flags(replicas, flags("--ray"))
    assert f"engines lists '{DEFAULT_MODEL}' beside [ray]" in str(caught.value)
    # Server URLs may join the engine actors' pool.
    served = RolloutConfig(engines=["http://10.0.0.7:8000"], ray=RayConfig())
    assert served.engines == ["http://10.0.0.7:8000"]


def test_an_empty_ray_address_is_refused():
    with pytest.raises(ValidationError, match="address"):
        RayConfig(address="")
