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
        self._check_batchable(step)
        self.resume()
        for group in list(self.buffer.groups.values()):
            if group.status == GroupStatus.ABORTED and group.group_id in self._running:
                self.buffer.restart(group)
        while True:
            self._raise_failure()
            self.buffer.expire(step, config.max_staleness)
            done = self._exhausted()
            batch = self._take(step, fill=done)
            if batch is not None and (batch or done):
                break
            self._launch_while(
                lambda: (
                    len(self._running) + self.buffer.count(status=GroupStatus.COMPLETED)
                    < config.launch_width
                    and len(self._running) < config.in_flight_limit
                )
            )
            if not self._running:  # nothing runs or may start: the loop would spin forever
                raise RuntimeError(
                    f"production stalled at step {step}: {self.buffer.count(status='completed')} "
                    f"completed groups do not make a batch of {config.batch_size} split by "
                    f"the task weights, and no group may start (buffer room {self.buffer.room()})"
                )
            await self._wait_change()
        await self.pause()
        for group_id in list(self._running):
            group = self.buffer.groups[group_id]
            if group.status == GroupStatus.PENDING:
                self.buffer.abort(group)
        return batch
