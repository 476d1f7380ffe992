"""``ToolEnv``: environments whose actions are calls to Python functions.

Each assistant turn is parsed for tool calls. Calls are checked against the schema of
the function (from its signature and docstring), run concurrently (sync tools in
worker threads, each under its timeout) and answered with ``{"role": "tool",
"tool_call_id": ..., "name": ..., "content": ...}`` messages, in call order. Anything
wrong — a malformed call, an unknown tool, bad arguments, an exception inside the tool,
a timeout — comes back as an ``Error: ...`` tool message, never as a crash, so the model
can learn from it; each is counted by kind in the step's ``info["metrics"]``
(``tool_errors/<kind>``). A turn without a tool call is the final answer and ends the
episode.

The assistant message keeps the model's exact text as its ``content`` and gains the
well-formed calls as ``tool_calls`` (OpenAI's shape, arguments decoded), each with an id
in its format's form (``loomrl.parsers.call_id``; Mistral's own when the model wrote one);
each tool message answers its call's id. A malformed call stays text only: its error
message answers an id of its own that no call holds. Chat templates that render calls
and tool results from structure (Mistral, gpt-oss, ...) need this to render the glue.

The call format is ``parser``'s. The default, ``"auto"``, is the format the model's chat
template renders (``loomrl.parsers.detect``), settled when a rollout gives the environment
its template, before its first episode (``use_chat_template``); until then, and for a
template that renders no tool calls, it is ``hermes``. ``run_info`` names the parser in
use, so the run records it.

A tool sees its episode when it has a parameter named ``state`` (the ``EnvState``; left
out of the schema the model sees): it may keep per-episode data in ``state.data``, and
the environment's ``cleanup`` frees what lives outside. A tool may return text, any
JSON-able value (sent as JSON), or a ``ToolResult`` that also reports failure and counts.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loomrl import parsers
from loomrl.envs.base import Environment, EnvState, EnvStep, Message, call
from loomrl.envs.schema import function_schema, validate_arguments
from loomrl.parsers import ParsedCall, ToolCall, ToolCallError, new_call_id, read_reply, tool_call

#: The parameter name through which a tool receives its episode's ``EnvState``.
STATE_PARAMETER = "state"


class ToolUnavailable(RuntimeError):
    """A tool's backend is gone (its server died or never started): the episode fails
    with this reason instead of the model reading an error it did not cause."""


@dataclass(slots=True)
class ToolResult:
    """What a tool answers when plain text is not enough.

    ``content`` is what the model sees (text, or JSON-able data sent as JSON); ``error``
    names the kind of failure when the call failed (it is then counted in
    ``tool_errors/<error>``; the content should say what went wrong); ``metrics`` are
    numbers added to the episode's counts (e.g. ``sandbox_s``).
    """

    content: Any
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)


class ToolEnv(Environment):
    """An environment over ``tools``; subclasses supply ``score`` (and ``dataset``).

    With ``tools_in_prompt`` (the default) the system message lists the tools in the
    parser's format, which works with any chat template, and ``state.tools`` is None;
    otherwise ``state.tools`` carries the schemas for a tool-aware chat template.
    """

    name = "tool_env"
    max_turns = 4

    def __init__(
        self,
        tools: Sequence[Callable[..., Any]],
        *,
        parser: str = parsers.AUTO,
        max_turns: int | None = None,
        tools_in_prompt: bool = True,
        tool_timeout: float | None = 30.0,
        timeouts: Mapping[str, float | None] | None = None,
        max_obs_tokens: int | None = None,
    ) -> None:
        """``tool_timeout`` seconds per call (None: none), ``timeouts`` per tool name. A
        sync tool past its timeout is answered with an error at once, but its thread
        runs on to its end (Python cannot stop a thread): make long tools async, or give
        them their own deadline. ``max_obs_tokens`` caps each tool message. ``parser``
        names the call format (``loomrl.parsers``), or ``"auto"``: the chat template's."""
        self.tools: dict[str, Callable[..., Any]] = {}
        self.schemas: dict[str, dict[str, Any]] = {}
        self.wants_state: set[str] = set()
        for tool in tools:
            takes_state = STATE_PARAMETER in _parameters(tool)
            schema = getattr(tool, "tool_schema", None) or function_schema(
                tool, exclude=(STATE_PARAMETER,) if takes_state else ()
            )  # a remote tool (an MCP server's) brings the schema its server gave
            tool_name = schema["function"]["name"]
            if tool_name in self.tools:
                raise ValueError(f"two tools are named {tool_name!r}")
            self.tools[tool_name], self.schemas[tool_name] = tool, schema
            if takes_state:
                self.wants_state.add(tool_name)
        unknown = set(timeouts or {}) - set(self.tools)
        if unknown:
            raise ValueError(f"timeouts for unknown tools: {sorted(unknown)}")
        self.timeouts = {name: tool_timeout for name in self.tools} | dict(timeouts or {})
        for name, limit in self.timeouts.items():
            if limit is not None and not limit > 0:
                raise ValueError(f"tool {name!r}: timeout must be > 0 seconds or None")
        self.auto_parser = parser == parsers.AUTO
        #: The name of the parser in use (``auto``'s choice once a template is known).
        self.parser_name = parsers.FALLBACK if self.auto_parser else parser
        if self.parser_name not in parsers.available():
            known = ", ".join(parsers.available())
            raise ValueError(
                f"unknown tool-call parser {parser!r}; known: {known}, or 'auto' (the format "
                "the model's chat template renders, the default)"
            )
        self.parser = parsers.get(self.parser_name)
        self.tools_in_prompt = tools_in_prompt
        if max_turns is not None:
            self.max_turns = max_turns
        if max_obs_tokens is not None:
            self.max_obs_tokens = max_obs_tokens

    def use_chat_template(self, chat_template: str) -> None:
        """With ``parser="auto"``: take the format ``chat_template`` renders (a named
        parser stays as it is)."""
        if self.auto_parser:
            self.parser_name = parsers.choose(chat_template)
            self.parser = parsers.get(self.parser_name)

    def run_info(self) -> dict[str, Any]:
        """The tool-call parser in use (``auto``'s choice), for the run's record."""
        return {**super().run_info(), "parser": self.parser_name}

    def reset(self, example: dict[str, Any]) -> EnvState:
        state = super().reset(example)
        if not self.tools_in_prompt:
            state.tools = list(self.schemas.values())
            return state
        listing = self.parser.instructions(list(self.schemas.values()))
        if state.messages[0]["role"] == "system":
            system = state.messages[0]
            state.messages[0] = {**system, "content": f"{system['content']}\n\n{listing}"}
        else:
            state.messages.insert(0, {"role": "system", "content": listing})
        return state

    async def step(self, state: EnvState, message: Message) -> EnvStep:
        attempts = self.parse(message["content"])
        if not attempts:  # the final answer; its zeros keep the per-episode means honest
            counts = {"tool_calls": 0, "tool_errors": 0}
            return EnvStep(messages=[], done=True, info={**counts, "metrics": counts})
        ids = self.call_ids(state, attempts)
        pairs = zip(attempts, ids, strict=True)
        calls = [tool_call(a, i) for a, i in pairs if isinstance(a, ToolCall)]
        if calls:
            message["tool_calls"] = calls  # the turn read as structure, beside its text
        results = await asyncio.gather(*(self.answer(a, state) for a in attempts))
        rows = zip(attempts, ids, results, strict=True)
        messages = [_tool_message(i, a.name, _as_text(r.content)) for a, i, r in rows]
        counts: dict[str, float] = {"tool_calls": len(attempts), "tool_errors": 0}
        for result in results:
            if result.error is not None:
                counts["tool_errors"] += 1
                key = f"tool_errors/{result.error}"
                counts[key] = counts.get(key, 0) + 1
            for key, value in result.metrics.items():
                counts[key] = counts.get(key, 0.0) + value
        info = {
            "tool_calls": len(attempts),
            "tool_errors": int(counts["tool_errors"]),
            "metrics": counts,
        }
        return EnvStep(messages=messages, done=False, info=info)

    def call_ids(self, state: EnvState, attempts: Sequence[ParsedCall]) -> list[str]:
        """One id per call attempt, none the episode has used before (the model's own id
        kept where the format allows and it is new: ``loomrl.parsers.new_call_id``)."""
        issued = {m["tool_call_id"] for m in state.messages if m.get("tool_call_id")}
        issued |= {c["id"] for m in state.messages for c in m.get("tool_calls") or []}
        return [
            new_call_id(self.parser, issued, a.id if isinstance(a, ToolCall) else None)
            for a in attempts
        ]

    def final_answer(self, state: EnvState) -> str | None:
        """The text of the episode's final answer: the last assistant message when it
        makes no call attempt, read by the format (gpt-oss: its final channel); None
        when there is none (the episode ended on a call)."""
        replies = state.assistant_messages()
        if not replies:
            return None
        reply = read_reply(self.parser, replies[-1], self.schemas)
        return None if reply.calls else reply.content

    def parse(self, text: str) -> list[ParsedCall]:
        """The call attempts in one reply, read by this environment's parser (given the
        schemas: some formats write every argument as text, typed by the schema)."""
        return self.parser.parse(text, tools=self.schemas)

    async def answer(self, attempt: ParsedCall, state: EnvState | None = None) -> ToolResult:
        """One call attempt's answer: the tool's result, or ``Error: ...`` with its kind."""
        if isinstance(attempt, ToolCallError):
            return ToolResult(f"Error: {attempt.error}", getattr(attempt, "kind", "parse"))
        tool = self.tools.get(attempt.name)
        if tool is None:
            known = ", ".join(self.tools)
            text = f"Error: unknown tool {attempt.name!r}; available tools: {known}"
            return ToolResult(text, "unknown_tool")
        parameters = self.schemas[attempt.name]["function"]["parameters"]
        problems = validate_arguments(parameters, attempt.arguments)
        if problems:
            text = f"Error: invalid arguments for {attempt.name}: {'; '.join(problems)}"
            return ToolResult(text, "arguments")
        arguments = dict(attempt.arguments)
        if attempt.name in self.wants_state:
            arguments[STATE_PARAMETER] = state
        limit = self.timeouts[attempt.name]
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                result = await call(tool, **arguments)
        except TimeoutError as e:
            if not deadline.expired():  # the tool's own TimeoutError: its failure
                return ToolResult(f"Error: TimeoutError: {e}", "exception")
            text = f"Error: {attempt.name} took longer than its {limit:g} s timeout"
            return ToolResult(text, "timeout")
        except ToolUnavailable:
            raise  # not the model's doing: the episode fails with the reason
        except (Exception, SystemExit) as e:  # an observation for the model, not a crash
            # (SystemExit too: sys.exit() or argparse in a tool must not end the process.)
            return ToolResult(f"Error: {type(e).__name__}: {e}", "exception")
        if not isinstance(result, ToolResult):
            return ToolResult(result)
        if result.error is not None and result.content in (None, ""):
            result.content = f"Error: {result.error}"  # the model sees that the call failed
        return result


def _tool_message(id_: str, name: str | None, content: str) -> Message:
    """A tool-role message answering call ``id_``; ``name`` is left out when the call was
    unreadable."""
    if name is None:
        return {"role": "tool", "tool_call_id": id_, "content": content}
    return {"role": "tool", "tool_call_id": id_, "name": name, "content": content}


def _parameters(fn: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return str(result)
