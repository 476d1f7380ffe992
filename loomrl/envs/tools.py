"""``ToolEnv``: environments whose actions are calls to Python functions.

Each assistant turn is parsed for tool calls. Calls are checked against the schema of
the function (from its signature and docstring), run concurrently (sync tools in
worker threads) and answered with ``{"role": "tool", "name": ..., "content": ...}``
messages, in call order. Anything wrong — malformed JSON, an unknown tool, bad
arguments, an exception inside the tool — comes back as an ``Error: ...`` tool message,
never as a crash, so the model can learn from it. A turn without a tool call is the
final answer and ends the episode.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any

from loomrl.envs import parsers
from loomrl.envs.base import Environment, EnvState, EnvStep, Message, call
from loomrl.envs.parsers import ParsedCall, ToolCallError
from loomrl.envs.schema import function_schema, validate_arguments


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
        parser: str = "hermes",
        max_turns: int | None = None,
        tools_in_prompt: bool = True,
    ) -> None:
        self.tools: dict[str, Callable[..., Any]] = {}
        self.schemas: dict[str, dict[str, Any]] = {}
        for tool in tools:
            schema = function_schema(tool)
            tool_name = schema["function"]["name"]
            if tool_name in self.tools:
                raise ValueError(f"two tools are named {tool_name!r}")
            self.tools[tool_name], self.schemas[tool_name] = tool, schema
        self.parser = parsers.get(parser)
        self.tools_in_prompt = tools_in_prompt
        if max_turns is not None:
            self.max_turns = max_turns

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
        attempts = self.parser.parse(message["content"], tools=list(self.schemas.values()))
        if not attempts:
            return EnvStep(messages=[], done=True, info={"tool_calls": 0})
        answers = await asyncio.gather(*(self.answer(a) for a in attempts))
        pairs = zip(attempts, answers, strict=True)
        messages = [_tool_message(a.name, text) for a, (text, _) in pairs]
        errors = sum(not ok for _, ok in answers)
        info = {"tool_calls": len(attempts), "tool_errors": errors}
        return EnvStep(messages=messages, done=False, info=info)

    async def answer(self, attempt: ParsedCall) -> tuple[str, bool]:
        """``(text, ok)`` answering one call attempt: the result, or ``Error: ...``."""
        if isinstance(attempt, ToolCallError):
            return f"Error: {attempt.error}", False
        tool = self.tools.get(attempt.name)
        if tool is None:
            known = ", ".join(self.tools)
            return f"Error: unknown tool {attempt.name!r}; available tools: {known}", False
        parameters = self.schemas[attempt.name]["function"]["parameters"]
        problems = validate_arguments(parameters, attempt.arguments)
        if problems:
            return f"Error: invalid arguments for {attempt.name}: {'; '.join(problems)}", False
        try:
            result = await call(tool, **attempt.arguments)
        except Exception as e:  # a tool failure is an observation for the model, not a crash
            return f"Error: {type(e).__name__}: {e}", False
        return _as_text(result), True


def _tool_message(name: str | None, content: str) -> Message:
    """A tool-role message; ``name`` is left out when the call was unreadable."""
    if name is None:
        return {"role": "tool", "content": content}
    return {"role": "tool", "name": name, "content": content}


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return str(result)
