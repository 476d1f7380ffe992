"""The OpenAI chat-completions wire format, as far as a harness endpoint serves it.

``parse_request`` turns a request body into a ``ChatRequest`` or raises ``RequestError``
(an HTTP status and an OpenAI-style error object naming the parameter). A request's
``stop`` and ``max_completion_tokens`` / ``max_tokens`` apply to its turn (within the
rollout's ``max_tokens`` and context): they say where the agent's turn ends, as in
deployment. What it says about the distribution (temperature, top_p, seed, penalties,
...) is accepted but does not apply: the rollout's ``SamplingParams`` sample every turn,
so that what is trained on was sampled by the behaviour policy the run says it was.
Parameters that would change what comes back (``n > 1``, ``logit_bias``, JSON schemas,
forced tool choice, audio, ...) are refused with a 400 rather than silently ignored.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

ROLES = ("system", "developer", "user", "assistant", "tool")

#: Accepted, and governed by the rollout's sampling parameters instead (see module doc).
SAMPLING_KEYS = frozenset(
    {
        "model", "temperature", "top_p", "top_k", "seed", "presence_penalty",
        "frequency_penalty", "repetition_penalty", "min_p", "min_tokens", "user",
        "metadata", "store", "parallel_tool_calls",
        "reasoning_effort", "service_tier", "stream_options", "skip_special_tokens",
        "return_token_ids", "extra_body",
    }
)  # fmt: skip
#: Parameters that would change the answer's shape or content in ways not served here.
REFUSED_KEYS = frozenset(
    {
        "logit_bias", "functions", "function_call", "audio", "modalities", "prediction",
        "web_search_options", "guided_json", "guided_regex", "guided_choice",
        "guided_grammar", "structured_outputs", "best_of", "echo",
    }
)  # fmt: skip
KNOWN_KEYS = frozenset(
    {
        "messages", "tools", "tool_choice", "stream", "n", "logprobs", "top_logprobs",
        "response_format", "stop", "max_tokens", "max_completion_tokens",
        "include_stop_str_in_output",
    }
)  # fmt: skip


class RequestError(Exception):
    """A request the endpoint refuses: ``status`` and an OpenAI-style error body."""

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {
            "error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}
        }


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A checked request: messages with text content, tool schemas, how to answer."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None
    tool_choice: str
    stream: bool
    include_usage: bool
    logprobs: bool
    model: str
    #: Where this turn ends: stop strings (the answer's text stops before the first, as
    #: OpenAI's does, unless ``include_stop_str_in_output``) and a token cap.
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None
    keep_stop: bool = False


def parse_request(body: Any) -> ChatRequest:
    """``body`` (decoded JSON) as a ``ChatRequest``; ``RequestError`` says what is wrong."""
    if type(body) is not dict:
        raise RequestError("the request body must be a JSON object")
    unknown = sorted(set(body) - KNOWN_KEYS - SAMPLING_KEYS - REFUSED_KEYS)
    if unknown:
        raise RequestError(
            f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0]
        )
    for key in sorted(set(body) & REFUSED_KEYS):
        if body[key] not in (None, {}, [], False):
            raise RequestError(f"{key!r} is not supported by this endpoint", param=key)
    n = body.get("n", 1)
    if n not in (None, 1) or type(n) is bool:
        raise RequestError(f"n must be 1 (one trajectory per session), got {n!r}", param="n")
    if body.get("top_logprobs") not in (None, 0):
        raise RequestError("top_logprobs are not served (only logprobs)", param="top_logprobs")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise RequestError(
            "response_format other than {'type': 'text'} is not supported",
            param="response_format",
        )
    stream, logprobs = body.get("stream", False), body.get("logprobs", False)
    for key, value in (("stream", stream), ("logprobs", logprobs)):
        if value is not None and type(value) is not bool:
            raise RequestError(f"{key} must be a boolean", param=key)
    options = body.get("stream_options") or {}
    if type(options) is not dict:
        raise RequestError("stream_options must be an object", param="stream_options")
    model = body.get("model", "")
    return ChatRequest(
        messages=_messages(body.get("messages")),
        tools=_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice")),
        stream=bool(stream),
        include_usage=bool(options.get("include_usage")),
        logprobs=bool(logprobs),
        model=model if type(model) is str else "",
        stop=_stop(body.get("stop")),
        max_tokens=_max_tokens(body),
        keep_stop=_flag(body, "include_stop_str_in_output"),
    )


def _stop(value: Any) -> tuple[str, ...]:
    """``stop``: None, a string, or a list of non-empty strings (any number of them, as
    vLLM's server takes; OpenAI's own API allows four)."""
    if value is None:
        return ()
    values = [value] if type(value) is str else value
    if type(values) is not list or not all(type(v) is str and v for v in values):
        raise RequestError(
            f"stop must be a non-empty string or a list of them, got {value!r:.80}", param="stop"
        )
    return tuple(dict.fromkeys(values))


def _max_tokens(body: dict[str, Any]) -> int | None:
    """``max_completion_tokens``, else the older ``max_tokens``: positive integers (both
    are checked when both are sent; the newer one applies)."""
    values = {}
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and (type(value) is not int or value < 1):
            raise RequestError(f"{key} must be a positive integer, got {value!r:.80}", param=key)
        values[key] = value
    newer = values["max_completion_tokens"]
    return newer if newer is not None else values["max_tokens"]


def _flag(body: dict[str, Any], key: str) -> bool:
    """An optional boolean parameter (absent or null: false)."""
    value = body.get(key)
    if value is not None and type(value) is not bool:
        raise RequestError(f"{key} must be a boolean, got {value!r:.80}", param=key)
    return bool(value)


def _messages(value: Any) -> list[Message]:
    if type(value) is not list or not value:
        raise RequestError("messages must be a non-empty list", param="messages")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if type(message) is not dict:
            raise RequestError(f"{where} must be an object", param=where)
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(
                f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}", param=where
            )
        content = _text(message.get("content"), f"{where}.content")
        if content is None and not (role == "assistant" and message.get("tool_calls")):
            raise RequestError(f"{where} has no content", param=f"{where}.content")
        clean: Message = {"role": "system" if role == "developer" else role}
        clean["content"] = content if content is not None else ""
        if role == "assistant" and message.get("tool_calls"):
            clean["tool_calls"] = _tool_calls(message["tool_calls"], where)
        for key in ("tool_call_id", "name"):
            if type(message.get(key)) is str:
                clean[key] = message[key]
        out.append(clean)
    if out[-1]["role"] == "assistant":
        raise RequestError(
            "the last message is the assistant's: continuing an assistant message is not "
            "supported; end with the turn the model answers",
            param=f"messages[{len(out) - 1}]",
        )
    return out


def _text(content: Any, where: str) -> str | None:
    """Message content as text: a string, or a list of text parts joined."""
    if content is None or type(content) is str:
        return content
    if type(content) is list:
        parts = []
        for j, part in enumerate(content):
            if (
                type(part) is not dict
                or part.get("type") != "text"
                or type(part.get("text")) is not str
            ):
                kind = part.get("type") if type(part) is dict else type(part).__name__
                raise RequestError(
                    f"{where}[{j}] is a {kind!r} part; only text parts are supported",
                    param=where,
                )
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"{where} must be a string or a list of text parts", param=where)


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    if type(value) is not list:
        raise RequestError(f"{where}.tool_calls must be a list", param=where)
    calls = []
    for j, call in enumerate(value):
        function = call.get("function") if type(call) is dict else None
        if type(function) is not dict or type(function.get("name")) is not str:
            raise RequestError(f"{where}.tool_calls[{j}] has no function name", param=where)
        arguments = function.get("arguments", "{}")
        if type(arguments) is not str:
            arguments = json.dumps(arguments)
        calls.append(
            {
                "id": str(call.get("id", "")),
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return calls


def _tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None or value == []:
        return None
    if type(value) is not list:
        raise RequestError("tools must be a list", param="tools")
    for j, tool in enumerate(value):
        function = tool.get("function") if type(tool) is dict else None
        if type(function) is not dict or tool.get("type", "function") != "function":
            raise RequestError(f"tools[{j}] must be a function tool", param=f"tools[{j}]")
        if type(function.get("name")) is not str or not function["name"]:
            raise RequestError(f"tools[{j}].function has no name", param=f"tools[{j}]")
    return value


def _tool_choice(value: Any) -> str:
    if value in (None, "auto"):
        return "auto"
    if value == "none":
        return "none"
    raise RequestError(
        "tool_choice must be 'auto' or 'none' (forcing a call would change what the policy "
        f"sampled); got {value!r}",
        param="tool_choice",
    )


# -- answers --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Answer:
    """One model turn as the harness receives it."""

    id: str
    model: str
    message: Message
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[dict[str, Any]] | None = None

    def body(self) -> dict[str, Any]:
        """The ``chat.completion`` object."""
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": self.message,
                    "finish_reason": self.finish_reason,
                    "logprobs": None if self.logprobs is None else {"content": self.logprobs},
                }
            ],
            "usage": self.usage(),
        }

    def usage(self) -> dict[str, int]:
        total = self.prompt_tokens + self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": total,
        }

    def chunks(self, include_usage: bool) -> Iterator[dict[str, Any]]:
        """The same answer as ``chat.completion.chunk`` objects (server-sent events):
        the role, the content, each tool call, then the finish reason (and usage)."""
        created = int(time.time())

        def chunk(
            delta: dict[str, Any], finish: str | None = None, logprobs: Any = None
        ) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
            return {
                "id": self.id, "object": "chat.completion.chunk", "created": created,
                "model": self.model, "choices": [choice],
            }  # fmt: skip

        yield chunk({"role": "assistant", "content": ""})
        if self.message.get("content"):
            logprobs = None if self.logprobs is None else {"content": self.logprobs}
            yield chunk({"content": self.message["content"]}, logprobs=logprobs)
        for index, call in enumerate(self.message.get("tool_calls") or []):
            yield chunk({"tool_calls": [{"index": index, **call}]})
        yield chunk({}, self.finish_reason)
        if include_usage:
            usage_only = chunk({})
            usage_only["choices"] = []
            usage_only["usage"] = self.usage()
            yield usage_only
