"""One local Ray cluster per test session (per xdist worker) for every Ray test, and a
check on the way out that no process it started outlives it.

The cluster's workers get this folder and the entry points of ``ray_parts.install`` on
their ``PYTHONPATH`` (set only while ``connect`` starts the cluster: the raylet and its
workers inherit it, the rest of the session does not see it)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import psutil
import pytest
import ray_parts

HERE = Path(__file__).parent
EXIT_S = 15.0  # how long the cluster's processes may take to exit after close()


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    left = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc)
        except psutil.Error:
            pass
    return left


def _describe(procs: list[psutil.Process]) -> str:
    shown = []
    for proc in procs:
        try:
            shown.append(f"{proc.pid} {proc.name()}")
        except psutil.Error:
            shown.append(f"{proc.pid} (gone)")
    return ", ".join(shown)


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A Ray cluster this process started (8 logical CPUs, a 0.5 GiB object store);
    closed after the session, and then none of its processes may be left."""
    try:
        import ray  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":  # CI installs loomrl[ray]: a skip would hide it
            pytest.fail("Ray is not installed on CI")
        pytest.skip("Ray is not installed (pip install 'loomrl[ray]')")
    from loomrl.distributed.cluster import connect

    plugins = ray_parts.install(tmp_path_factory.mktemp("ray_plugins"))
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "RAY_ADDRESS")}
    paths = (str(plugins), str(HERE), saved["PYTHONPATH"])
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
    started = [p for p in me.children(recursive=True) if p.pid not in before]
    try:
        assert cluster.started, f"joined a Ray cluster at {cluster.address} instead of starting one"
        assert any("raylet" in p.name() for p in started), _describe(started)
        yield cluster
    finally:
        # The actors' workers started since then are the raylet's children.
        for proc in list(started):
            with contextlib.suppress(psutil.Error):
                started += proc.children(recursive=True)
        cluster.close()
        _, alive = psutil.wait_procs(_alive(list({p.pid: p for p in started}.values())), EXIT_S)
        left = _alive(alive)
        for proc in left:  # do not leave them to the next session either
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        assert not left, f"Ray processes still running {EXIT_S:.0f} s after close(): " + (
            _describe(left)
        )
