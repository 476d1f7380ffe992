"""The producer core: launch groups, run their samples, checkpoint, score, classify.

``SyncProducer`` and ``AsyncProducer`` differ only in *when* they launch and pause;
everything a group goes through lives here. Each sample is one turn-loop coroutine
(``loomrl.rollout``) that passes the ``Gate`` before every generation and checkpoints into
the buffer's log at every turn, so a weight update, an expiry or a crash costs at most
the turn in progress.

Every failure is kept in ``failures`` (counts by kind, the first messages; see
``loomrl.producer.failures``) and, with a logged buffer, saved in its log, so a resumed
run still knows them. The first exception of the producer's own work is raised from
``next_batch`` with a note saying how many other failures there were.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Literal

from loomrl.aio import gather_or_cancel
from loomrl.engines.base import Engine
from loomrl.envs.base import EnvState
from loomrl.episode.context import RolloutContext, close_context, open_context
from loomrl.episode.pacing import Continuous, Pacing
from loomrl.episode.scoring import score
from loomrl.episode.turn_loop import Preempted, Resume, run_trajectory
from loomrl.producer.buffer import ReplayBuffer
from loomrl.producer.config import ProducerConfig
from loomrl.producer.failures import load_failures, note_others, save_failures
from loomrl.producer.gate import Gate
from loomrl.producer.group import FINAL, UNTRAINABLE, Group, GroupStatus, Sample, example_id
from loomrl.producer.progress import Progress
from loomrl.producer.tasks import Task, next_task
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams, Trajectory

GroupCheck = Callable[[Group], bool]


class Producer:
    """The one scheduling loop. ``run_to_end`` runs every example once (``rollout()``);
    training uses ``SyncProducer`` or ``AsyncProducer``.

    ``is_valid_group(group)`` decides whether a finished, error-free group is trained on
    (else ``filtered``); ``should_continue(progress)`` whether new groups may be drawn.
    ``on_group(group)`` is told of every group that finishes (``completed``, ``filtered``
    or ``failed``). ``pacing`` hands out the seats of every task's samples (default
    ``Continuous(concurrency)``; ``rollout(mode="turn_sync")`` passes ``TurnSync``).
    ``failures`` counts every failed sample and every exception of the producer's own
    work, and keeps the first ``keep_failures`` distinct messages.
    """

    def __init__(
        self,
        engine: Engine,
        tasks: Task | Sequence[Task],
        config: ProducerConfig | None = None,
        *,
        buffer: ReplayBuffer | None = None,
        sampling: SamplingParams | None = None,
        max_turns: int | None = None,
        max_len: int | None = None,
        env_timeout: float | None = None,
        on_error: Literal["raise", "isolate"] = "isolate",
        concurrency: int = 256,
        pacing: Pacing | None = None,
        env_workers: int = 64,
        chat: ChatTokenizer | None = None,
        is_valid_group: GroupCheck | None = None,
        should_continue: Callable[[Progress], bool] | None = None,
        on_group: Callable[[Group], None] | None = None,
        keep_failures: int = 20,
    ) -> None:
        tasks = [tasks] if isinstance(tasks, Task) else list(tasks)
        names = [t.name for t in tasks]
        if not tasks or len(set(names)) != len(names):
            raise ValueError(f"a producer needs tasks with distinct names, got {names}")
        if on_error not in ("raise", "isolate"):
            raise ValueError(f"on_error must be 'raise' or 'isolate', got {on_error!r}")
        self.engine = engine
        self.config = config or ProducerConfig()
        self.tasks = {t.name: t for t in tasks}
        self.buffer = buffer if buffer is not None else ReplayBuffer()
        if self.config.buffer_size is not None:  # the config's cap wins over the buffer's
            self.buffer.capacity = self.config.buffer_size
        self.failures = load_failures(self.buffer, keep_failures)
        self.is_valid_group = is_valid_group
        self.should_continue = should_continue
        self.on_group = on_group
        self.gate = Gate(
            engine,
            partial_rollout=self.config.partial_rollout,
            max_staleness=self.config.max_staleness,
        )
        self._check_resumed_groups()
        self.buffer.bind_envs({t.name: t.env for t in tasks})  # env states as data
        # Tail groups of a resumed buffer still run to the end without expiry.
        self.gate.exempt = {g.group_id for g in self.buffer.groups.values() if g.tail}
        self.contexts: dict[str, RolloutContext] = {}
        self.pacing = pacing or Continuous(concurrency)  # seats shared by every task's samples
        for task in tasks:
            ctx = open_context(
                engine, task.env, chat=chat, sampling=sampling, max_turns=max_turns,
                max_len=max_len, env_timeout=env_timeout, isolate_errors=on_error == "isolate",
                env_workers=env_workers,
            )  # fmt: skip
            ctx.gate, ctx.checkpoint, ctx.pacing = self.gate, self._checkpoint, self.pacing
            self.contexts[task.name] = ctx
            chat = ctx.chat  # one template cache for every task
        self._running: dict[int, asyncio.Task[None]] = {}
        self._waiters: set[asyncio.Event] = set()
        self._failure: BaseException | None = None
        self._failure_note = ""
        self._closed = False

    # -- public --------------------------------------------------------------------------
    @property
    def progress(self) -> Progress:
        return self.buffer.progress

    @property
    def running(self) -> int:
        return len(self._running)

    def state_dict(self) -> dict[str, Any]:
        return {"progress": self.progress.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.progress.load_state_dict(state["progress"])

    async def update_weights(self, weights: Any, version: int | None = None) -> float:
        """Pause, abort what is generating, load the weights, resume; returns the seconds
        the engine's load took. Aborted samples keep their tokens (version-stamped) with
        ``partial_rollout`` and continue under the new weights; without it they restart.
        With ``partial_rollout`` and an engine that can (vLLM's keep mode), nothing is
        aborted: the generations in flight go on under the new weights inside the engine,
        which reports each version's tokens as a span of their own."""
        was_open = self.gate.is_open
        update = self.engine.update_weights  # type: ignore[attr-defined]
        if self.config.partial_rollout and getattr(self.engine, "supports_keep", False):
            self.gate.close()  # new requests wait; those in flight are kept
            seconds = await update(weights, version=version, keep=True)
        else:
            await self.pause()
            seconds = await update(weights, version=version)
        if was_open:
            self.resume()
        return float(seconds)

    async def pause(self) -> None:
        """Stop generation: new requests wait at the gate, in-flight ones are aborted."""
        self.gate.close()
        ids = [rid for ctx in self.contexts.values() for rid in ctx.in_flight]
        if ids:
            await self.engine.abort(ids)

    def resume(self) -> None:
        self.gate.open()
        self._poke()

    async def run_to_end(self) -> None:
        """Produce every example of every task (for ``loomrl rollout``), no training."""
        self.resume()
        while True:
            self._raise_failure()
            self._launch_while(lambda: len(self._running) < self.config.in_flight_limit)
            if not self._running:
                return
            await self._wait_change()

    async def close(self) -> None:
        """Stop: running groups keep their checkpoints (status ``pending`` in the log)."""
        if self._closed:
            return
        self._closed = True
        await self.pause()
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ctx in self.contexts.values():
            close_context(ctx)

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- launching -----------------------------------------------------------------------
    def _launch_while(self, allowed: Callable[[], bool]) -> None:
        """Launch groups while ``allowed``; nothing once a failure waits to be raised (a
        group that crashed stays pending and would only be launched to crash again)."""
        while self._failure is None and allowed():
            group = self._next_group()
            if group is None:
                return
            self._running[group.group_id] = asyncio.create_task(self._run_group(group))

    def _next_group(self) -> Group | None:
        """A waiting group (tail groups first), else a new one from the task furthest
        behind its weight; None when nothing may start."""
        group = self._waiting_group()
        if group is not None:
            if group.status != GroupStatus.PENDING:
                self.buffer.restart(group)
            return group
        room = self.buffer.room()
        if not self._may_draw() or (room is not None and room <= 0):
            return None
        # In the tasks' own order: ties between tasks break by it, whatever the hash seed.
        with_examples = self._tasks_with_examples()
        open_tasks = {n: t.weight for n, t in self.tasks.items() if n in with_examples}
        # By groups that can still be trained on: a filtered or failed group is replaced
        # by one of its own task, else the task would lack its share of every batch.
        counts = {n: self.progress.task(n) for n in open_tasks}
        usable = {n: c.launched - c.filtered - c.failed for n, c in counts.items()}
        name = next_task(open_tasks, usable)
        if name is None:
            return None
        index = self.progress.task(name).launched
        group = Group(
            group_id=self.buffer.next_group_id(), task=name, example_index=index,
            example=dict(self.tasks[name].examples[index]), n=self.config.n,
        )  # fmt: skip
        self.buffer.put(group)
        return group

    def _take(self, step: int, fill: bool) -> list[Group] | None:
        """``buffer.get`` a batch split by the weights of the tasks that can still give
        groups; one out of examples may fall short (the others stand in), so the batch is
        never held up by groups that cannot come."""
        live = {g.task for g in self.buffer.groups.values() if g.status not in FINAL}
        spent = set(self.tasks) - self._tasks_with_examples()
        weights = {n: t.weight for n, t in self.tasks.items() if n in live or n not in spent}
        return self.buffer.get(self.config.batch_size, step, weights, fill, spent & live)

    def _check_batchable(self, step: int) -> None:
        """Fail fast where ``next_batch`` would wait forever: a batch larger than the
        buffer's cap, or weights so far behind ``step`` that every group made now is
        already past ``max_staleness`` (expired and made again, endlessly)."""
        capacity, limit = self.buffer.capacity, self.config.max_staleness
        if capacity is not None and capacity < self.config.batch_size:
            raise ValueError(
                f"a replay buffer of capacity {capacity} cannot hold a batch of "
                f"{self.config.batch_size} groups"
            )
        version = self.engine.policy_version
        if limit is not None and step - version > limit:
            raise ValueError(
                f"step {step} cannot train on policy version {version} with max_staleness="
                f"{limit}: update the weights with version=step after each step"
            )

    def _exhausted(self) -> bool:
        """Nothing runs and nothing more may start: production is over."""
        if self._running or self._waiting_group() is not None:
            return False
        return not (self._may_draw() and self._tasks_with_examples())

    def _waiting_group(self) -> Group | None:
        """The first waiting group that is not running (tail groups first, then oldest)."""
        return next(iter(self.buffer.waiting(self._running)), None)

    def _may_draw(self) -> bool:
        """Whether ``should_continue`` lets new examples be drawn."""
        return self.should_continue is None or self.should_continue(self.progress)

    def _tasks_with_examples(self) -> set[str]:
        return {
            n for n, t in self.tasks.items() if self.progress.task(n).launched < len(t.examples)
        }

    # -- one group -----------------------------------------------------------------------
    async def _run_group(self, group: Group) -> None:
        try:
            ctx = self.contexts[group.task]
            states = await gather_or_cancel(
                [self._run_sample(ctx, group, i) for i in range(group.n)]
            )
            trajs = group.trajectories()
            await score(ctx, trajs, states)
            status, note = self._verdict(group)
            self.buffer.finish(group, status, note)
            if status == GroupStatus.FAILED:
                self._record_failed_samples(group)
            if self.on_group is not None:
                self.on_group(group)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._fail(exc, group)
        finally:
            self._running.pop(group.group_id, None)
            self._poke()

    async def _run_sample(self, ctx: RolloutContext, group: Group, index: int) -> EnvState | None:
        while True:
            sample = group.samples.get(index)
            ended = sample is not None and sample.done
            if ended and (sample.state is not None or sample.traj.status in UNTRAINABLE):
                return sample.state
            resume = None
            if sample is not None and sample.state is not None and not sample.done:
                traj, resume = sample.traj, Resume(sample.state, sample.stop)
                self.progress.task(group.task).resumed += 1
            else:
                if sample is not None:  # its env state could not be saved: start again
                    self.buffer.drop_sample(group, index, "restarted")
                traj = Trajectory(
                    example_id=example_id(group.example, group.example_index),
                    group_id=group.group_id,
                    sample_index=index, env=ctx.env.name,
                )  # fmt: skip
            async with self.pacing:
                try:
                    state = await run_trajectory(ctx, traj, group.example, resume)
                except Preempted as exc:
                    group.samples[index] = Sample(traj, None)
                    self.buffer.drop_sample(group, index, exc.reason)
                    continue
            self.buffer.checkpoint(group, index, Sample(traj, state, None, done=True))
            return state

    def _verdict(self, group: Group) -> tuple[GroupStatus, str]:
        if not group.trainable():
            bad = sorted({str(t.status) for t in group.trajectories()} & set(map(str, UNTRAINABLE)))
            return GroupStatus.FAILED, f"samples ended in {', '.join(bad)}"
        rewards = [t.reward for t in group.trajectories()]
        if self.config.drop_zero_variance and len(rewards) > 1 and max(rewards) == min(rewards):
            return GroupStatus.FILTERED, "every reward equal"
        if self.is_valid_group is not None and not self.is_valid_group(group):
            return GroupStatus.FILTERED, "is_valid_group returned False"
        return GroupStatus.COMPLETED, ""

    def _checkpoint(self, traj: Trajectory, state: EnvState, stop: tuple[str, ...] | None) -> None:
        group = self.buffer.groups[traj.group_id]
        self.buffer.checkpoint(group, traj.sample_index, Sample(traj, state, stop))

    def _check_resumed_groups(self) -> None:
        """A resumed buffer's groups must belong to this producer's tasks and group size."""
        for group in self.buffer.groups.values():
            if group.task not in self.tasks:
                raise ValueError(
                    f"the buffer holds group {group.group_id} of task {group.task!r}, which "
                    f"this producer does not have (tasks: {sorted(self.tasks)})"
                )
            if group.n != self.config.n:
                raise ValueError(
                    f"the buffer's groups have n={group.n}, this producer n={self.config.n}"
                )

    # -- waiting -------------------------------------------------------------------------
    def _poke(self) -> None:
        for event in self._waiters:
            event.set()

    async def _wait_change(self) -> None:
        """Until a group ends, a batch is taken or production is resumed."""
        event = asyncio.Event()
        self._waiters.add(event)
        try:
            await event.wait()
        finally:
            self._waiters.discard(event)

    # -- failures ------------------------------------------------------------------------
    def _record_failed_samples(self, group: Group) -> None:
        for traj in group.trajectories():
            if traj.status in UNTRAINABLE:
                self.failures.add(
                    str(traj.status), traj.error or str(traj.status), task=group.task,
                    group_id=group.group_id, sample_index=traj.sample_index,
                )  # fmt: skip
        save_failures(self.buffer, self.failures)

    def _fail(self, exc: BaseException, group: Group | None = None) -> None:
        """Count an exception of the producer's own work; the first one is raised."""
        if self._failure is None:
            self._failure = exc
        self.failures.add(
            type(exc).__name__, str(exc), task=None if group is None else group.task,
            group_id=None if group is None else group.group_id,
        )  # fmt: skip
        # When the log itself fails it cannot hold this record; the raise still tells.
        with contextlib.suppress(Exception):
            save_failures(self.buffer, self.failures)

    def _raise_failure(self) -> None:
        """Raise the first exception, noting how many other failures there were."""
        if self._failure is not None:
            self._failure_note = note_others(self._failure, self.failures, self._failure_note)
            raise self._failure
