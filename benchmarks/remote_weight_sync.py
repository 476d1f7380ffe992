"""What a weight update through a vLLM server costs (``RemoteEngine.update_weights``):
write the weights to /dev/shm, ``/pause``, ``/collective_rpc loomrl_load_weights``,
``/reset_prefix_cache``, ``/resume``. Starts one server with ``start_server``.

    python benchmarks/remote_weight_sync.py [--model smollm2-135m-instruct] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

import torch
from transformers import AutoModelForCausalLM

from loomrl.engines.remote import RemoteEngine
from loomrl.engines.serve import free_port, start_server
from loomrl.models import resolve


async def measure(url: str, model: str, rounds: int) -> list[float]:
    weights = AutoModelForCausalLM.from_pretrained(resolve(model), dtype=torch.float32).state_dict()
    async with RemoteEngine(url, model=model) as engine:
        return [await engine.update_weights(weights) for _ in range(rounds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with start_server(args.model, port=free_port(), kv_cache_gib=1, max_len=1024) as server:
        seconds = asyncio.run(measure(server.url, args.model, args.rounds))
    print(f"{args.model}: update_weights " + ", ".join(f"{s:.2f}" for s in seconds)
          + f" s (median {statistics.median(seconds):.2f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
