"""The environment registry: load, unknown names, listing, registration rules."""

from __future__ import annotations

import pytest

from loomrl.envs import Environment, EnvState, available, load, register, registry


class Constant(Environment):
    name = "constant"

    def __init__(self, value: float = 1.0) -> None:
        self.value = value

    def score(self, state: EnvState) -> float:
        return self.value


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_ENVS", dict(registry._ENVS))


def test_builtins_are_listed_with_one_line_descriptions():
    listing = available()
    assert {"arith", "guess_number", "calculator"} <= set(listing)
    assert list(listing) == sorted(listing)
    assert all(text and "\n" not in text for text in listing.values())


def test_load_builds_a_new_instance_each_time():
    first, second = load("arith"), load("arith")
    assert first is not second and first.name == "arith"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown environment 'nope'.*arith.*calculator"):
        load("nope")


def test_bad_keyword_arguments_surface():
    with pytest.raises(TypeError):
        load("arith", colour="red")


def test_register_and_load_a_custom_env(clean_registry):
    register("constant", Constant, "always\n  the same reward")
    assert available()["constant"] == "always the same reward"
    env = load("constant", value=0.5)
    assert isinstance(env, Constant) and env.value == 0.5


def test_register_refuses_silent_replacement_and_bad_names(clean_registry):
    register("constant", Constant, "x")
    with pytest.raises(ValueError, match="already registered"):
        register("constant", Constant, "y")
    register("constant", Constant, "y", replace=True)
    assert available()["constant"] == "y"
    for bad in ("", "a:b", " pad"):
        with pytest.raises(ValueError, match="invalid environment name"):
            register(bad, Constant, "z")


def test_factory_must_return_an_environment(clean_registry):
    register("not_env", lambda: object(), "broken")
    with pytest.raises(TypeError, match="not an Environment"):
        load("not_env")


def test_a_factory_named_by_string_is_imported_on_first_load(clean_registry):
    register("by_name", "loomrl.envs.arith:ArithEnv", "arith, by reference")
    assert available()["by_name"] == "arith, by reference"
    env = load("by_name", terms=3)
    assert env.name == "arith" and env.terms == 3
    register("missing", "loomrl.envs.arith:NoSuchEnv", "broken")
    with pytest.raises(ValueError, match=r"cannot load loomrl.envs.arith:NoSuchEnv"):
        load("missing")
    with pytest.raises(ValueError, match="'module:attribute'"):
        register("bad_ref", "loomrl.envs.arith", "no attribute")


def test_harness_envs_are_registered_without_importing_the_harness():
    """``envs`` sits below ``harness``: its registry names the harness's envs by string."""
    assert registry._ENVS["harness"].factory == "loomrl.harness.env:HarnessEnv"
    assert registry._FAMILIES["verifiers"].check == "loomrl.harness.verifiers:check"
    from loomrl.harness.env import HarnessEnv

    assert registry._factory("harness") is HarnessEnv
    assert "verifiers:NAME" in available()
