"""``benchmarks/gpu_learner.py --write``: its records as a docs/benchmarks.md section."""

from __future__ import annotations

from typing import Any


def section_name(records: list[dict[str, Any]]) -> str:
    env = next((r for r in records if r["check"] == "env"), {})
    return f"GPU learner ({env.get('gpu') or 'CPU, --tiny'})"


def body(records: list[dict[str, Any]]) -> str:
    """The timed steps as a table, the default step and the targets."""
    lines = [
        "| config | step s | tokens/s | MFU | peak GiB | plan GiB | plan error | host syncs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if r["check"] not in ("learner_step", "plain_step"):
            continue
        cells = [
            r["label"],
            f"{r['step_s']:.3f}",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['mfu']:.3f}",
            _maybe(r.get("peak_gib")),
            _maybe(r.get("predicted_peak_gib")),
            _maybe(r.get("plan_error"), "{:+.1%}"),
            str(r.get("host_syncs", "-")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    for r in records:
        if r["check"] == "default_step":
            lines.append(
                f"\nThe default step with GSPO, KL to a reference, icepop, the mismatch metrics "
                f"and the critic ({r['size']}, packed, {r['budget']} tokens per micro-batch): "
                f"{r['step_s']:.3f} s, {r['tokens_per_s']:,.0f} tokens/s, "
                f"{r['host_syncs']} host syncs ({', '.join(r['host_sync_sites'])})."
            )
    checks = [r for r in records if r["check"] in ("logprobs_vs_naive", "grad_vs_plain")]
    if checks:
        ok = all(r["ok"] for r in checks)
        lines.append(
            f"\nCorrectness checks (logprobs against a naive forward, gradients "
            f"against the plain step): {'all passed' if ok else 'FAILED'}."
        )
    summary = next((r for r in records if r["check"] == "summary"), None)
    if summary is not None:
        lines.append("\n| target | measured | verdict |\n|---|---|---|")
        for name, (value, verdict) in summary["targets"].items():
            lines.append(f"| {name} | {_maybe(value)} | {verdict} |")
        for failure in summary["errors"]:
            lines.append(f"\nError in phase {failure}.")
    env = next((r for r in records if r["check"] == "env"), {})
    if not env.get("gpu"):
        lines.append(
            "\nOn the CPU the figures only show that the benchmark runs (tiny models, one "
            "thread; host syncs counted with the models and the batch simulated on the "
            "device). The GPU targets are measured by `bash scripts/gpu_check.sh` on a GPU."
        )
    return "\n".join(lines)


def _maybe(value: Any, form: str = "{}") -> str:
    return "-" if value is None else form.format(value)
