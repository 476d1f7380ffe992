"""JSON schemas from signatures and docstrings, and argument validation against them."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from loomrl.envs.schema import (
    check_value,
    function_schema,
    parse_docstring,
    type_schema,
    validate_arguments,
)


def search(query: str, limit: int = 10, exact: bool = False, tags: list[str] | None = None) -> str:
    """Search the notes for a query.

    Matches are ranked by recency.

    Args:
        query: Words to look for.
        limit: How many results to return, at most;
            older matches are dropped first.
        tags (list[str]): Only notes with one of these tags.

    Returns:
        The matching notes, one a line.
    """
    return ""


def test_schema_from_signature_and_docstring():
    schema = function_schema(search)
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "search"
    assert fn["description"] == "Search the notes for a query."
    params = fn["parameters"]
    assert params["type"] == "object"
    assert params["required"] == ["query"]
    props = params["properties"]
    assert props["query"] == {"type": "string", "description": "Words to look for."}
    assert props["limit"] == {
        "type": "integer",
        "description": "How many results to return, at most; older matches are dropped first.",
    }
    assert props["exact"] == {"type": "boolean"}  # undocumented: no description
    assert props["tags"]["anyOf"] == [
        {"type": "array", "items": {"type": "string"}},
        {"type": "null"},
    ]
    assert props["tags"]["description"] == "Only notes with one of these tags."


def test_schema_of_keyword_only_parameters_with_postponed_annotations():
    def tool(*, mode: Literal["a", "b"], weights: dict[str, float]) -> None:
        """Do it."""

    props = function_schema(tool)["function"]["parameters"]["properties"]
    assert props["mode"] == {"type": "string", "enum": ["a", "b"]}
    assert props["weights"] == {"type": "object", "additionalProperties": {"type": "number"}}


@pytest.mark.parametrize(
    ("hint", "schema"),
    [
        (float, {"type": "number"}),
        (Any, {}),
        (list, {"type": "array"}),
        (tuple[int, ...], {"type": "array"}),
        (dict, {"type": "object"}),
        (int | str, {"anyOf": [{"type": "integer"}, {"type": "string"}]}),
        (Literal[1, 2], {"type": "integer", "enum": [1, 2]}),
    ],
)
def test_type_schema(hint, schema):
    assert type_schema(hint) == schema


def test_unsupported_tools_are_rejected_at_construction():
    def untyped(x):
        """No hints."""

    def varargs(*xs: int) -> None:
        """Varargs."""

    def odd(x: set[int]) -> None:
        """A set."""

    with pytest.raises(TypeError, match="needs a type hint"):
        function_schema(untyped)
    with pytest.raises(TypeError, match="passable by keyword"):
        function_schema(varargs)
    with pytest.raises(TypeError, match="unsupported type hint"):
        function_schema(odd)
    with pytest.raises(TypeError, match="proper function name"):
        function_schema(lambda x: x)


def test_parse_docstring_without_sections():
    assert parse_docstring("Just one line.") == ("Just one line.", {})
    assert parse_docstring("") == ("", {})
    assert parse_docstring("Two\nlines.\n\nMore.") == ("Two lines.", {})


def test_validate_arguments_reports_every_problem():
    params = function_schema(search)["function"]["parameters"]
    assert validate_arguments(params, {"query": "x", "limit": 3, "tags": ["a"]}) == []
    assert validate_arguments(params, {"query": "x", "tags": None}) == []
    problems = validate_arguments(params, {"limit": "3", "colour": "red", "exact": 1})
    assert "missing required argument 'query'" in problems
    assert "argument 'limit' must be an integer, got string" in problems
    assert any(p.startswith("unknown argument 'colour'") and "query" in p for p in problems)
    assert "argument 'exact' must be a boolean, got integer" in problems
    assert len(problems) == 4


def test_check_value_details():
    assert check_value({"type": "integer"}, True) == "must be an integer, got boolean"
    assert check_value({"type": "number"}, 3) is None
    assert check_value({"type": "array", "items": {"type": "string"}}, ["a", 1]) == (
        "item 1 must be a string, got integer"
    )
    assert check_value({"enum": ["a", "b"]}, "c") == "must be one of ['a', 'b'], got 'c'"
    assert check_value({}, object()) is None
