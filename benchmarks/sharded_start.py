"""Two learner ranks on this CPU (gloo): host memory of a sharded start, and the peak
tensor memory of the chunked head against full logits.

**Start.** A random Qwen2-shaped model (``--hidden``, ``--layers``, ``--vocab``; untied
head) is written to a temporary directory in bf16, as models on the Hub are, then two
ranks load it in float32 (the learner's master weights) in each of two ways: every rank
reads the whole model and shards it (``fully_shard`` over loaded weights), or every rank
builds it on the meta device, shards it, and rank 0 alone reads it and broadcasts it
(``loomrl.train.sharding.shard_from_rank0``, what ``loomrl train`` does).
Each rank reports its resident memory (``VmRSS``) before loading (the modelling code
already imported) and its peak (``VmHWM``, reset just before) while loading.

**Head.** A smaller model with a large vocabulary (``--head-vocab``, hidden 256, two
layers, tied head) is loaded sharded, and one packed micro-batch of ``--tokens`` tokens
runs forward and backward (float32, every token scored) twice: with the chunked,
logits-free head (``loomrl.experience.token_scores``, 1,024 rows a chunk) and with full
logits. Rank 0 reports torch's memory tracker's peak of the tensors alive
(``torch.distributed._tools.mem_tracker.MemTracker``: every tensor made under it, by
storage; the CPU has no allocator statistics).

    python benchmarks/sharded_start.py [--hidden 512] [--layers 8] [--vocab 32000]
        [--head-vocab 32000] [--tokens 4096]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

MiB = 1 << 20


def memory(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def start(model_dir: str, how: str, rank: int) -> dict[str, int]:
    """Load ``model_dir`` sharded, ``how`` = ``every`` rank reading it or rank ``0``."""
    import torch

    from loomrl.models.loading import empty_lm, load_lm
    from loomrl.train.sharding import shard, shard_from_rank0

    empty_lm(model_dir, torch.float32)  # the modelling code imported before the baseline
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from now
    before = memory("VmRSS")
    if how == "every":
        model = load_lm(model_dir, torch.float32)
        shard(model)
    else:
        source = load_lm(model_dir, torch.float32) if rank == 0 else None
        model = empty_lm(model_dir, torch.float32)
        shard_from_rank0(model, source, torch.device("cpu"))
        del source
    gc.collect()
    return {"before": before, "peak": memory("VmHWM"), "after": memory("VmRSS")}


def head(model_dir: str, tokens: int, rank: int) -> dict[str, dict[str, int]]:
    """Peak tracked tensor bytes of one forward and backward pass, chunked and full."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from loomrl.experience import forward_logprobs, logprobs, micro_batches, pack
    from loomrl.models.loading import empty_lm, load_lm
    from loomrl.train.sharding import shard_from_rank0
    from loomrl.types import Trajectory

    source = load_lm(model_dir, torch.float32) if rank == 0 else None
    model = empty_lm(model_dir, torch.float32)
    shard_from_rank0(model, source, torch.device("cpu"))
    del source
    g = torch.Generator().manual_seed(rank)
    each = tokens // 4
    vocab = model.config.vocab_size
    trajs = []
    for i in range(4):
        ids = torch.randint(3, vocab, (each,), generator=g).tolist()
        trajs.append(
            Trajectory(i, i, 0, "t", ids[:1], ids[1:], [0.0] * (each - 1), [1] * (each - 1))
        )
    (mb,) = micro_batches(pack(trajs), max_tokens=10**9)
    plain_head, out = logprobs.plain_head, {}
    for how in ("chunked", "logits"):
        if how == "logits":
            logprobs.plain_head = lambda model: None
        model.zero_grad(set_to_none=True)
        tracker = MemTracker()
        with tracker:
            forward_logprobs(model, mb).sum().backward()
        logprobs.plain_head = plain_head
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
        out[how] = {str(getattr(k, "value", k)): int(v) for k, v in peak.items()}
    return out


def rank_main(job: Path, rank: int) -> None:
    import torch.distributed as dist

    spec = json.loads((job / "job.json").read_text())
    dist.init_process_group("gloo", init_method=f"file://{job / 'rdv'}", rank=rank, world_size=2)
    try:
        if spec["part"] == "start":
            result: Any = start(spec["model"], spec["how"], rank)
        else:
            result = head(spec["model"], spec["tokens"], rank)
        (job / f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run(where: Path, name: str, spec: dict[str, Any]) -> list[Any]:
    """Two ranks of this script on ``spec``; each rank's result."""
    job = where / name
    job.mkdir()
    (job / "job.json").write_text(json.dumps(spec))
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    args = [sys.executable, __file__, "--rank-of", str(job)]
    procs = [subprocess.Popen([*args, str(r)], env=env) for r in range(2)]
    try:
        codes = [p.wait() for p in procs]  # a rank that fails fails the other's collective
    finally:
        for p in procs:  # interrupted: no rank left waiting in a collective
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        raise SystemExit(f"{name}: a rank failed (exit status {codes})")
    return [json.loads((job / f"rank{r}.json").read_text()) for r in range(2)]


def write_model(path: Path, vocab: int, hidden: int, layers: int, tied: bool) -> int:
    """A random Qwen2-shaped model in ``path``, saved in bf16 as models on the Hub are (a
    float32 learner converts it as it loads); its size in float32, in bytes."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=2,
        max_position_embeddings=8192, tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    model.to(torch.bfloat16).save_pretrained(path)
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--head-vocab", type=int, default=32000)
    parser.add_argument("--tokens", type=int, default=4096)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        size = write_model(where / "model", args.vocab, args.hidden, args.layers, tied=False)
        print(f"model: {size / MiB:.0f} MiB in float32 ({args.layers} layers, hidden "
              f"{args.hidden}, vocabulary {args.vocab:,}, untied head; bf16 on disk)")  # fmt: skip
        print("| start | rank 0 peak growth | rank 1 peak growth | sum |\n|---|---|---|---|")
        for how, label in (("every", "every rank reads the model"), ("0", "rank 0 reads it")):
            ranks = run(where, how, {"part": "start", "model": str(where / "model"), "how": how})
            grown = [(r["peak"] - r["before"]) / MiB for r in ranks]
            print(f"| {label} | {grown[0]:.0f} MiB | {grown[1]:.0f} MiB | {sum(grown):.0f} MiB |")
        write_model(where / "head", args.head_vocab, 256, 2, tied=True)
        spec = {"part": "head", "model": str(where / "head"), "tokens": args.tokens}
        peaks = run(where, "head-run", spec)[0]
        print(f"\nhead: {args.tokens:,} tokens, vocabulary {args.head_vocab:,}, hidden 256, "
              "2 layers, float32; rank 0's tracked peak")  # fmt: skip
        print("| head | peak | activations | temporaries |\n|---|---|---|---|")
        for how in ("chunked", "logits"):
            p = peaks[how]
            print(f"| {how} | {p['Total'] / MiB:.0f} MiB | {p['Activation'] / MiB:.0f} MiB "
                  f"| {p['Temp'] / MiB:.0f} MiB |")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--rank-of":
        rank_main(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
