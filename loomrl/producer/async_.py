"""AsyncProducer: production runs in the background, also while training runs.

Admission control bounds how far production runs ahead: groups running or completed
may fill only the batches their tokens can still serve within ``max_staleness`` (AReaL's
bound), so work is not started that could only expire. A weight update pauses the gate,
aborts in-flight generations and resumes; ``next_batch`` expires completed groups that
are too old for its step and waits for enough fresh ones. A tail batch drains groups
that expired ``tail_after`` times: they run to the end without expiry, so long episodes
are trained on instead of being dropped.
"""

from __future__ import annotations

import asyncio

from loomrl.producer.group import Group, GroupStatus
from loomrl.producer.producer import Producer


class AsyncProducer(Producer):
    _background: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._background is None:
            self._background = asyncio.create_task(self._produce())

    async def next_batch(self, step: int) -> list[Group]:
        """``batch_size`` completed groups within the staleness bound at ``step``."""
        self._check_batchable(step)
        self.start()
        config = self.config
        self._maybe_tail()
        while True:
            self._raise_failure()
            if self.buffer.expire(step, config.max_staleness):
                self._poke()
            done = self._exhausted()
            batch = self._take(step, fill=done)
            if batch is not None and (batch or done):
                self._poke()
                return batch
            await self._wait_change()

    async def close(self) -> None:
        if self._background is not None:
            self._background.cancel()
            await asyncio.gather(self._background, return_exceptions=True)
        await super().close()

    async def _produce(self) -> None:
        config = self.config

        def allowed() -> bool:
            if not self.gate.is_open or len(self._running) >= config.in_flight_limit:
                return False
            if config.max_staleness is None:
                return True
            ahead = len(self._running) + self.buffer.count(status=GroupStatus.COMPLETED)
            return ahead < self._window() * config.launch_width

        try:
            while True:
                self._launch_while(allowed)
                await self._wait_change()
        except Exception as exc:  # e.g. should_continue or the log raised: next_batch says so
            self._fail(exc)
            self._poke()

    def _window(self) -> int:
        """Batches that groups started now can still serve: tokens of the current version
        are fresh enough up to step ``version + max_staleness``, and steps before
        ``progress.step`` are served already (AReaL's bound). While a step trains, that is
        one batch fewer than after its weights arrive."""
        version = self.engine.policy_version
        return max(0, version + (self.config.max_staleness or 0) + 1 - self.progress.step)

    def _maybe_tail(self) -> None:
        """Enough groups expired ``tail_after`` times: exempt them from expiry."""
        config = self.config
        if not config.tail_batch_size:
            return
        candidates = [
            g for g in self.buffer.waiting() if g.attempts >= config.tail_after and not g.tail
        ]
        if len(candidates) >= config.tail_batch_size:
            for group in candidates:
                group.tail = True
                self.gate.exempt.add(group.group_id)
                self.buffer.restart(group)
            self.progress.tail_groups += len(candidates)
