"""Shared test setup: the default model's files (its tokenizer is the real tokenizer the
fast tests use) are prepared once per session, converting them on a fresh machine."""

from __future__ import annotations

import pytest

from loomrl.models import DEFAULT_MODEL, resolve


@pytest.fixture(scope="session", autouse=True)
def default_model_prepared() -> None:
    resolve(DEFAULT_MODEL)
