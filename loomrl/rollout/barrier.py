"""The turn barrier of the turn-synchronous baseline (NeMo-RL's multi-turn rollout):
every active trajectory must reach the same phase before any moves on.
"""

from __future__ import annotations

import asyncio


class TurnBarrier:
    """A reusable barrier whose party count shrinks as trajectories finish."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self._arrived = 0
        self._event = asyncio.Event()

    async def wait(self) -> None:
        self._arrived += 1
        if self._arrived >= self.parties:
            self._release()
            return
        await self._event.wait()

    def leave(self) -> None:
        """A finished trajectory stops counting; the others may now be complete."""
        self.parties -= 1
        if self.parties > 0 and self._arrived >= self.parties:
            self._release()

    def _release(self) -> None:
        self._arrived = 0
        self._event.set()
        self._event = asyncio.Event()
