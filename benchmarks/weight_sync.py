"""What one weight sync costs, file vs transfer, in process and through a server.

``weight_sync = "file"`` writes the weights as one safetensors file (``/dev/shm``) that
vLLM's workers read; ``"transfer"`` streams them through vLLM's weight-transfer API into
loomrl's ``loomrl_tcp`` backend, bucket by bucket, writing nothing. Both are measured
side by side, alternating, on two in-process engines and on one ``loomrl serve`` server
(a client of each kind), each round a full ``update_weights`` (pause, load, clear the
prefix cache, resume). Bytes written are the weight files' sizes.

    python benchmarks/weight_sync.py [--model smollm2-135m-instruct] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from typing import Any

import safetensors.torch
import torch
from transformers import AutoModelForCausalLM

from loomrl.engines.remote import RemoteEngine
from loomrl.engines.serve import free_port, start_server
from loomrl.engines.vllm import VLLMEngine
from loomrl.models import resolve

WRITTEN: list[int] = []


def _counting_save_file(save: Any) -> Any:
    def save_file(tensors: Any, filename: str, *args: Any, **kwargs: Any) -> None:
        save(tensors, filename, *args, **kwargs)
        WRITTEN.append(os.path.getsize(filename))

    return save_file


async def rounds(engines: dict[str, Any], weights: dict[str, torch.Tensor], n: int) -> dict:
    """Per kind: seconds of each sync and bytes written per sync (alternating kinds)."""
    out: dict[str, dict[str, list[float]]] = {k: {"s": [], "bytes": []} for k in engines}
    for _ in range(n):
        for kind, engine in engines.items():
            WRITTEN.clear()
            out[kind]["s"].append(await engine.update_weights(weights))
            out[kind]["bytes"].append(float(sum(WRITTEN)))
    return out


def report(where: str, result: dict) -> None:
    for kind, row in result.items():
        median = statistics.median(row["s"])
        each = ", ".join(f"{s:.2f}" for s in row["s"])
        written = statistics.median(row["bytes"]) / 2**20
        print(f"{where:10s} {kind:9s} median {median:.2f} s ({each}); "
              f"written to disk {written:.0f} MiB per sync")  # fmt: skip
    ratio = statistics.median(result["file"]["s"]) / statistics.median(result["transfer"]["s"])
    print(f"{where:10s} transfer is {ratio:.2f}x as fast as file")


async def in_process(model: str, weights: dict[str, torch.Tensor], n: int) -> dict:
    engines = {kind: VLLMEngine(model, max_model_len=1024, kv_cache_gib=1, weight_sync=kind)
               for kind in ("file", "transfer")}  # fmt: skip
    try:
        return await rounds(engines, weights, n)
    finally:
        for engine in engines.values():
            await engine.close()


async def remote(url: str, model: str, weights: dict[str, torch.Tensor], n: int) -> dict:
    engines = {kind: RemoteEngine(url, model=model, weight_sync=kind)
               for kind in ("file", "transfer")}  # fmt: skip
    try:
        for engine in engines.values():
            await engine.check()
        return await rounds(engines, weights, n)
    finally:
        for engine in engines.values():
            await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    safetensors.torch.save_file = _counting_save_file(safetensors.torch.save_file)
    learner = AutoModelForCausalLM.from_pretrained(resolve(args.model), dtype=torch.float32)
    weights = learner.state_dict()
    size = sum(t.numel() * t.element_size() for t in weights.values()) / 2**20
    print(f"{args.model}: {len(weights)} tensors, {size:.0f} MiB in fp32 (the learner's)")
    report("in-process", asyncio.run(in_process(args.model, weights, args.rounds)))
    with start_server(args.model, port=free_port(), kv_cache_gib=1, max_len=1024) as server:
        report("remote", asyncio.run(remote(server.url, args.model, weights, args.rounds)))


if __name__ == "__main__":
    main()
