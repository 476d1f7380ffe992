"""Plots drawn from the metric rows: eval, learner, time per phase, throughput, producer.

A ``loomrl train`` run has one row a step (``metrics.jsonl``); a ``loomrl rollout`` run
has one summary row (``metrics.json``, shown at step 0). Producer counts in the rows are
cumulative; the staleness histogram is the newest row's ``producer/staleness/K`` counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loomrl.report.figures import PALETTE, Figure, Plots, column, label, line
from loomrl.report.load import Run

LEARNER = (
    ("entropy", "Entropy (nats/token)"), ("kl", "KL to the reference"),
    ("clip_fraction", "Clip fraction"), ("grad_norm", "Gradient norm (before clipping)"),
    ("sampler_learner_abs_gap", "Learner-vs-sampler logprob gap |Δ|"),
    ("is_weight", "Importance weight (mean)"), ("loss", "Loss"), ("lr", "Learning rate"),
)  # fmt: skip
#: Sampler-vs-learner mismatch and what the correction did (``loomrl.train.mismatch``).
MISMATCH = (
    ("mismatch-kl", "KL(sampler ‖ learner) per token (k3)", [("mismatch_kl", "k3")]),
    ("mismatch-gap", "Logprob gap |log ρ| before the update",
     [("logprob_gap_mean", "mean"), ("logprob_gap_p99", "p99")]),
    ("mismatch-ratio", "Importance ratio ρ (mean)", [("is_ratio_mean", "ρ")]),
    ("mismatch-correction", "Correction: fraction masked or truncated",
     [("correction_masked_tokens", "tokens masked"),
      ("correction_masked_seqs", "sequences with a masked token"),
      ("correction_truncated_tokens", "tokens truncated")]),
)  # fmt: skip
PHASES = (("rollout_s", "rollout"), ("experience_s", "experience"), ("learner_s", "learner"),
          ("sync_s", "sync"))  # fmt: skip
BUSY = (("generate_s", "generate"), ("env_s", "env"), ("score_s", "score"))
PRODUCER_EVENTS = (
    "groups_expired", "groups_aborted", "groups_filtered", "groups_failed", "samples_expired",
    "samples_restarted", "continued_trajectories",
)  # fmt: skip


#: Metrics older runs logged under another name: read there when a row lacks the new one.
OLD_NAMES = {"clip_fraction": "clip_frac"}


def series(run: Run, key: str) -> tuple[list[int], list[Any]]:
    """Steps and values of ``key`` in the rows that have it (a number; under its old name
    in a run from before it was renamed)."""
    old = OLD_NAMES.get(key, key)
    values = [(r["step"], r[key] if key in r else r.get(old)) for r in run.rows]
    kept = [(s, v) for s, v in values if isinstance(v, int | float)]
    return [s for s, _ in kept], [v for _, v in kept]


def lines_of(runs: Sequence[Run], keys: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    out = []
    for r, run in enumerate(runs):
        for i, (key, name) in enumerate(keys):
            x, y = series(run, key)
            if x:
                out.append(line(runs, r, i, name, x, y))
    return out


def row_plots(runs: Sequence[Run], plots: Plots) -> None:
    evals = sorted({k for run in runs for row in run.rows for k in row if k.startswith("eval/")})
    scores = [k for k in evals if k != "eval/length_mean"]  # rewards and pass rates share a scale
    if scores:
        plots.add(
            Figure("eval", "Reward", "Eval metrics", lines_of(runs, [(k, k[5:]) for k in scores])),
            "no eval rows",
        )
    if "eval/length_mean" in evals:
        plots.add(
            Figure("eval-length", "Reward", "Eval: generated tokens per trajectory (greedy)",
                   lines_of(runs, [("eval/length_mean", "length_mean")])),
            "no eval rows",
        )  # fmt: skip
    for key, title in LEARNER:
        plots.add(
            Figure(f"learner-{key}", "Learner", title, lines_of(runs, [(key, key)])),
            "no learner steps (a rollout run, or every batch was skipped)",
        )
    for name, title, keys in MISMATCH:
        plots.add(
            Figure(name, "Mismatch", title, lines_of(runs, keys)),
            "no mismatch metrics (a rollout run, or a run from before they were measured)",
        )
    for r, run in enumerate(runs):
        bars = []
        for i, (key, name) in enumerate(PHASES):
            x, y = series(run, key)
            if x:
                bars.append({"type": "bar", "name": name, "x": x, "y": y,
                             "marker": {"color": PALETTE[i]}})  # fmt: skip
        suffix = f" — {run.name}" if len(runs) > 1 else ""
        plots.add(
            Figure(f"time-{r}", "Time", f"Time per phase per step (s){suffix}", bars,
                   {"barmode": "stack", "yaxis": {"title": {"text": "seconds"}}}),
            "no timings",
        )  # fmt: skip
    plots.add(
        Figure("busy", "Time", "Time inside rollouts, summed over trajectories (s)",
               lines_of(runs, BUSY)),
        "these runs record no per-trajectory timings",
    )  # fmt: skip
    plots.add(Figure("tokens-per-s", "Time", "Generated tokens/s", throughput(runs)), "no timings")
    producer_plots(runs, plots)


def throughput(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Generated tokens/s per step: the rows' own figure, else the step's model tokens
    (from its trajectories) over its ``rollout_s``."""
    out = []
    for r, run in enumerate(runs):
        x, y = series(run, "generated_tokens_per_s")
        if not x:
            tokens: dict[int, int] = {}
            for step, n in zip(column(run, "step"), column(run, "num_completion_tokens"),
                               strict=True):  # fmt: skip
                tokens[step] = tokens.get(step, 0) + n
            kept = [(s, tokens[s] / t) for s, t in zip(*series(run, "rollout_s"), strict=True)
                    if s in tokens and t > 0]  # fmt: skip
            x, y = [s for s, _ in kept], [v for _, v in kept]
        if x:
            out.append(line(runs, r, 0, "tokens/s", x, y))
    return out


def producer_plots(runs: Sequence[Run], plots: Plots) -> None:
    why = "no producer counts in these runs"
    staleness = []
    for r, run in enumerate(runs):
        last = next((row for row in reversed(run.rows) if "producer/staleness_max" in row), None)
        if last is None:
            continue
        hist = sorted(
            (int(k.rsplit("/", 1)[1]), v) for k, v in last.items()
            if k.startswith("producer/staleness/") and k.rsplit("/", 1)[1].isdigit()
        )  # fmt: skip
        staleness.append({
            "type": "bar", "name": label(runs, r, "groups"), "x": [k for k, _ in hist],
            "y": [v for _, v in hist], "marker": {"color": PALETTE[r % len(PALETTE)]},
        })  # fmt: skip
    plots.add(
        Figure("staleness", "Producer", "Staleness of trained groups (policy versions behind)",
               staleness, {"xaxis": {"title": {"text": "steps behind"}, "dtick": 1}}),
        why,
    )  # fmt: skip
    events = [(f"producer/{k}", k) for k in PRODUCER_EVENTS]
    plots.add(
        Figure("producer-events", "Producer", "Expired / aborted / restarted (cumulative)",
               lines_of(runs, events)),
        why,
    )  # fmt: skip
    plots.add(
        Figure("tokens-unused", "Producer", "Tokens generated and not trained on (cumulative)",
               lines_of(runs, [("producer/tokens_unused", "tokens unused")])),
        why,
    )  # fmt: skip
    lengths = [("producer/length_trained_mean", "trained"),
               ("producer/length_dropped_mean", "dropped")]  # fmt: skip
    plots.add(
        Figure("length-bias", "Producer", "Mean length: trained vs dropped (tokens)",
               lines_of(runs, lengths)),
        why,
    )  # fmt: skip
