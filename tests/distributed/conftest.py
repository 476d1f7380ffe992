"""One local Ray cluster per test session (per xdist worker) for every Ray test, in a
temp dir of its own, and a check on the way out that no process it started outlives it
(``ray_cluster.ray_tmpdir``).

The cluster's workers get this folder and the entry points of ``ray_parts.install`` on
their ``PYTHONPATH`` (set only while ``connect`` starts the cluster: the raylet and its
workers inherit it, the rest of the session does not see it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray_parts
from ray_cluster import ray_tmpdir

from loomrl.distributed.cluster import connect

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A Ray cluster this process started (8 logical CPUs, a 0.5 GiB object store);
    closed after the session, and then none of its processes may be left."""
    plugins = ray_parts.install(tmp_path_factory.mktemp("ray_plugins"))
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "RAY_ADDRESS")}
    paths = (str(plugins), str(HERE), saved["PYTHONPATH"])
    with ray_tmpdir():
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        # A local cluster is the run's own, even where RAY_ADDRESS names another (here: a
        # port nobody listens on, which ray.init would otherwise try to join).
        os.environ["RAY_ADDRESS"] = "127.0.0.1:9"
        try:
            cluster = connect(None, num_cpus=8, object_store_gib=0.5)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        try:
            assert cluster.started, f"joined a Ray cluster at {cluster.address} instead"
            yield cluster
        finally:
            cluster.close()
