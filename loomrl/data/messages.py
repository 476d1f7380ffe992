"""Chat messages that open an episode (an example's ``messages``), checked before use.

An opening conversation is a non-empty list of ``{"role", "content"}`` objects with a
known role and text content, ending with a turn the model answers (not its own). Other
keys of a message (``name``, ``tool_calls``) are kept, except those that are null: a
table format stores every field of every message, and a chat template would otherwise
see ``tool_calls: None`` on a plain message.
"""

from __future__ import annotations

from typing import Any

ROLES = ("system", "user", "assistant", "tool")


def messages_problem(value: Any) -> str | None:
    """Why ``value`` is not an opening conversation (None when it is one)."""
    if type(value) is not list:
        return f"expected a list of messages, got {type(value).__name__}"
    if not value:
        return "an empty list of messages"
    for i, message in enumerate(value, 1):
        if type(message) is not dict:
            return f"message {i} is a {type(message).__name__}, not an object"
        for key in ("role", "content"):
            if key not in message:
                return f"message {i} has no {key!r}"
        if message["role"] not in ROLES:
            return f"message {i} has role {message['role']!r}; known roles: {', '.join(ROLES)}"
        if type(message["content"]) is not str:
            return f"message {i}: content is a {type(message['content']).__name__}, not a string"
    if value[-1]["role"] == "assistant":
        return (
            "the last message is the assistant's; an opening conversation ends with the "
            "turn the model answers"
        )
    return None


def opening_messages(value: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A fresh copy of checked messages (an episode appends to its own list), null-valued
    extra keys left out."""
    return [
        {k: v for k, v in m.items() if v is not None or k in ("role", "content")} for m in value
    ]
