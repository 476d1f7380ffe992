"""``parser = "auto"``: the tool-call format a model writes, read from its chat template.

A chat template that renders tool calls writes them in its family's own markup, so the
markers it holds name the format: gpt-oss's channels, Mistral's ``[TOOL_CALLS]``,
DeepSeek's tool-call block, GLM-4.5's argument tags, Qwen3-Coder's XML functions, Llama
3.1's ``ipython`` role, Hermes' ``<tool_call>``. A template with none of them (ChatML
without tools, as the default model's) gets ``hermes``, whose instructions in the system
prompt work with any template.
"""

from __future__ import annotations

from collections.abc import Mapping

AUTO = "auto"
"""The parser name that means: the one the model's chat template calls for."""
FALLBACK = "hermes"
"""The format of a template that renders no tool calls (and of ``auto`` before a
template is known)."""

# (parser, the markers a template of that format holds, all of them), most specific
# first: Qwen3-Coder's and GLM-4.5's templates also write <tool_call>, which alone is
# Hermes'; Llama 3.x templates without "ipython" (3.0) render no tool calls.
FORMATS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("harmony", ("<|channel|>",)),
    ("mistral", ("[TOOL_CALLS]",)),
    ("deepseek_v3", ("<｜tool▁calls▁begin｜>",)),
    ("glm45", ("<arg_key>",)),
    ("qwen3_coder", ("<function=", "<parameter=")),
    ("llama3_json", ("<|start_header_id|>", "ipython")),
    ("hermes", ("<tool_call>",)),
)


def detect(template: str | Mapping[str, str] | None) -> str | None:
    """The parser whose markers ``template`` holds, None when it holds none. A mapping
    of named templates (HF's ``{"default": ..., "tool_use": ...}``) is read whole."""
    if isinstance(template, Mapping):
        template = "\n".join(t for t in template.values() if isinstance(t, str))
    if not template:
        return None
    for name, markers in FORMATS:
        if all(marker in template for marker in markers):
            return name
    return None


def choose(template: str | Mapping[str, str] | None) -> str:
    """The parser for ``template``: ``detect``'s, else ``FALLBACK``."""
    return detect(template) or FALLBACK
