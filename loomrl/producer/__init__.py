"""Production of training groups: replay buffer, sync and async producers, progress.

buffer = ReplayBuffer(run_dir / "buffer.sqlite")
producer = AsyncProducer(engine, [Task("arith", env, examples)], config, buffer=buffer)
for step in range(steps):
    groups = await producer.next_batch(step)
    ...train on groups...
    await producer.update_weights(weights, version=step + 1)
"""

from loomrl.producer.async_ import AsyncProducer
from loomrl.producer.buffer import BufferFull, ReplayBuffer
from loomrl.producer.config import ProducerConfig
from loomrl.producer.gate import Gate
from loomrl.producer.group import Group, GroupStatus, Sample
from loomrl.producer.metrics import producer_metrics
from loomrl.producer.producer import Producer
from loomrl.producer.progress import Progress, TaskProgress
from loomrl.producer.sync import SyncProducer
from loomrl.producer.tasks import Task, next_task, quotas

__all__ = [
    "AsyncProducer", "BufferFull", "Gate", "Group", "GroupStatus", "Producer",
    "ProducerConfig", "Progress", "ReplayBuffer", "Sample", "SyncProducer", "Task",
    "TaskProgress", "next_task", "producer_metrics", "quotas",
]  # fmt: skip
