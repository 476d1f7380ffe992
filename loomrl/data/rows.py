"""One raw row of a data file -> one example: column mapping, plain values, checks.

``map`` renames source columns to the keys environments read: ``question`` (the user's
opening message; ``prompt`` is another name for it), ``messages`` (an opening
conversation instead of a question) and ``answer`` (the reference). A mapped column is
moved (the source name is gone) and replaces a column of the target's name; every other
column is kept as it is. A source ``id`` column is kept as ``source_id`` (dropped when the
source has one of that name too): ``id`` is the example's place in the loaded data.

A row needs a non-empty string ``question`` or valid ``messages`` (a JSON string holding
them, as a CSV cell does, is parsed); a null counts as absent. With both, ``messages``
open the episode and ``question`` stays as data.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import Any

from loomrl.data.errors import DataError, shown
from loomrl.data.messages import messages_problem, opening_messages
from loomrl.data.values import plain

TARGETS = ("question", "answer", "messages")
ALIASES = {"prompt": "question"}


def map_problem(mapping: Mapping[str, str]) -> str | None:
    """Why ``mapping`` is not a column mapping (None when it is one)."""
    seen: dict[str, str] = {}
    for target, source in mapping.items():
        key = ALIASES.get(target, target)
        if key not in TARGETS:
            return f"unknown target {target!r}; targets: question (or prompt), answer, messages"
        if key in seen:
            return f"{seen[key]!r} and {target!r} both map to {key!r}"
        if not isinstance(source, str) or not source:
            return f"{target} must name a column, got {shown(source)}"
        seen[key] = target
    return None


def canonical_map(mapping: Mapping[str, str] | None) -> dict[str, str]:
    """``mapping`` checked, with aliases resolved: ``{target: source column}``."""
    mapping = dict(mapping or {})
    problem = map_problem(mapping)
    if problem:
        raise DataError(f"map: {problem}")
    return {ALIASES.get(t, t): s for t, s in mapping.items()}


def check_columns(columns: list[str], mapping: Mapping[str, str], where: str) -> None:
    """Each mapped source column must be one of ``columns`` (listed in the error, with the
    nearest name if any); without a mapping, some column must hold the question."""
    for target, source in mapping.items():
        if source not in columns:
            near = difflib.get_close_matches(source, columns, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise DataError(
                f"{where}: map {target} = {source!r} names no column{hint}; "
                f"columns: {', '.join(columns) or 'none'}"
            )
    if not ({"question", "messages"} & (set(mapping) | set(columns))):
        raise DataError(
            f"{where}: no 'question' or 'messages' column; columns: {', '.join(columns)}; "
            'map one, e.g. map = {question = "COLUMN"} (--map question=COLUMN)'
        )


def to_example(raw: Any, mapping: Mapping[str, str], where: str) -> dict[str, Any]:
    """The example (without its ``id``) that ``raw``, found at ``where``, becomes."""
    if type(raw) is not dict:
        raise DataError(f"{where}: not an object but a {type(raw).__name__}")
    example: dict[str, Any] = {}
    for target, source in mapping.items():
        if source not in raw:
            raise DataError(f"{where}: no column {source!r} (map {target} = {source!r})")
        example[target] = plain(raw[source], f"{where}: column {source!r}")
    moved = set(mapping.values())
    for column, value in raw.items():
        if column in moved or column in mapping:
            continue
        if column == "id" and "source_id" in raw:
            continue  # the source has its own source_id: its id is dropped
        name = "source_id" if column == "id" else column
        example[name] = plain(value, f"{where}: column {column!r}")
    return _checked(example, mapping, where)


def _checked(example: dict[str, Any], mapping: Mapping[str, str], where: str) -> dict[str, Any]:
    """``example`` with its question or messages checked (messages parsed if JSON text)."""
    question, messages = example.get("question"), example.get("messages")
    q_col = mapping.get("question", "question")
    m_col = mapping.get("messages", "messages")
    if messages is not None and messages != "":
        if isinstance(messages, str):
            try:
                messages = json.loads(messages)
            except json.JSONDecodeError:
                raise DataError(
                    f"{where}: column {m_col!r}: text that is not a JSON list of messages"
                ) from None
        problem = messages_problem(messages)
        if problem:
            raise DataError(f"{where}: column {m_col!r}: {problem}")
        example["messages"] = opening_messages(messages)
    elif messages == "":
        example["messages"] = None
    if question is not None and not isinstance(question, str):
        raise DataError(
            f"{where}: column {q_col!r}: expected a string, got {type(question).__name__} "
            f"{shown(question)}"
        )
    if example.get("messages") is None:
        if question is None:
            raise DataError(f"{where}: no {q_col!r} or {m_col!r} value (null or missing)")
        if not question.strip():
            raise DataError(f"{where}: column {q_col!r} is empty")
    return example
