"""Pacing: when a trajectory may start, and whether its turns wait for each other.

The one scheduling loop (the producer's, which ``rollout()`` also runs on) takes a seat
before it starts a sample and gives it back once the sample's episode ended; the turn
loop waits at the pacing's ``barrier`` (if it has one) before each generation and each
env step. ``Continuous`` is loomrl's schedule: ``width`` seats, a seat frees as soon as a
trajectory ends, no barrier. ``TurnSync`` is the turn-synchronous baseline (NeMo-RL's
multi-turn rollout): waves of ``width`` trajectories, where every turn waits for the
slowest generation and then for the slowest env step, and a wave starts when the one
before it has ended.
"""

from __future__ import annotations

import abc
import asyncio
from typing import Literal


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


class Pacing(abc.ABC):
    """Seats for trajectories (``async with pacing`` or ``enter``/``exit``) and the
    barrier their turns wait at (None: no barrier)."""

    barrier: TurnBarrier | None = None

    @abc.abstractmethod
    async def enter(self) -> None:
        """Wait for a seat (returns at once after ``close``)."""

    @abc.abstractmethod
    def exit(self) -> None:
        """Give a seat back: its trajectory ended."""

    def close(self) -> None:  # noqa: B027 (a pacing without waiters has nothing to wake)
        """The loop stops: an ``enter`` that waits returns at once (nothing is started)."""

    async def __aenter__(self) -> None:
        await self.enter()

    async def __aexit__(self, *exc: object) -> None:
        self.exit()


class Continuous(Pacing):
    """At most ``width`` trajectories at once; no turn barrier."""

    def __init__(self, width: int) -> None:
        self._seats = asyncio.Semaphore(width)

    async def enter(self) -> None:
        await self._seats.acquire()

    def exit(self) -> None:
        self._seats.release()


class TurnSync(Pacing):
    """Waves of ``width`` of the ``total`` trajectories; each wave has its own barrier."""

    def __init__(self, width: int, total: int) -> None:
        self.width, self.left = width, total
        self._seats = 0  # seats of the current wave not taken yet
        self._playing = 0  # trajectories of the current wave not ended yet
        self._closed = False
        self._wave_over = asyncio.Event()
        self._wave_over.set()

    async def enter(self) -> None:
        while not self._seats:
            await self._wave_over.wait()
            if self._closed:
                return
            if not self._seats and not self._playing:
                size = max(1, min(self.width, self.left))
                self.left -= size
                self.barrier, self._seats = TurnBarrier(size), size
                self._wave_over.clear()
        self._seats -= 1
        self._playing += 1

    def exit(self) -> None:
        self._playing -= 1
        if not self._playing and not self._seats:
            self._wave_over.set()

    def close(self) -> None:
        self._closed = True
        self._wave_over.set()


def pacing(mode: Literal["continuous", "turn_sync"], width: int, total: int) -> Pacing:
    """The pacing of ``rollout(mode=...)`` for ``total`` trajectories, ``width`` at once."""
    if mode == "continuous":
        return Continuous(width)
    if mode == "turn_sync":
        return TurnSync(width, total)
    raise ValueError(f"mode must be 'continuous' or 'turn_sync', got {mode!r}")
