"""Producer metrics from the cumulative progress: what was made, used, thrown away.

``length_dropped_mean`` beside ``length_trained_mean`` is the length bias of staleness
control: if expiry and restarts throw away mostly long episodes, training sees short ones.
"""

from __future__ import annotations

from loomrl.producer.buffer import ReplayBuffer
from loomrl.producer.group import GroupStatus


def producer_metrics(buffer: ReplayBuffer) -> dict[str, float | int]:
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
    return metrics
