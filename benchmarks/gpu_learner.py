"""The learner on a GPU: tokens/s, MFU, peak memory (measured, and as the memory plan
predicted it) and host syncs per step, for Qwen2-0.5B and -1.5B shapes, padded and
packed, each packed attention path the machine has (flex attention; flash-attn where
installed), against a plain PyTorch step on the same model and batch.

The batch is 64 GRPO samples (groups of 8 sharing a prompt of 192-256 tokens, completions
of 64-1024 tokens, 1 in 8 at the maximum, every 4th multi-turn with mask-0 environment
tokens; ~50k tokens) -> ``make_experience(..., "grpo")``. The models are random, built
from a config (no download), in bf16 weights with bf16 autocast (``--numerics
bf16``) or fp32 master weights with bf16 autocast (``bf16-mixed``, TrainConfig's default
on a GPU). It also checks correctness where it runs (loomrl's logprobs against a naive
per-sequence forward; its gradient against the plain step's) and times the whole default
step with KL, GSPO, the critic, mismatch metrics and an off-policy correction
(``loomrl.train.step.learn_step``).

Host syncs are counted by ``loomrl.train.host_reads`` on one extra step (the timed steps
run without the counter). MFU is ``6·N·T / step_s / peak`` (N parameters, T real tokens;
peak: the card's dense bf16, 989 TFLOP/s on an H100). Every measurement is a JSON line;
``--out FILE`` keeps them all; the last lines are a table and the targets.

    python benchmarks/gpu_learner.py                  # a GPU: 0.5B and 1.5B, < 8 min on an H100
    python benchmarks/gpu_learner.py --tiny           # the CPU smoke run the suite makes
    bash scripts/gpu_check.sh                         # the device machine's one command
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _gpu_parts as parts
from _gpu_steps import default_step, plan_peak, token_tensors

START = time.perf_counter()
TARGETS = {"tokens_per_s_0.5b": 48_000, "mfu_1.5b": 0.25, "plan_error": 0.15, "host_syncs": 10}


class Run:
    """The measurements so far and what the phases share."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.records: list[dict[str, Any]] = []
        self.state: dict[str, Any] = {}

    def emit(self, check: str, **fields: Any) -> dict[str, Any]:
        record = {"check": check, **fields, "t": round(time.perf_counter() - START, 1)}
        print(json.dumps(record, default=str), flush=True)
        self.records.append(record)
        if self.args.out:
            with open(self.args.out + ".tmp", "w") as f:
                json.dump(self.records, f, indent=1, default=str)
            os.replace(self.args.out + ".tmp", self.args.out)
        return record

    def left(self) -> float:
        return self.args.budget - (time.perf_counter() - START)

    def phase(self, name: str, need_s: float, fn: Callable[..., Any], *a: Any) -> bool:
        """``fn(self, *a)`` unless the budget is short; a failure is a record, not the end."""
        if self.left() < need_s:
            self.emit(
                "skipped", phase=name, reason=f"{self.left():.0f} s left, needs ~{need_s:.0f}"
            )
            return False
        try:
            fn(self, *a)
            return True
        except Exception as exc:  # one failure must not hide the other measurements
            lines = traceback.format_exc().strip().splitlines()[-12:]
            self.emit(
                "error", phase=name, error=f"{type(exc).__name__}: {exc}"[:600], traceback=lines
            )
            parts.release(self.device)
            return False


@contextlib.contextmanager
def packed_attention(name: str | None) -> Iterator[None]:
    """Packed micro-batches under attention ``name`` (None: loomrl's own choice)."""
    from loomrl.experience import attention

    if name is None:
        yield
        return
    saved = attention.choose
    attention.choose = lambda device, dtype: name  # type: ignore[assignment]
    try:
        yield
    finally:
        attention.choose = saved  # type: ignore[assignment]


def attention_paths(device: torch.device) -> list[str | None]:
    """The packed attention paths worth timing here."""
    from loomrl.experience import attention

    if device.type != "cuda":
        return [None]
    paths: list[str | None] = [attention.FLEX]
    if attention.flash_attn_available():
        paths.append(attention.FLASH)
    return paths


def phase_env(run: Run) -> None:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": str(run.device),
        "argv": sys.argv[1:],
    }
    if run.device.type == "cuda":
        props = torch.cuda.get_device_properties(run.device)
        info.update(
            gpu=props.name,
            gpu_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
            peak_flops=parts.peak_flops(run.device),
        )
    import transformers

    from loomrl.experience import attention

    info.update(
        transformers=transformers.__version__,
        attention_paths=[p or "loomrl's choice" for p in attention_paths(run.device)],
        flash_attn=attention.flash_attn_available(),
    )
    run.emit("env", **info)


def phase_data(run: Run, size: str) -> None:
    from loomrl.experience import make_experience

    shape = parts.BatchShape(*run.args.batch_shape)
    trajs = parts.trajectories(shape, parts.SIZES[size][5], run.args.seed)
    exp = make_experience(trajs, "grpo")
    padded, packed = exp.padded(pad_token_id=0), exp.packed()
    run.state.update(trajs=exp.trajectories, padded=padded, packed=packed)
    run.emit(
        "data",
        size=size,
        samples=padded.num_samples,
        tokens=parts.tokens_of(padded),
        trained_tokens=int(padded.loss_mask.sum()),
        padded_cells=int(padded.input_ids.numel()),
        padded_shape=list(padded.input_ids.shape),
        packed_shape=list(packed.input_ids.shape),
    )


def phase_model(run: Run, size: str) -> None:
    parts.release(run.device)
    dtype = torch.float32 if run.args.numerics != "bf16" else torch.bfloat16
    t0 = time.perf_counter()
    run.state["model"] = parts.causal_lm(size, run.device, dtype, run.args.seed)
    parts.synchronize(run.device)
    run.emit(
        "model",
        size=size,
        dtype=str(dtype),
        params=parts.parameters(run.state["model"]),
        build_s=round(time.perf_counter() - t0, 2),
        **parts.memory(run.device),
    )


def phase_checks(run: Run) -> None:
    """loomrl's logprobs (padded, packed) against a naive per-sequence forward, and one
    learner step's gradient against the plain step's on the same weights."""
    from loomrl.experience import compute_logprobs
    from loomrl.train.learner import Learner, LearnerConfig

    model, autocast = run.state["model"], run.args.autocast
    subset = run.state["trajs"][: run.args.check_samples]
    naive = parts.naive_logprobs(model, subset, autocast)
    worst = {}
    for layout in ("padded", "packed"):
        batch = run.state[layout]
        with parts.autocast_ctx(run.device, autocast):
            lp = compute_logprobs(model, batch, max_tokens=run.args.budgets[-1])
        mine = batch.per_sample(lp)[: len(subset)]
        worst[layout] = max(float((a - b).abs().max()) for a, b in zip(mine, naive, strict=True))
    tol = run.args.logprob_tol
    run.emit("logprobs_vs_naive", max_abs=worst, tolerance=tol, ok=max(worst.values()) <= tol)
    params = [p for p in model.parameters() if p.requires_grad]
    padded = run.state["padded"]
    rows = max(1, run.args.budgets[0] // padded.input_ids.shape[1])
    for layout in ("padded", "packed"):
        parts.baseline_step(model, None, padded, rows, autocast, step=False)
        base = [p.grad.detach().float().clone() for p in params]
        config = LearnerConfig(max_tokens=run.args.budgets[0], autocast=autocast)
        metrics = Learner(model, config).step(run.state[layout])
        dot = sum(float((g * p.grad.float()).sum()) for g, p in zip(base, params, strict=True))
        norms = [
            sum(float(x.float().pow(2).sum()) for x in xs) ** 0.5
            for xs in (base, [p.grad for p in params])
        ]
        cosine = dot / max(norms[0] * norms[1], 1e-30)
        run.emit(
            "grad_vs_plain",
            layout=layout,
            cosine=round(cosine, 8),
            grad_norm=metrics["grad_norm"],
            ok=parts.finite(metrics["loss"]) and 1 - cosine <= run.args.grad_tol,
        )
        model.zero_grad(set_to_none=True)
    parts.release(run.device)


def step_rates(run: Run, size: str, model: Any, batch: Any, times: list[float]) -> dict:
    """Step time, tokens/s and MFU of ``model`` on ``batch`` (``parts.rates``)."""
    hidden, layers = parts.SIZES[size][:2]
    flops = parts.attention_flops(batch, layers, hidden)
    params, tokens = parts.parameters(model), parts.tokens_of(batch)
    return parts.rates(times, tokens, params, flops, parts.peak_flops(run.device))


def phase_learner(run: Run, size: str, layout: str, budget: int, path: str | None) -> None:
    """``Learner.step`` timed; then one more step under the host-read counter."""
    from loomrl.train.host_reads import HostReads
    from loomrl.train.learner import Learner, LearnerConfig

    model, batch, autocast = run.state["model"], run.state[layout], run.args.autocast
    learner = Learner(model, LearnerConfig(max_tokens=budget, autocast=autocast))
    with packed_attention(path):
        times, outs, mem = parts.timed(
            lambda: learner.step(batch), run.device, 1, run.args.steps, run.args.cap
        )
        reads = HostReads()
        if run.device.type != "cuda":  # the CPU stands in for the device: say what lives there
            reads.place(model, learner.optimizer, token_tensors(batch))
        with reads:
            learner.step(batch)
    label = f"{size}/{run.args.numerics}/{layout}{'/' + path if path else ''}@{budget}"
    predicted = plan_peak(run, size, budget)
    measured = mem["peak_gib"]
    run.emit(
        "learner_step",
        label=label,
        size=size,
        layout=layout,
        attention=path,
        budget=budget,
        **step_rates(run, size, model, batch, times),
        **mem,
        predicted_peak_gib=predicted,
        plan_error=None
        if measured is None or predicted is None
        else round(predicted / measured - 1, 3),
        host_syncs=reads.total,
        host_sync_sites=dict(reads.sites),
        micro_batches=outs[-1]["micro_batches"],
        finite=all(parts.finite(o["loss"]) for o in outs),
    )
    learner = None  # frees its optimizer state (the timed lambda holds the name)
    model.zero_grad(set_to_none=True)
    parts.release(run.device)


def phase_plain(run: Run, size: str, budget: int) -> None:
    """The plain PyTorch step on the padded batch, rows = budget // width."""
    model, batch = run.state["model"], run.state["padded"]
    rows = max(1, budget // batch.input_ids.shape[1])
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    times, outs, mem = parts.timed(
        lambda: parts.baseline_step(model, optimizer, batch, rows, run.args.autocast),
        run.device,
        1,
        run.args.steps,
        run.args.cap,
    )
    run.emit(
        "plain_step",
        label=f"{size}/{run.args.numerics}/plain@{budget}",
        size=size,
        rows=rows,
        **step_rates(run, size, model, batch, times),
        **mem,
        finite=all(parts.finite(*o) for o in outs),
    )
    optimizer = None  # frees its state (the timed lambda holds the name)
    model.zero_grad(set_to_none=True)
    parts.release(run.device)


def phase_default_step(run: Run, size: str) -> None:
    run.emit("default_step", size=size, **default_step(run, size))
    parts.release(run.device)


def measure(run: Run) -> None:
    args = run.args
    run.phase("env", 0, phase_env)
    for index, size in enumerate(args.sizes):
        scale = 1.0 if run.device.type == "cuda" else 0.1
        if not run.phase(f"{size}:data", 5 * scale, phase_data, size):
            continue
        if not run.phase(f"{size}:model", 20 * scale, phase_model, size):
            continue
        if index == 0:
            run.phase(f"{size}:checks", 30 * scale, phase_checks)
        for layout in ("packed", "padded"):
            paths = attention_paths(run.device) if layout == "packed" else [None]
            for path in paths:
                for budget in args.budgets:
                    run.phase(
                        f"{size}:{layout}:{path}@{budget}",
                        25 * scale,
                        phase_learner,
                        size,
                        layout,
                        budget,
                        path,
                    )
        run.phase(f"{size}:plain", 25 * scale, phase_plain, size, args.budgets[0])
        if index == 0:
            run.phase(f"{size}:default_step", 40 * scale, phase_default_step, size)
        run.state.pop("model", None)
        parts.release(run.device)


def verdicts(run: Run) -> dict[str, Any]:
    """Each target: its figure, and met, missed, or pending (not measured on a GPU)."""
    steps = [r for r in run.records if r["check"] == "learner_step"]
    default = [r for r in run.records if r["check"] == "default_step"]

    def best(key: str, size: str) -> float | None:
        return max((r[key] for r in steps if r["size"] == size), default=None)

    errors = [abs(r["plan_error"]) for r in steps if r.get("plan_error") is not None]
    figures = {
        "tokens_per_s_0.5b": best("tokens_per_s", "0.5b"),
        "mfu_1.5b": best("mfu", "1.5b"),
        "plan_error": max(errors, default=None),
        "host_syncs": max((r["host_syncs"] for r in [*steps, *default]), default=None),
    }
    at_most = {"plan_error", "host_syncs"}
    out = {}
    for name, value in figures.items():
        gpu_only = name != "host_syncs"
        if value is None or (gpu_only and run.device.type != "cuda"):
            out[name] = [value, "pending"]
            continue
        met = value <= TARGETS[name] if name in at_most else value >= TARGETS[name]
        out[name] = [value, "met" if met else "missed"]
    return out


def print_table(run: Run) -> None:
    header = ("label", "step_s", "tokens/s", "MFU", "peak GiB", "plan GiB", "syncs")
    print(
        f"# {header[0]:<42} {header[1]:>6} {header[2]:>10} {header[3]:>6} "
        + " ".join(f"{h:>9}" for h in header[4:6])
        + f" {header[6]:>6}"
    )
    for r in run.records:
        if r["check"] in ("learner_step", "plain_step"):
            peak = "-" if r.get("peak_gib") is None else f"{r['peak_gib']:.2f}"
            plan = "-" if r.get("predicted_peak_gib") is None else f"{r['predicted_peak_gib']:.2f}"
            print(
                f"# {r['label']:<42} {r['step_s']:>6.3f} {r['tokens_per_s']:>10.0f} "
                f"{r['mfu']:>6.3f} {peak:>9} {plan:>9} {r.get('host_syncs', '-'):>6}"
            )
    for r in run.records:
        if r["check"] in ("error", "skipped"):
            print(f"# {r['check']}: {r['phase']}: {r.get('error') or r.get('reason')}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny models and batch")
    ap.add_argument("--device", default=None, help="cuda when there is one, else cpu")
    ap.add_argument("--numerics", choices=("bf16", "bf16-mixed", "fp32"), default=None)
    ap.add_argument("--sizes", default=None, help="comma list (0.5b,1.5b; tiny: tiny,tiny2)")
    ap.add_argument("--budgets", default=None, help="micro-batch token budgets (8192,16384)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per config (3)")
    ap.add_argument("--cap", type=float, default=None, help="seconds of timed steps per config")
    ap.add_argument("--budget", type=float, default=None, help="seconds for everything (420)")
    ap.add_argument("--out", default=None, help="write every record to this JSON file")
    ap.add_argument("--write", action="store_true", help="the results into docs/benchmarks.md")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    tiny = args.tiny
    cuda = torch.cuda.is_available() and not tiny
    defaults = {
        "device": "cuda" if cuda else "cpu",
        "numerics": "bf16" if cuda else "fp32",
        "sizes": "0.5b,1.5b" if not tiny else "tiny,tiny2",
        "budgets": "8192,16384" if not tiny else "64,256",
        "steps": 3 if not tiny else 2,
        "cap": 15.0 if not tiny else 4.0,
        "budget": 420.0 if not tiny else 120.0,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.sizes = [s for s in args.sizes.split(",") if s]
    args.budgets = [int(b) for b in args.budgets.split(",")]
    args.autocast = None if args.numerics == "fp32" else "bfloat16"
    args.batch_shape = (64, 8, 256, 1024, 64) if not tiny else (8, 4, 16, 40, 4)
    args.check_samples = 16 if not tiny else 8
    exact = args.numerics == "fp32"
    args.logprob_tol, args.grad_tol = (2e-3, 1e-4) if exact else (0.5, 2e-2)
    if tiny:
        torch.set_num_threads(1)  # tiny ops: threads only contend
    return args


def main(argv: list[str] | None = None) -> int:
    run = Run(parse(argv))
    measure(run)
    failed = [
        r.get("label") or r["check"]
        for r in run.records
        if r.get("ok") is False or r.get("finite") is False
    ]
    errors = [r["phase"] for r in run.records if r["check"] == "error"]
    run.emit("summary", targets=verdicts(run), failed=failed, errors=errors)
    print_table(run)
    if run.args.write:
        from _gpu_report import body, section_name
        from _report import write_section

        write_section(section_name(run.records), body(run.records))
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
