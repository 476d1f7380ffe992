"""Fixtures for the producer tests: version-naming engines, producers and buffers that
are closed after each test, and the token contract for trajectories whose turns a
weight update split into pieces (helpers: producer_helpers.py)."""

from __future__ import annotations

from typing import Any

import pytest
from producer_helpers import STEP_S, Talk, VersionEngine, examples

from loomrl import SamplingParams
from loomrl.producer import ProducerConfig, ReplayBuffer, Task


@pytest.fixture
async def version_engine(tokenizer):
    """Build VersionEngines (default: 8-token replies, 2 ms a step); closed after the test."""
    made: list[VersionEngine] = []

    def make(**kwargs: Any) -> VersionEngine:
        kwargs.setdefault("step_base_s", STEP_S)
        made.append(VersionEngine(tokenizer, **kwargs))
        return made[-1]

    yield make
    for engine in made:
        await engine.close()


@pytest.fixture
async def make_producer(chat):
    """Build producers (sharing the session's ChatTokenizer); closed after the test."""
    made: list[Any] = []

    def make(cls, engine, tasks, config: ProducerConfig | None = None, **kwargs: Any):
        kwargs.setdefault("chat", chat)
        kwargs.setdefault("sampling", SamplingParams(max_tokens=16))
        made.append(cls(engine, tasks, config, **kwargs))
        return made[-1]

    yield make
    for producer in made:
        await producer.close()


@pytest.fixture
def buffers(tmp_path):
    """Open ReplayBuffers (on ``tmp_path / name`` for a name); closed after the test."""
    opened: list[ReplayBuffer] = []

    def open_buffer(name: str | None = None, **kwargs: Any) -> ReplayBuffer:
        opened.append(ReplayBuffer(None if name is None else tmp_path / name, **kwargs))
        return opened[-1]

    yield open_buffer
    for buffer in opened:
        buffer.close()


@pytest.fixture
def talk_task():
    def make(k: int = 64, name: str = "talk", **fields: Any) -> Task:
        return Task(name, Talk(), examples(k, **fields))

    return make
