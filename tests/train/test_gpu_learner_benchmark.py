"""``benchmarks/gpu_learner.py --tiny``: the GPU learner benchmark runs on the CPU through
the same API as on a GPU, so it never falls behind the code it measures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_learner_benchmark_runs_tiny_on_the_cpu(tmp_path):
    out = tmp_path / "records.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_learner.py"), "--tiny", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = json.loads(out.read_text())
    checks = {r["check"] for r in records}
    assert {
        "logprobs_vs_naive",
        "grad_vs_plain",
        "learner_step",
        "plain_step",
        "default_step",
    } <= checks
    assert all(r["ok"] for r in records if "ok" in r)
    steps = [r for r in records if r["check"] == "learner_step"]
    assert {(r["size"], r["layout"]) for r in steps} == {
        (size, layout) for size in ("tiny", "tiny2") for layout in ("padded", "packed")
    }
    for r in steps:
        assert r["tokens_per_s"] > 0 and r["finite"] and r["predicted_peak_gib"] > 0
    # host syncs: the same at every micro-batch budget, and the default step's within 10
    assert len({r["host_syncs"] for r in steps}) == 1, [r["host_sync_sites"] for r in steps]
    (default,) = [r for r in records if r["check"] == "default_step"]
    assert default["host_syncs"] <= 10 and default["finite"]
    summary = records[-1]
    assert summary["check"] == "summary" and not summary["errors"] and not summary["failed"]
    assert summary["targets"]["tokens_per_s_0.5b"][1] == "pending"  # GPU figures: not here
