"""Tool-call formats: how tools are described to the model and how its calls are read.

A parser is a small protocol registered by name: ``hermes`` (Hermes, Qwen2.5/3),
``qwen3_coder`` (Qwen3-Coder, Qwen3.5 XML), ``llama3_json`` (Llama 3.1-3.3), ``mistral``,
``harmony`` (gpt-oss), ``glm45`` (GLM-4.5/4.6) and ``deepseek_v3``; ``auto`` names the
one a model's chat template calls for (``loomrl.parsers.detect``). ``parse`` never raises
on model text: a malformed call becomes a ``ToolCallError`` item (with a ``kind`` for
metrics), in order with the good calls, so the environment can answer it with an error
message. ``loomrl.parsers.replies`` reads a reply as a structured assistant message.
"""

from __future__ import annotations

from loomrl.parsers.base import (
    MAX_CALLS,
    ParsedCall,
    ToolCall,
    ToolCallError,
    ToolCallParser,
    Tools,
)
from loomrl.parsers.deepseek import DeepSeekParser
from loomrl.parsers.detect import AUTO, FALLBACK, choose, detect
from loomrl.parsers.glm import GlmParser
from loomrl.parsers.harmony import HarmonyParser
from loomrl.parsers.hermes import HermesParser
from loomrl.parsers.llama3 import Llama3JsonParser
from loomrl.parsers.mistral import MistralParser
from loomrl.parsers.qwen3_coder import Qwen3CoderParser
from loomrl.parsers.replies import (
    Reply,
    call_id,
    new_call_id,
    prose,
    read_reply,
    template_messages,
    tool_call,
)

_PARSERS: dict[str, ToolCallParser] = {}


def register(name: str, parser: ToolCallParser) -> None:
    """Make ``get(name)`` return ``parser``."""
    _PARSERS[name] = parser


def get(name: str) -> ToolCallParser:
    """The parser registered as ``name``; ValueError naming the known ones otherwise
    (``auto`` is no parser: ``choose(template)`` names one)."""
    if name == AUTO and name not in _PARSERS:
        raise ValueError("'auto' is no parser: parsers.choose(chat_template) names one")
    if name not in _PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; known: {', '.join(sorted(_PARSERS))}")
    return _PARSERS[name]


def available() -> list[str]:
    """Registered parser names, sorted."""
    return sorted(_PARSERS)


register("hermes", HermesParser())
register("qwen3_coder", Qwen3CoderParser())
register("llama3_json", Llama3JsonParser())
register("mistral", MistralParser())
register("harmony", HarmonyParser())
register("glm45", GlmParser())
register("deepseek_v3", DeepSeekParser())

__all__ = [
    "AUTO",
    "FALLBACK",
    "MAX_CALLS",
    "DeepSeekParser",
    "GlmParser",
    "HarmonyParser",
    "HermesParser",
    "Llama3JsonParser",
    "MistralParser",
    "ParsedCall",
    "Qwen3CoderParser",
    "Reply",
    "ToolCall",
    "ToolCallError",
    "ToolCallParser",
    "Tools",
    "available",
    "call_id",
    "choose",
    "detect",
    "get",
    "new_call_id",
    "prose",
    "read_reply",
    "register",
    "template_messages",
    "tool_call",
]
