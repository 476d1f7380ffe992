"""Samples as plain JSON data for the replay buffer's log: never pickles.

A sample is stored as four values: its trajectory (a JSON object, one key per
``Trajectory`` field), the stop strings of its next generation (a JSON list or NULL),
whether it ended, and its env state (JSON, with ``hook`` saying who reads it back:
``plain`` for the default ``Environment.state_dict``, ``env`` for an environment's own).
Reading builds each record field by field and checks every value's type, so a row can
hold nothing but data: a bad one raises ``ValueError`` naming the field.

Strings are written ASCII-escaped, so any Python string (a lone surrogate included) is
stored. Exactness: ints and strings round-trip as they are; a float is written by ``repr``,
which reads back bit-exact. Tuples come back as tuples where the records have them
(``spans``, ``stop``). Non-finite floats do not occur under the token contract; the typed
float fields (logprobs, rewards, timings) write them as the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"``, so a trajectory is always standard JSON. Free-form
values (messages, env states) are written by Python's ``json``, which spells them
``NaN`` / ``Infinity`` and reads them back.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from loomrl.envs.base import Environment, EnvState, check_plain, plain_state, state_from_plain
from loomrl.producer.group import SavedState
from loomrl.types import Status, Trajectory

PLAIN, OWN = "plain", "env"  # who wrote a state: the default state_dict, or the env's own
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


# -- trajectories ---------------------------------------------------------------------------
def traj_to_json(traj: Trajectory) -> str:
    """``traj`` as one JSON object (standard JSON: non-finite floats become strings)."""
    data = {f.name: getattr(traj, f.name) for f in fields(Trajectory)}
    data["status"] = str(traj.status)
    data["spans"] = [list(span) for span in traj.spans]
    data["logprobs"] = _floats_out(traj.logprobs)
    data["reward"] = _float_out(traj.reward)
    data["turn_rewards"] = [None if r is None else _float_out(r) for r in traj.turn_rewards]
    data["reward_components"] = {k: _float_out(v) for k, v in traj.reward_components.items()}
    data["timings"] = {k: _float_out(v) for k, v in traj.timings.items()}
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


def traj_from_json(text: str) -> Trajectory:
    """The trajectory ``traj_to_json`` wrote; ``ValueError`` names a missing, unknown or
    ill-typed field."""
    data = json.loads(text)
    if type(data) is not dict:
        raise ValueError(f"a trajectory must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _READERS.keys())
    if unknown:
        raise ValueError(f"unknown trajectory fields {unknown}")
    values = {}
    for name, value in data.items():
        try:
            values[name] = _READERS[name](value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"trajectory field {name!r}: {exc}") from None
    missing = sorted(_REQUIRED - values.keys())
    if missing:
        raise ValueError(f"trajectory fields {missing} are missing")
    return Trajectory(**values)


# -- stop strings and env states ------------------------------------------------------------
def stop_to_json(stop: tuple[str, ...] | None) -> str | None:
    return None if stop is None else json.dumps(list(stop))


def stop_from_json(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    stop = json.loads(text)
    if type(stop) is not list or any(type(s) is not str for s in stop):
        raise ValueError("stop must be a list of strings or null")
    return tuple(stop)


def state_to_json(state: EnvState | SavedState, env: Environment | None) -> tuple[str, str]:
    """``(hook, JSON)`` for ``state``, through ``env``'s ``state_dict`` (the default one
    without an env). Raises when the state is not plain data (``TypeError``) or the env's
    hook fails: the caller then logs the sample without it."""
    if isinstance(state, SavedState):  # read from the log, not loaded yet: as it was
        data, hook = state.data, OWN
    elif env is None:
        data, hook = plain_state(state), PLAIN
    else:
        data = env.state_dict(state)
        hook = PLAIN if _default_loader(env) else OWN
        check_plain(data, f"{env.name}.state_dict()")
    return hook, json.dumps(data, separators=(",", ":"))


def state_from_json(hook: str, text: str, env: Environment | None) -> EnvState | SavedState:
    """The state ``state_to_json`` wrote. A state written by an env's own hook needs that
    env; without it, it stays a ``SavedState`` until ``ReplayBuffer.bind_envs``."""
    data = json.loads(text)
    if hook == PLAIN:
        return state_from_plain(data)
    if hook != OWN:
        raise ValueError(f"unknown env state hook {hook!r}")
    if type(data) is not dict:
        raise ValueError(f"an env state must be an object, got {type(data).__name__}")
    return SavedState(data) if env is None else load_own_state(env, data)


def load_own_state(env: Environment, data: dict[str, Any]) -> EnvState:
    """``env.load_state_dict(data)``, checked to give an ``EnvState``."""
    state = env.load_state_dict(data)
    if not isinstance(state, EnvState):
        raise ValueError(
            f"{env.name}.load_state_dict returned {type(state).__name__}, not an EnvState"
        )
    return state


def _default_loader(env: Environment) -> bool:
    """Whether ``env`` reads states back with the default ``load_state_dict``."""
    return getattr(env.load_state_dict, "__func__", None) is Environment.load_state_dict


# -- typed values ---------------------------------------------------------------------------
def _float_out(x: float) -> float | str:
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _floats_out(xs: list[float]) -> list[float | str]:
    if math.isfinite(sum(xs)):  # the common case, checked at C speed
        return xs
    return [_float_out(x) for x in xs]


def _int(x: Any) -> int:
    if type(x) is not int:
        raise TypeError(f"expected an integer, got {_kind(x)}")
    return x


def _str(x: Any) -> str:
    if type(x) is not str:
        raise TypeError(f"expected a string, got {_kind(x)}")
    return x


def _float(x: Any) -> float:
    if type(x) is float or type(x) is int:
        return x
    if type(x) is str and x in _NONFINITE:
        return _NONFINITE[x]
    raise TypeError(f"expected a number, got {_kind(x)}")


def _list(item: Callable[[Any], Any]) -> Callable[[Any], list[Any]]:
    def read(xs: Any) -> list[Any]:
        if type(xs) is not list:
            raise TypeError(f"expected a list, got {_kind(xs)}")
        return [item(x) for x in xs]

    return read


def _ints(xs: Any) -> list[int]:
    if type(xs) is list and all(type(x) is int for x in xs):  # fast path
        return xs
    return _list(_int)(xs)


def _floats(xs: Any) -> list[float]:
    if type(xs) is list and all(type(x) is float for x in xs):  # fast path
        return xs
    return _list(_float)(xs)


def _optional(item: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda x: None if x is None else item(x)


def _float_map(x: Any) -> dict[str, float]:
    if type(x) is not dict:
        raise TypeError(f"expected an object, got {_kind(x)}")
    return {k: _float(v) for k, v in x.items()}


def _objects(x: Any) -> list[dict[str, Any]]:
    if type(x) is not list or any(type(m) is not dict for m in x):
        raise TypeError("expected a list of objects")
    return x


def _span(x: Any) -> tuple[int, int]:
    if type(x) is not list or len(x) != 2:
        raise TypeError(f"a span is [start, end], got {x!r:.40}")
    return (_int(x[0]), _int(x[1]))


def _status(x: Any) -> Status:
    return Status(_str(x))


def _kind(x: Any) -> str:
    return "null" if x is None else type(x).__name__


_READERS: dict[str, Callable[[Any], Any]] = {
    "example_id": _int, "group_id": _int, "sample_index": _int, "env": _str,
    "prompt_ids": _ints, "completion_ids": _ints, "logprobs": _floats, "loss_mask": _ints,
    "messages": _objects, "spans": _list(_span), "span_versions": _ints,
    "finish_reasons": _list(_str), "turns": _int, "status": _status, "reward": _float,
    "reward_components": _float_map, "turn_rewards": _list(_optional(_float)),
    "error": _optional(_str), "timings": _float_map,
}  # fmt: skip
_REQUIRED = {"example_id", "group_id", "sample_index", "env"}
