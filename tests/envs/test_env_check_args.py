"""``check_args``: env_args checked against the factory's signature and type hints before
anything is built, and ``load`` reporting a factory's refusal as an ``EnvArgsError``."""

from __future__ import annotations

from typing import Literal

import pytest

from loomrl.envs import Environment, EnvState, load, register, registry
from loomrl.envs.registry import EnvArgsError, check_args


class Plain(Environment):
    name = "plain"

    def __init__(self, **options: object) -> None:
        self.options = options

    def score(self, state: EnvState) -> float:
        return 0.0


BUILT: list[dict[str, object]] = []


def typed(
    count: int,
    scale: float = 1.0,
    mode: Literal["a", "b"] = "a",
    tags: list[str] | None = None,
    anything=None,
) -> Environment:
    """A factory with typed parameters that records every call."""
    BUILT.append({"count": count})
    return Plain()


def open_ended(size: int = 1, **options: object) -> Environment:
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return Plain(**options)


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_ENVS", dict(registry._ENVS))
    register("typed", typed, "typed arguments")
    register("open", open_ended, "takes anything")
    BUILT.clear()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"count": 3},
        {"count": 3, "scale": 2},  # an int is a fine float
        {"count": 3, "mode": "b", "tags": ["x"], "anything": object()},
        {"count": 3, "tags": None},
    ],
)
def test_good_arguments_pass(kwargs):
    check_args("typed", kwargs)
    load("typed", **kwargs)
    assert BUILT == [{"count": 3}]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"count": 3, "colour": "red"}, "environment 'typed' has no argument(s) ['colour']; "
         "it takes: count, scale, mode, tags, anything"),
        ({}, "environment 'typed' needs env_args ['count']"),
        ({"count": "3"}, "environment 'typed': env_args count = '3' is not int (Input should be "
         "a valid integer)"),
        ({"count": True}, "environment 'typed': env_args count = True is not int"),
        ({"count": 1, "scale": "big"}, "environment 'typed': env_args scale = 'big' is not float"),
        ({"count": 1, "mode": "c"}, "environment 'typed': env_args mode = 'c' is not "
         "Literal['a', 'b'] (Input should be 'a' or 'b')"),
        ({"count": 1, "tags": "x"}, "environment 'typed': env_args tags = 'x' is not "
         "list[str] | None"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_before_the_factory_runs(kwargs, message):
    with pytest.raises(EnvArgsError) as info:
        check_args("typed", kwargs)
    assert str(info.value).startswith(message)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    with pytest.raises(EnvArgsError):
        load("typed", **kwargs)
    assert BUILT == []


def test_a_factory_taking_kwargs_gets_unknown_keys_and_its_own_refusals_are_named():
    check_args("open", {"size": 2, "whatever": 1})
    assert load("open", whatever=1).options == {"whatever": 1}
    with pytest.raises(EnvArgsError, match="env_args size = 'x' is not int"):
        check_args("open", {"size": "x"})
    with pytest.raises(EnvArgsError, match="'open' refused its env_args: size must be >= 1"):
        load("open", size=0)


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown environment 'nope'; known environments: arith"):
        check_args("nope", {})
