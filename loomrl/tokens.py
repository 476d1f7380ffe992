"""Chat-template token layer: prompt ids, inter-turn glue found by probe, LRU caches, checks.

A multi-turn trajectory is built by *concatenation*: ``prompt_ids(messages)``, then the
model's own tokens, then ``glue_ids(env_messages)``, then the model's tokens again, and so
on. History is never re-rendered, because many templates do not round-trip (Qwen3 strips
earlier ``<think>`` blocks, some templates strip whitespace); a re-render would train on
tokens the model never saw. ``loomrl.token_check.verify`` re-renders on purpose, to
measure that drift.

The glue between two model turns (close the assistant turn, render the environment's
messages, open the next generation prompt) is not hand-written per template: it is cut out
of a rendering of ``[user, assistant(PROBE), *env_messages]`` right after the probe, so any
template yields it, and a template that cannot be cut that way fails loudly. After a turn
with tool calls the probe assistant carries the turn's ``tool_calls``, for templates that
render calls, and tool results by their call id, from structure (``loomrl.token_probe``).

How a model turn ends: marker tokens that the model emitted at the end of its turn and
that the glue starts with count as already emitted. They stay once, as the model's own
tokens (mask 1, with their logprobs), are skipped from the glue, and are not part of the
assistant message's text. ``turn_end`` finds them; one rule covers two template families:

- ChatML-like templates close an assistant turn with a marker (``<|im_end|>``) that the
  glue starts with; a turn cut by max_tokens or a stop string gets the whole closing. A
  turn with tool calls may close with a marker of its own (gpt-oss: ``<|call|>``).
- GLM-4.5-like templates render nothing after assistant content: the model ends its turn
  by emitting the next role marker (``<|user|>``, ``<|observation|>``: its stop tokens),
  found by probing the glue of a ``user`` and of a ``tool`` reply. Such a template warns
  (``TemplateWarning``) at construction: the engine's stop tokens must include them.
- A turn ending with a role marker that the glue does not start with (the model emitted
  ``<|user|>``, the environment answered with a ``tool`` message) keeps that marker (mask
  1: it was sampled, and the next turn saw it) and the glue follows whole, so both markers
  stand in the ids. The marker is still not in the message's text; ``verify`` reports the
  spot as drift, since no rendering holds the model's marker there.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from loomrl.codec import fast_decoder, fast_encoder
from loomrl.lru import CacheStats, LRUCache, freeze
from loomrl.token_probe import (
    TemplateError,
    TemplateWarning,
    call_turn_end,
    derive_glue,
    leading_markers,
    no_closing_warning,
    probe_calls,
    probe_tail,
    reply_markers,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["ChatTokenizer", "TemplateError", "TemplateWarning"]


def _check_text(messages: Sequence[Mapping[str, Any]], *, images: bool = False) -> None:
    """Refuse content that is not text (or, with ``images``, text and image parts): a
    template would render anything else as its Python repr, and the model would be
    trained on that text."""
    for i, message in enumerate(messages, 1):
        content = message.get("content")
        if images and type(content) is list and all(_text_or_image(p) for p in content):
            continue
        if content is not None and type(content) is not str:
            kinds = sorted(
                {str(p.get("type")) for p in content if isinstance(p, Mapping)}
                if isinstance(content, list)
                else {type(content).__name__}
            )
            raise TemplateError(
                f"message {i} ({message.get('role')}) has {'/'.join(kinds) or 'non-text'} "
                "content, not text: this token layer renders text messages only (images "
                "need a vision-language model's processor)"
            )


def _image_placeholders(message: Mapping[str, Any]) -> dict[str, Any]:
    """``message`` (checked by ``_check_text``) with each image part reduced to
    ``{"type": "image"}``: what a template renders, one placeholder per image, and what a
    cache key may hold. (``loomrl.vision`` sits above this layer and loads the images.)"""
    content = message.get("content")
    if isinstance(content, list):
        content = [p if p.get("type") == "text" else {"type": "image"} for p in content]
    return {**message, "content": content}


def _text_or_image(part: Any) -> bool:
    if not isinstance(part, Mapping):
        return False
    kind = part.get("type")
    return (kind == "text" and type(part.get("text")) is str) or kind in ("image", "image_url")


def _key(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None, calls: Any = None
) -> Hashable:
    """Cache key of a rendering request."""
    return (freeze(messages), None if tools is None else freeze(tools), freeze(calls))


class ChatTokenizer:
    """Token ids of chat prompts and of the glue between model turns, for one template.

    ``tokenizer`` is an HF tokenizer; ``chat_template`` overrides its template;
    ``template_kwargs`` go to every rendering (e.g. ``{"enable_thinking": False}``).
    Construction probes the template once and raises ``TemplateError`` if it cannot be cut.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        cache_size: int = 4096,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        image_token_id: int | None = None,
        image_block: Sequence[int] = (),
    ) -> None:
        template = chat_template if chat_template is not None else tokenizer.chat_template
        if isinstance(template, Mapping):  # HF allows named templates; "default" is the chat one
            template = template.get("default")
        if not template:
            raise TemplateError(
                "the tokenizer has no chat template; pass chat_template=... (a Jinja string)"
            )
        self.tokenizer = tokenizer
        #: Vision-language models: the placeholder a template renders per image part and
        #: the ids the model sees for it (``loomrl.vision.tokens``); None: text only.
        self.image_token_id = image_token_id
        self.image_block: tuple[int, ...] = tuple(image_block)
        if (image_token_id is None) != (not self.image_block):
            raise ValueError("image_token_id and image_block go together")
        self._decode = fast_decoder(tokenizer, skip_special_tokens=False)
        self._encode = fast_encoder(tokenizer)
        self.chat_template: str = template
        self.template_kwargs = dict(template_kwargs or {})
        self._prompts: LRUCache[Hashable, tuple[int, ...]] = LRUCache(cache_size)
        self._glues: LRUCache[Hashable, tuple[int, ...]] = LRUCache(cache_size)
        #: The special (marker) tokens: what the probes treat as a turn's markers.
        self.marker_ids = frozenset(tokenizer.all_special_ids) | frozenset(
            getattr(tokenizer, "added_tokens_decoder", {})
        )
        closing = probe_tail(self, [], add_generation_prompt=False, what="a final assistant turn")
        # What the template puts after an assistant turn's content (ChatML: "<|im_end|>\n").
        self.closing_ids: tuple[int, ...] = closing
        # The special tokens that open closing_ids: what a model emits to end its turn. Empty
        # for a template that closes turns with plain text or not at all; then the glue
        # always closes the turn, or the model ends it with the next role marker.
        self.end_of_turn_ids: tuple[int, ...] = leading_markers(self, closing)
        # The marker tokens that open the glue for each of REPLY_ROLES (GLM-4.5:
        # "<|user|>", "<|observation|>"; ChatML: the end-of-turn token again).
        self.reply_marker_ids: tuple[tuple[int, ...], ...] = reply_markers(self)
        # The markers a turn with tool calls ends with, when they are not end_of_turn_ids
        # (gpt-oss: "<|call|>", where a final turn ends with "<|return|>").
        self.call_end_ids: tuple[int, ...] = call_turn_end(self)
        ends = {self.end_of_turn_ids, self.call_end_ids, *self.reply_marker_ids} - {()}
        self._turn_ends = tuple(sorted(ends, key=len, reverse=True))  # longest match wins
        if not closing:
            warnings.warn(no_closing_warning(self), TemplateWarning, stacklevel=2)

    @classmethod
    def from_model(cls, spec: str | None = None, **kwargs: Any) -> ChatTokenizer:
        """Build from a loomrl model spec (default model if ``None``; a Hub name through
        the Hugging Face cache: ``loomrl.models.resolve``)."""
        from transformers import AutoTokenizer

        from loomrl.models import DEFAULT_MODEL, resolve

        return cls(AutoTokenizer.from_pretrained(resolve(spec or DEFAULT_MODEL)), **kwargs)

    # -- hot path -----------------------------------------------------------------------

    def prompt_ids(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None
    ) -> list[int]:
        """Ids of ``messages`` rendered with the generation prompt open (LRU-cached)."""
        messages = self._placeholders(messages)
        key = _key(messages, tools)
        ids = self._prompts.get(key)
        if ids is None:
            ids = tuple(self.encode(self.render(messages, tools, add_generation_prompt=True)))
            self._prompts.put(key, ids)
        return list(ids)

    def glue_ids(
        self,
        env_messages: Sequence[Mapping[str, Any]],
        *,
        ended_with_eot: bool = False,
        turn_end: Sequence[int] = (),
        tools: Sequence[Any] | None = None,
        calls: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Ids to append after a model turn, up to and including the next generation prompt.

        ``turn_end`` are the marker ids the model's turn ended with (``turn_end(ids)``);
        ``ended_with_eot=True`` is short for ``turn_end=end_of_turn_ids``. The glue is the
        closing of the assistant turn (all of it when the turn was cut by max_tokens or a
        stop string), then ``env_messages`` rendered, then the next generation prompt,
        without its first ids when they are the ``turn_end`` the model emitted itself (see
        the module docstring). ``calls`` are the turn's ``tool_calls``: templates that
        render calls from structure (and tool results by their call) see them; the glue
        never holds the template's spelling of them (``loomrl.token_probe``). Every glue
        token is mask 0. LRU-cached.
        """
        env_messages = self._placeholders(env_messages)
        probed = probe_calls(calls) if calls else None
        key = _key(env_messages, tools, probed)
        ids = self._glues.get(key)
        if ids is None:
            ids = derive_glue(self, env_messages, tools, probed)
            self._glues.put(key, ids)
        end = self.end_of_turn_ids if ended_with_eot else tuple(turn_end)
        skip = len(end) if end and ids[: len(end)] == end else 0
        return list(ids[skip:])

    def ends_with_eot(self, token_ids: Sequence[int]) -> bool:
        """Whether a model turn's ids end with this template's end-of-turn tokens."""
        n = len(self.end_of_turn_ids)
        return n > 0 and tuple(token_ids[-n:]) == self.end_of_turn_ids

    def turn_end(self, token_ids: Sequence[int]) -> tuple[int, ...]:
        """The marker ids a model turn ended with: its end-of-turn tokens, those that end a
        turn with tool calls, or the marker that opens a reply role's glue (longest match);
        ``()`` when it ended otherwise. They are the model's own tokens but not its
        message's text."""
        for end in self._turn_ends:
            if tuple(token_ids[-len(end) :]) == end:
                return end
        return ()

    # -- plumbing -----------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None = None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        """The template's text for ``messages`` (uncached); image parts render as the
        template's placeholder (a text-only tokenizer refuses them)."""
        messages = self._placeholders(messages)
        try:
            return self.tokenizer.apply_chat_template(
                list(messages),
                tools=list(tools) if tools else None,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **self.template_kwargs,
            )
        except Exception as exc:
            roles = [m.get("role") for m in messages]
            raise TemplateError(f"the chat template failed to render roles {roles}: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        """Token ids of template text; special tokens come from the text, none are added.
        For a vision-language model each image placeholder becomes the ids the model sees
        for an image (``image_block``), as its processor expands it."""
        ids = self._encode(text)
        if self.image_token_id is None or self.image_token_id not in ids:
            return ids
        out: list[int] = []
        for token in ids:
            if token == self.image_token_id:
                out += self.image_block
            else:
                out.append(token)
        return out

    @property
    def takes_images(self) -> bool:
        return self.image_token_id is not None

    def _placeholders(self, messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
        """``messages`` with image parts reduced to placeholders (what the template renders
        and a cache key holds); content that is not text is refused without a vision model."""
        if not any(type(m.get("content")) is not str for m in messages):
            return messages
        _check_text(messages, images=self.takes_images)
        return [_image_placeholders(m) for m in messages]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept, so markers stay visible."""
        return self._decode(ids)

    def cache_stats(self) -> dict[str, CacheStats]:
        """Counters of the ``prompt`` and ``glue`` caches."""
        return {"prompt": self._prompts.stats(), "glue": self._glues.stats()}

    def clear_caches(self) -> None:
        self._prompts.clear()
        self._glues.clear()
