"""Environment families: ``load("prefix:member", **kw)`` calls the family's factory with
the member first; unknown members and bad arguments are refused before anything is built."""

from __future__ import annotations

import pytest

from loomrl.envs import Environment, EnvState, available, load, register_family, registry
from loomrl.envs.registry import EnvArgsError, check_args


class Member(Environment):
    def __init__(self, member: str, size: int = 3) -> None:
        self.name, self.size = f"fam:{member}", size

    def score(self, state: EnvState) -> float:
        return float(self.size)


def check(member: str) -> None:
    if member not in {"a", "b"}:
        raise ValueError(f"no member {member!r}; known: a, b")


@pytest.fixture(autouse=True)
def family(monkeypatch):
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    register_family("fam", Member, "a test family", check=check)


def test_a_member_is_built_with_its_name_first():
    env = load("fam:b", size=5)
    assert isinstance(env, Member) and env.name == "fam:b" and env.size == 5


def test_the_family_is_listed_once_with_a_placeholder():
    assert available()["fam:NAME"] == "a test family"


@pytest.mark.parametrize("name", ["fam:zzz", "fam:", "other:a"])
def test_unknown_members_and_prefixes_are_refused_before_building(name):
    with pytest.raises(ValueError, match=r"zzz|no fam member|unknown environment"):
        check_args(name, {})


def test_arguments_are_checked_against_the_factory_without_its_member():
    with pytest.raises(EnvArgsError, match=r"size = '4' is not int"):
        check_args("fam:a", {"size": "4"})
    with pytest.raises(EnvArgsError, match=r"no argument\(s\) \['member'\]"):
        check_args("fam:a", {"member": "b"})


def test_a_taken_prefix_needs_replace():
    with pytest.raises(ValueError, match="already registered"):
        register_family("fam", Member, "again")
    register_family("fam", Member, "again", replace=True)
    assert available()["fam:NAME"] == "again"


class FakeEntryPoint:
    """An installed package's ``loomrl.envs`` entry point (what importlib.metadata gives)."""

    def __init__(self, name, value, target):
        self.name, self.value, self.target = name, value, target

    def load(self):
        if isinstance(self.target, Exception):
            raise self.target
        return self.target


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.setattr(registry, "_ENVS", dict(registry._ENVS))
    points = [
        FakeEntryPoint("pkg_env", "pkg.envs:PkgEnv", lambda size=1: Member("pkg", size)),
        FakeEntryPoint("broken_env", "pkg.broken:Env", ImportError("no module named pkg.x")),
    ]
    monkeypatch.setattr(registry, "_entry_points", lambda: points)


def test_an_installed_packages_env_is_listed_without_import_and_loads_by_name(plugins):
    assert "pkg.envs:PkgEnv" in available()["pkg_env"]
    env = load("pkg_env", size=4)
    assert env.size == 4 and "pkg_env" in registry._ENVS  # registered on first use
    with pytest.raises(EnvArgsError, match="no argument"):
        check_args("pkg_env", {"colour": 1})


def test_an_entry_point_that_fails_to_import_is_named(plugins):
    with pytest.raises(ValueError, match=r"pkg\.broken:Env, which failed to import: ImportError"):
        load("broken_env")
