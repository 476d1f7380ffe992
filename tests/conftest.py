"""Shared test setup: the default model's files are prepared once per session (its
tokenizer is the real tokenizer the fast tests use; a fresh machine converts it first),
scripted engines over that tokenizer are closed after each test, and the run fails if it
leaves an engine, Ray, sandbox or harness process behind (``leftovers``)."""

from __future__ import annotations

import pytest
from contract import check_contract as contract_of
from leftovers import pytest_configure, pytest_sessionfinish  # noqa: F401 (hooks)
from mcp_fixtures import http_server  # noqa: F401 (a fixture: an MCP server over HTTP)
from transformers import AutoTokenizer

from loomrl.engines import ScriptedEngine
from loomrl.models import DEFAULT_MODEL, resolve
from loomrl.tokens import ChatTokenizer


@pytest.fixture(scope="session", autouse=True)
def default_model_prepared() -> None:
    resolve(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve(DEFAULT_MODEL))


@pytest.fixture(scope="session")
def chat(tokenizer) -> ChatTokenizer:
    return ChatTokenizer(tokenizer)


@pytest.fixture
async def make_engine(tokenizer):
    """Build ScriptedEngines over the real tokenizer; each is closed after the test."""
    made: list[ScriptedEngine] = []

    def make(reply=None, **kwargs) -> ScriptedEngine:
        kwargs.setdefault("tokenizer", tokenizer)
        made.append(ScriptedEngine(reply, **kwargs))
        return made[-1]

    yield make
    for engine in made:
        await engine.close()


@pytest.fixture
def check_contract(tokenizer, chat):
    """Assert the token contract of one finished trajectory (tests/contract.py)."""
    return lambda traj: contract_of(tokenizer, chat, traj)
