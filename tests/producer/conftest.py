"""Fixtures for the producer tests: version-naming engines, producers and buffers that
are closed after each test, and the token contract for trajectories whose turns a
weight update split into pieces (helpers: producer_helpers.py)."""

from __future__ import annotations

from typing import Any

import pytest
from producer_helpers import STEP_S, Talk, VersionEngine, examples, mask_runs, turns_of

from loomrl import SamplingParams
from loomrl.producer import ProducerConfig, ReplayBuffer, Task
from loomrl.tokens import verify
from loomrl.types import Trajectory

IM_END = "<|im_end|>"


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


@pytest.fixture
def check_contract(tokenizer, chat):
    """The token contract of tests/rollout/conftest.py for a finished trajectory whose
    turns may be split into pieces by weight updates: pieces are contiguous, all but a
    turn's last ended in ``abort``, and the joined turns meet the one-span-a-turn rules."""

    def check(traj: Trajectory) -> None:
        ids, lps, mask = traj.completion_ids, traj.logprobs, traj.loss_mask
        assert len(ids) == len(lps) == len(mask)
        assert set(mask) <= {0, 1}
        for lp, bit in zip(lps, mask, strict=True):
            assert lp == 0.0 if bit == 0 else lp <= 0.0
        assert len(traj.spans) == len(traj.span_versions) == len(traj.finish_reasons)
        assert all(end > start for start, end in traj.spans)
        turns = turns_of(traj)
        assert [(s, e) for s, e, _ in turns] == mask_runs(mask)
        assert len(turns) == traj.turns
        assert all(reason != "abort" for _, _, reason in turns)

        result = verify(chat, traj.messages, traj.prompt_ids + ids)
        assert result.ok, result.message
        rendered = tokenizer.apply_chat_template(traj.messages, tokenize=False)
        decoded = tokenizer.decode(traj.prompt_ids + ids, skip_special_tokens=False)
        assert rendered.startswith(decoded)
        assert rendered[len(decoded) :] in ("", "\n", IM_END + "\n")
        assert traj.messages[-1]["role"] == "assistant"

        replies = [m for m in traj.messages if m["role"] == "assistant"][-traj.turns :]
        assert len(replies) == traj.turns
        for (start, end, _), message in zip(turns, replies, strict=True):
            span = ids[start:end]
            ended = span[-1] == tokenizer.eos_token_id
            text = tokenizer.decode(span, skip_special_tokens=False)
            assert text == message["content"] + (IM_END if ended else "")

    return check
