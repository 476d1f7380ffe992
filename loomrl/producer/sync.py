"""SyncProducer: produce one step's batch, pause, let training run, repeat.

Each ``next_batch`` launches the batch plus the over-sampling margin, keeps launching
as groups are filtered or fail (dynamic sampling), and returns once ``batch_size``
valid groups are there. Groups still running then are aborted between steps: with
``partial_rollout`` they continue next step from their tokens, stamped with the version
that made them; otherwise they restart from the prompt.
"""

from __future__ import annotations

from loomrl.producer.group import Group, GroupStatus
from loomrl.producer.producer import Producer


class SyncProducer(Producer):
    async def next_batch(self, step: int) -> list[Group]:
        """``batch_size`` completed groups for training at ``step`` (fewer only when
        production is exhausted; empty at the end)."""
        config = self.config
        self.resume()
        for group in list(self.buffer.groups.values()):
            if group.status == GroupStatus.ABORTED and group.group_id in self._running:
                self.buffer.restart(group)
        while True:
            self._raise_failure()
            self.buffer.expire(step, config.max_staleness)
            done = self._exhausted()
            batch = self.buffer.take(
                config.batch_size, step, {n: t.weight for n, t in self.tasks.items()}, fill=done
            )
            if batch is not None and (batch or done):
                break
            self._launch_while(
                lambda: (
                    len(self._running) + self.buffer.count(status=GroupStatus.COMPLETED)
                    < config.launch_width
                    and len(self._running) < config.in_flight_limit
                )
            )
            if self._running:
                await self._wait_change()
        await self.pause()
        for group_id in list(self._running):
            group = self.buffer.groups[group_id]
            if group.status == GroupStatus.PENDING:
                self.buffer.abort(group)
        return batch
