"""Learner ranks on a Ray cluster (``[ray] learner_ranks = "cluster"``), on a test cluster
of two Ray nodes (one CPU each) whose processes this module started: the driver (rank 0)
and a rank on the other node take exactly the step one process takes, a rank whose actor
dies is named by the next order, and a SIGKILLed driver leaves none of its processes on
either node."""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from ray_cluster import ray_processes, ray_tmpdir
from ray_rank_parts import CONFIG, policy, reference, write_job

from loomrl.distributed.config import RayConfig
from loomrl.train.checkpoint import latest_checkpoint
from loomrl.train.learner import Learner, LearnerConfig

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(300)]
TESTS = Path(__file__).resolve().parents[1]
DRIVER = TESTS / "ray_rank_driver.py"
MB = 2**20


@pytest.fixture(scope="module")
def two_nodes():
    """A head and a second node, one CPU each (every process of them checked gone after);
    yields the cluster's address and its temp dir."""
    from ray.cluster_utils import Cluster

    before = os.environ.get("PYTHONPATH")
    with ray_tmpdir() as root:
        # The nodes' workers import the tests' actor parts (ray_rank_parts).
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), before) if p)
        try:
            nodes = dict(num_cpus=1, object_store_memory=80 * MB)
            cluster = Cluster(
                initialize_head=True, connect=False,
                head_node_args={**nodes, "include_dashboard": False},
            )  # fmt: skip
            cluster.add_node(**nodes)
        finally:
            if before is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = before
        try:
            yield cluster.address, root
        finally:
            cluster.shutdown()


def driver(mode: str, address: str, where: Path) -> subprocess.Popen[bytes]:
    """The driver script in a session of its own, on one thread (as the rank actor)."""
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(DRIVER), mode, address, str(where)]
    return subprocess.Popen(cmd, env=env, start_new_session=True)


def actors(root: Path, name: str) -> list[psutil.Process]:
    """The cluster's processes running an actor of class ``name``."""
    found = []
    for proc in ray_processes(root):
        try:
            if f"ray::{name}" in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_two_ranks_on_two_nodes_take_the_step_of_one_process(two_nodes, tmp_path):
    address, _ = two_nodes
    batch = write_job(tmp_path)
    child = driver("grads", address, tmp_path)
    try:
        assert child.wait(timeout=240) == 0
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    sharded = torch.load(tmp_path / "out.pt", weights_only=False)
    assert sharded["rank_nodes"] != [sharded["driver_node"]]  # rank 1 ran on the other node

    # Every process computes on one thread (Ray gives its one-CPU actor one): fp32 sums
    # in another thread count's order differ by ~1e-6 on this model's largest gradients.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = Learner(copy.deepcopy(policy()), LearnerConfig(**CONFIG), reference())
        metrics = one.step(batch)
    finally:
        torch.set_num_threads(threads)
    assert metrics["micro_batches"] == sharded["metrics"]["micro_batches"] == 5
    for key in ("loss", "kl", "grad_norm"):
        assert sharded["metrics"][key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-7), key
    for name, param in one.model.named_parameters():
        assert (sharded["grads"][name] - param.grad).abs().max() <= 1e-6, name
    # Its actor killed, rank 1 is named by the next order, before any collective waits.
    assert re.fullmatch(
        r"learner rank 1 \(Ray actor pid \d+ on \S+\) exited: its process died \(.*\)",
        sharded["dead"],
    ), sharded["dead"]


def test_a_sigkilled_driver_leaves_no_rank_on_either_node(two_nodes, tmp_path):
    address, root = two_nodes
    out = tmp_path / "run"
    child = driver("train", address, out)
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints" / "step-000001" / "state.json").is_file():
            assert child.poll() is None, "training ended before it could be killed"
            assert time.monotonic() < deadline, "no first checkpoint within 240 s"
            time.sleep(0.05)
        ranks, engines = actors(root, "LearnerRankActor"), actors(root, "EngineActor")
        assert len(ranks) == 1 and len(engines) == 1  # rank 1; rank 0 is the driver itself
        os.kill(child.pid, signal.SIGKILL)  # the driver alone: Ray must end what it owned
        child.wait()
        _, alive = psutil.wait_procs(ranks + engines, timeout=30)
        assert not alive, f"outlived the SIGKILLed driver: {[p.pid for p in alive]}"
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert latest_checkpoint(out).step >= 1
    assert (latest_checkpoint(out).path / "optimizer" / ".metadata").is_file()  # two shards
    time.sleep(1.0)
    left = actors(root, "LearnerRankActor") + actors(root, "EngineActor")
    assert not left, f"actors of the killed run still on a node: {[p.pid for p in left]}"


def test_ranks_on_the_cluster_need_a_driver_on_the_cluster():
    with pytest.raises(ValueError, match="learner_ranks = 'cluster' meets the learner ranks"):
        RayConfig(address="ray://10.0.0.1:10001", learner_ranks="cluster")
    assert RayConfig(address="10.0.0.1:6379", learner_ranks="cluster").learner_ranks == "cluster"
