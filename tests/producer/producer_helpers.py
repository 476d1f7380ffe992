"""Helpers for the producer tests: a multi-turn environment, an engine whose every reply
names the policy version it was sampled under, and checks shared by several files.

Version words: a reply sampled under policy version ``v`` is ``reply_len`` copies of one
token (" zero", " one", ... for v = 0, 1, ...) then EOS, so every generated token says
which weights made it and each span can be checked against its stamped version.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contract import turns_of  # noqa: F401  (re-exported for the tests)

from loomrl import Environment, EnvStep, SamplingParams
from loomrl.engines import ScriptedEngine
from loomrl.producer import ProducerConfig, ReplayBuffer
from loomrl.types import Trajectory

WORDS = [" zero", " one", " two", " three", " four", " five", " six", " seven", " eight"]
# Per token: a step costs this much, so a reply of 8 tokens is in flight for ~16 ms.
STEP_S = 0.002


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams
    version: int


class VersionEngine(ScriptedEngine):
    """Replies ``reply_len`` copies of the token of its current policy version, then EOS.

    Records every request (prompt, sampling params, version at submission) and any
    request submitted while a weight update is loading (``update_s`` long), which must
    never happen: the producer's gate is closed then.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        reply_len: int = 8,
        vary: int = 1,
        update_s: float = 0.0,
        **kw: Any,
    ) -> None:
        super().__init__(self._reply, tokenizer=tokenizer, **kw)
        self.vary = vary  # replies are reply_len + (prompt length % vary) tokens long
        self.word_ids = [tokenizer.encode(w, add_special_tokens=False)[0] for w in WORDS]
        assert len(set(self.word_ids)) == len(WORDS)
        self.reply_len = reply_len
        self.update_s = update_s
        self.requests: list[Request] = []
        self.during_update: list[Request] = []
        self.aborted_pieces = 0  # aborted requests that had produced tokens
        self._updating = False

    def _reply(self, prompt_ids: Sequence[int], params: SamplingParams) -> list[int]:
        request = Request(list(prompt_ids), params, self.policy_version)
        self.requests.append(request)
        if self._updating:
            self.during_update.append(request)
        length = self.reply_len + len(prompt_ids) % self.vary
        return [self.word_ids[self.policy_version]] * length + [self.eos_token_id]

    def version_of(self, token_id: int) -> int:
        return self.word_ids.index(token_id)

    def busiest(self) -> int:
        """Tokens produced so far by the furthest request still decoding."""
        return max((r.produced for r in self._running.values()), default=0)

    async def abort(self, request_ids: Any = None) -> list[str]:
        if request_ids is None or isinstance(request_ids, str):
            wanted = None if request_ids is None else {request_ids}
        else:
            wanted = set(request_ids)
        running = [r for r in self._running.values() if wanted is None or r.request_id in wanted]
        self.aborted_pieces += sum(1 for r in running if r.produced > 0)
        return await super().abort(request_ids)

    async def update_weights(self, weights: Any, version: int | None = None) -> float:
        self._updating = True
        try:
            if self.update_s:  # loading weights: nothing may be submitted meanwhile
                await asyncio.sleep(self.update_s)
            # Without a pause the version moves on before any aborted caller has resumed:
            # what an aborted request made must be stamped with the version it came back with.
            return await super().update_weights(weights, version=version)
        finally:
            self._updating = False


class Talk(Environment):
    """Multi-turn: the episode ends after ``example["turns"]`` assistant turns.

    Reward: ``example["reward"]`` (default 1.0), or with ``example["rewards"]`` the next
    value of that list for this example (so a group of ``n = len(rewards)`` gets each
    once). ``example["boom"]`` makes ``step`` raise on that turn.
    """

    name = "talk"
    max_turns = 3
    nonblocking = True

    def __init__(self) -> None:
        self._draws: dict[Any, itertools.count] = {}
        self._lock = threading.Lock()

    def step(self, state, message):
        if state.example.get("boom") == state.turn:
            raise RuntimeError(f"boom in example {state.example['id']}")
        if state.turn >= state.example.get("turns", 1):
            return EnvStep([{"role": "user", "content": "thanks"}], done=True)
        return EnvStep([{"role": "user", "content": f"more {state.turn}"}], done=False)

    def score(self, state):
        rewards = state.example.get("rewards")
        if rewards is None:
            return float(state.example.get("reward", 1.0))
        with self._lock:
            draw = next(self._draws.setdefault(state.example["id"], itertools.count()))
        return float(rewards[draw % len(rewards)])


def examples(k: int, *, start: int = 0, **fields: Any) -> list[dict[str, Any]]:
    """``k`` examples with ids ``start..``; 1 to 3 turns each unless ``turns`` is given."""
    return [
        {"id": i, "question": f"Q{i}", "turns": 1 + i % 3, **fields}
        for i in range(start, start + k)
    ]


async def wait_until(predicate, what: str, timeout: float = 10.0) -> None:
    """Poll ``predicate`` on the event loop (generous timeout: CPU load must not fail it)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


async def let_production_run(producer, engine) -> None:
    """ "Training" time for an async producer: once its background (just woken by the
    batch) has launched what the staleness window allows, wait until a generation has
    made 2 tokens, so the next weight update cuts it, or until nothing runs."""
    for _ in range(3):
        await asyncio.sleep(0)
    await wait_until(
        lambda: engine.busiest() >= 2 or not producer.running, "a generation in flight"
    )


def live_groups(buffer: ReplayBuffer, task: str | None = None) -> int:
    """Groups still to finish: pending (waiting or running), aborted or expired."""
    return sum(
        1
        for g in buffer.groups.values()
        if g.status in ("pending", "aborted", "expired") and task in (None, g.task)
    )


def check_counts(buffer: ReplayBuffer) -> None:
    """Every launched group is exactly one of: still to finish, completed (maybe consumed
    since), filtered or failed; each expiry sent a completed group back to the queue."""
    p = buffer.progress
    for name in p.tasks:
        t = p.task(name)
        live = live_groups(buffer, name)
        assert t.launched == (t.completed - t.expired) + t.filtered + t.failed + live, name
        assert t.launched == buffer.count(task=name)
        assert t.completed - t.expired == buffer.count(name, "completed") + buffer.count(
            name, "consumed"
        )
        assert t.consumed == buffer.count(name, "consumed")
        assert t.filtered == buffer.count(name, "filtered")
        assert t.failed == buffer.count(name, "failed")


def check_versions(engine: VersionEngine, traj: Trajectory) -> None:
    """Each span's model tokens name exactly the version the span is stamped with."""
    for (start, end), version in zip(traj.spans, traj.span_versions, strict=True):
        words = {
            engine.version_of(t) for t in traj.completion_ids[start:end] if t != engine.eos_token_id
        }
        assert words == {version}, (traj.spans, traj.span_versions, words)


def config(**kwargs: Any) -> ProducerConfig:
    kwargs.setdefault("n", 2)
    kwargs.setdefault("batch_size", 4)
    return ProducerConfig(**kwargs)
