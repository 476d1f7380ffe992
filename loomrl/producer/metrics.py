"""Producer metrics from the cumulative progress: what was made, used, thrown away.

``length_dropped_mean`` beside ``length_trained_mean`` is the length bias of staleness
control: if expiry and restarts throw away mostly long episodes, training sees short ones.

``failures`` counts every failed sample and exception of production, ``failures/<kind>``
by kind (``error`` and ``env_timeout`` always present, others as they occur); with
``samples_produced`` (every finished sample, failed ones included) they give the share of
production that failed, which no batch shows: failed groups never reach one.
"""

from __future__ import annotations

from loomrl.producer.buffer import ReplayBuffer
from loomrl.producer.failures import Failures, load_failures
from loomrl.producer.group import GroupStatus


def producer_metrics(
    buffer: ReplayBuffer, failures: Failures | None = None
) -> dict[str, float | int]:
    """Cumulative counts. The failure counts come from ``failures`` (a producer's
    ``failures``), else from the buffer's log; a buffer without a log and no ``failures``
    has none to report, and the keys are left out rather than shown as 0."""
    p = buffer.progress
    consumed = p.total("consumed_samples")
    dropped = p.total("dropped_samples")
    staleness_n = sum(p.staleness.values())
    metrics: dict[str, float | int] = {
        "groups_launched": p.total("launched"),
        "groups_completed": p.total("completed"),
        "groups_consumed": p.total("consumed"),
        "groups_filtered": p.total("filtered"),
        "groups_failed": p.total("failed"),
        "groups_expired": p.total("expired"),
        "groups_aborted": p.total("aborted"),
        "groups_rewound": p.total("rewound"),
        "samples_expired": p.total("expired_samples"),
        "samples_restarted": p.total("restarted"),
        "samples_resumed": p.total("resumed"),
        "samples_produced": p.total("produced_samples"),
        "tokens_produced": p.total("produced_tokens"),
        "tokens_consumed": p.total("consumed_tokens"),
        "tokens_unused": p.total("unused_tokens"),
        "length_trained_mean": p.total("consumed_tokens") / consumed if consumed else 0.0,
        "length_dropped_mean": p.total("dropped_tokens") / dropped if dropped else 0.0,
        "staleness_mean": (
            sum(k * v for k, v in p.staleness.items()) / staleness_n if staleness_n else 0.0
        ),
        "staleness_max": max(p.staleness, default=0),
        "continued_trajectories": sum(v for k, v in p.continued_spans.items() if k > 0),
        "tail_groups": p.tail_groups,
        "buffer_completed": buffer.count(status=GroupStatus.COMPLETED),
    }
    for stale, count in sorted(p.staleness.items()):
        metrics[f"staleness/{stale}"] = count
    if failures is None and buffer.log is not None:
        failures = load_failures(buffer)
    if failures is not None:
        metrics["failures"] = failures.total
        counts = {"error": 0, "env_timeout": 0, **failures.counts}
        for kind, count in sorted(counts.items()):
            metrics[f"failures/{kind}"] = count
    return metrics
