"""Samples as plain data for the replay buffer's log: never pickles.

A sample is stored as: its trajectory's per-token lists packed into one binary array
(``tokens``: little-endian int32 ids, float64 logprobs, uint8 loss mask, after a header
of the four lengths), the rest of the trajectory as a JSON object (one key per field),
the stop strings of its next generation (a JSON list or NULL), whether it ended, and its
env state (JSON, with ``hook`` saying who reads it back: ``plain`` for the default
``Environment.state_dict``, ``env`` for an environment's own). Reading builds each
record field by field and checks every value's type and every length, so a row can hold
nothing but data: a bad one raises ``ValueError`` naming the field.

Why packed arrays for the token lists: they are most of a trajectory and are written at
every turn's checkpoint; packing is a copy (about 10x faster than writing them as JSON
text, and about half the size), and logprobs keep their exact IEEE-754 bits by
construction (-0.0, infinities and NaN included). Strings are written ASCII-escaped, so
any Python string (a lone surrogate included) is stored; ints and strings round-trip as
they are; tuples come back as tuples where the records have them (``spans``, ``stop``).
Floats in JSON are written by ``repr``, which reads back bit-exact; non-finite ones do
not occur under the token contract, but the typed float fields (rewards, timings) write
them as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, so a trajectory's JSON is
always standard JSON. Free-form values (messages, env states) are written by Python's
``json``, which spells them ``NaN`` / ``Infinity`` and reads them back.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
import sys
from array import array
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from loomrl.envs.base import Environment, EnvState, check_plain, plain_state, state_from_plain
from loomrl.producer.group import SavedState
from loomrl.types import Status, Trajectory

PLAIN, OWN = "plain", "env"  # who wrote a state: the default state_dict, or the env's own
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


# -- trajectories ---------------------------------------------------------------------------
TOKEN_FIELDS = ("prompt_ids", "completion_ids", "logprobs", "loss_mask")
_HEADER = struct.Struct("<4I")  # the four lengths
_INT32 = "i" if array("i").itemsize == 4 else "l"
_SWAP = sys.byteorder == "big"  # the file is little-endian everywhere


ImageRef = Callable[[Any], str]


def traj_to_row(traj: Trajectory, image_ref: ImageRef | None = None) -> tuple[str, bytes]:
    """``traj`` as (JSON object of every field but the token lists, packed token lists).
    A PIL image in the messages is written by ``image_ref`` (the log stores each image
    once and writes ``sha256:HASH``), else inline as a PNG data URL. Raises
    ``TypeError`` / ``ValueError`` / ``OverflowError`` for values that are not data of
    the record's types (e.g. a token id past int32)."""
    data = {f.name: getattr(traj, f.name) for f in fields(Trajectory)}
    for name in TOKEN_FIELDS:
        del data[name]
    if traj.segments:  # a forked episode's earlier segments, each stored as a row itself
        data["segments"] = [_segment_out(segment, image_ref) for segment in traj.segments]
    else:
        del data["segments"]
    data["status"] = str(traj.status)
    data["spans"] = [list(span) for span in traj.spans]
    data["reward"] = _float_out(traj.reward)
    data["turn_rewards"] = [None if r is None else _float_out(r) for r in traj.turn_rewards]
    data["reward_components"] = {k: _float_out(v) for k, v in traj.reward_components.items()}
    data["timings"] = {k: _float_out(v) for k, v in traj.timings.items()}
    data["env_metrics"] = {k: _float_out(v) for k, v in traj.env_metrics.items()}
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, default=_image_out(image_ref))
    prompt, completion = _packed(_INT32, traj.prompt_ids), _packed(_INT32, traj.completion_ids)
    logprobs, mask = _packed("d", traj.logprobs), bytes(traj.loss_mask)
    lengths = (len(traj.prompt_ids), len(traj.completion_ids), len(traj.logprobs), len(mask))
    return text, _HEADER.pack(*lengths) + prompt + completion + logprobs + mask


def traj_from_row(text: str, tokens: bytes) -> Trajectory:
    """The trajectory ``traj_to_row`` wrote; ``ValueError`` names a missing, unknown or
    ill-typed field, or token arrays whose size disagrees with their header."""
    data = json.loads(text)
    if type(data) is not dict:
        raise ValueError(f"a trajectory must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _READERS.keys())
    if unknown:
        raise ValueError(f"unknown trajectory fields {unknown}")
    values = _unpacked(tokens)
    for name, value in data.items():
        try:
            values[name] = _READERS[name](value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"trajectory field {name!r}: {exc}") from None
    missing = sorted(_REQUIRED - values.keys())
    if missing:
        raise ValueError(f"trajectory fields {missing} are missing")
    return Trajectory(**values)


def _image_out(image_ref: ImageRef | None) -> Callable[[Any], str]:
    """The JSON writer of an image in the messages: ``image_ref``, or a PNG data URL (read
    back by ``loomrl.vision``); anything else is not data."""

    def write(value: Any) -> str:
        from PIL import Image  # only when json meets something that is not plain data

        if not isinstance(value, Image.Image):
            raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
        if image_ref is not None:
            return image_ref(value)
        from loomrl.vision.images import data_url

        return data_url(value)

    return write


def _segment_out(segment: Trajectory, image_ref: ImageRef | None) -> dict[str, str]:
    text, tokens = traj_to_row(segment, image_ref)
    return {"row": text, "tokens": base64.b64encode(tokens).decode("ascii")}


def _segments(x: Any) -> list[Trajectory]:
    if type(x) is not list:
        raise TypeError(f"expected a list, got {_kind(x)}")
    out = []
    for item in x:
        if type(item) is not dict or set(item) != {"row", "tokens"}:
            raise TypeError('a segment is {"row": ..., "tokens": ...}')
        try:
            tokens = base64.b64decode(_str(item["tokens"]), validate=True)
        except binascii.Error as exc:
            raise ValueError(f"a segment's tokens are not base64 ({exc})") from None
        out.append(traj_from_row(_str(item["row"]), tokens))
    return out


def _packed(code: str, values: list[Any]) -> bytes:
    packed = array(code, values)
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def _unpacked(blob: bytes) -> dict[str, list[Any]]:
    if type(blob) is not bytes or len(blob) < _HEADER.size:
        raise ValueError("the token arrays are not a packed blob")
    lengths = _HEADER.unpack_from(blob)
    sizes = [n * k for n, k in zip(lengths, (4, 4, 8, 1), strict=True)]
    if len(blob) != _HEADER.size + sum(sizes):
        raise ValueError(
            f"the token arrays are {len(blob)} bytes; their header {list(lengths)} says "
            f"{_HEADER.size + sum(sizes)}"
        )
    out, at = {}, _HEADER.size
    for name, code, size in zip(TOKEN_FIELDS, (_INT32, _INT32, "d", "B"), sizes, strict=True):
        values = array(code, blob[at : at + size])
        if _SWAP and code != "B":
            values.byteswap()
        out[name], at = values.tolist(), at + size
    return out


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
    "messages": _objects, "spans": _list(_span), "span_versions": _list(_int),
    "finish_reasons": _list(_str), "span_temperatures": _list(_float), "turns": _int,
    "status": _status, "reward": _float,
    "reward_components": _float_map, "turn_rewards": _list(_optional(_float)),
    "error": _optional(_str), "timings": _float_map, "env_metrics": _float_map,
    "segments": _segments, "images": _list(_str),
}  # fmt: skip
_REQUIRED = {"example_id", "group_id", "sample_index", "env"}
