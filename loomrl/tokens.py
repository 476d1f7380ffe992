"""Chat-template token layer: prompt ids, inter-turn glue found by probe, LRU caches, checks.

A multi-turn trajectory is built by *concatenation*: ``prompt_ids(messages)``, then the
model's own tokens, then ``glue_ids(env_messages)``, then the model's tokens again, and so
on. History is never re-rendered, because many templates do not round-trip (Qwen3 strips
earlier ``<think>`` blocks, some templates strip whitespace); a re-render would train on
tokens the model never saw. ``verify`` re-renders on purpose, to measure that drift.

The glue between two model turns (close the assistant turn, render the environment's
messages, open the next generation prompt) is not hand-written per template: it is cut out
of a rendering of ``[user, assistant(PROBE), *env_messages]`` right after the probe, so any
template yields it, and a template that cannot be cut that way fails loudly.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from loomrl.codec import fast_decoder, fast_encoder

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["CacheStats", "ChatTokenizer", "LRUCache", "TemplateError", "VerifyResult", "verify"]

# Marker contents: plain ASCII that tokenizes the same anywhere and never occurs in templates.
PROBE = "LoomrlProbe7d1e"
CONTEXT_PROBE = "LoomrlContext3b9a"

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TemplateError(ValueError):
    """A chat template (or tokenizer) that the probe cannot cut into exact token pieces."""


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters of one LRU cache; ``size`` never exceeds ``capacity``."""

    hits: int
    misses: int
    evictions: int
    size: int
    capacity: int


class LRUCache(Generic[K, V]):
    """Bounded least-recently-used map: when full it evicts the oldest entry, never freezes.

    Not thread-safe: it lives in the event loop that runs the turn loops.
    """

    __slots__ = ("_data", "capacity", "evictions", "hits", "misses")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"cache capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()
        self.hits = self.misses = self.evictions = 0

    def get(self, key: K) -> V | None:
        """The cached value (marked most recent), or ``None`` on a miss."""
        value = self._data.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Store ``value``, evicting the least recently used entries beyond capacity."""
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)
            self.evictions += 1

    def __len__(self) -> int:
        return len(self._data)

    def stats(self) -> CacheStats:
        return CacheStats(self.hits, self.misses, self.evictions, len(self._data), self.capacity)

    def clear(self) -> None:
        self._data.clear()
        self.hits = self.misses = self.evictions = 0


_DICT, _LIST = object(), object()  # tags so a dict and a list of pairs never share a key


def _freeze(value: Any) -> Hashable:
    """Hashable exact form of JSON-like data; dict key order does not matter.

    Faster than ``json.dumps`` and reuses the strings' cached hashes; non-string scalars
    carry their type so ``True``, ``1`` and ``1.0`` stay distinct.
    """
    kind = type(value)
    if kind is str:
        return value
    if kind is dict:
        items = [(k, _freeze(v)) for k, v in value.items()]
        try:
            items.sort()  # keys are unique, so values are never compared
        except TypeError:  # keys of mixed types
            items.sort(key=lambda item: repr(item[0]))
        return (_DICT, *items)
    if kind is list or kind is tuple:
        return (_LIST, *[_freeze(v) for v in value])
    if isinstance(value, Mapping):
        return _freeze(dict(value))
    try:
        hash(value)
    except TypeError:
        return (kind, repr(value))
    return (kind, value)


def _key(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> Hashable:
    """Cache key of a rendering request."""
    return (_freeze(messages), None if tools is None else _freeze(tools))


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
    ) -> None:
        template = chat_template if chat_template is not None else tokenizer.chat_template
        if isinstance(template, Mapping):  # HF allows named templates; "default" is the chat one
            template = template.get("default")
        if not template:
            raise TemplateError(
                "the tokenizer has no chat template; pass chat_template=... (a Jinja string)"
            )
        self.tokenizer = tokenizer
        self._decode = fast_decoder(tokenizer, skip_special_tokens=False)
        self._encode = fast_encoder(tokenizer)
        self.chat_template: str = template
        self.template_kwargs = dict(template_kwargs or {})
        self._prompts: LRUCache[Hashable, tuple[int, ...]] = LRUCache(cache_size)
        self._glues: LRUCache[Hashable, tuple[int, ...]] = LRUCache(cache_size)
        self._marker_ids = frozenset(tokenizer.all_special_ids) | frozenset(
            getattr(tokenizer, "added_tokens_decoder", {})
        )
        closing = self._probe_tail([], add_generation_prompt=False, what="a final assistant turn")
        # What the template puts after an assistant turn's content (ChatML: "<|im_end|>\n").
        self.closing_ids: tuple[int, ...] = closing
        eot = []
        for token in closing:
            if token not in self._marker_ids:
                break
            eot.append(token)
        # The special tokens that open closing_ids: what a model emits to end its turn. Empty
        # for a template that closes turns with plain text; then the glue always closes it.
        self.end_of_turn_ids: tuple[int, ...] = tuple(eot)

    @classmethod
    def from_model(cls, spec: str | None = None, **kwargs: Any) -> ChatTokenizer:
        """Build from a loomrl model spec (default model if ``None``; never downloaded)."""
        from transformers import AutoTokenizer

        from loomrl.models import DEFAULT_MODEL, resolve

        return cls(AutoTokenizer.from_pretrained(resolve(spec or DEFAULT_MODEL)), **kwargs)

    # -- hot path -----------------------------------------------------------------------

    def prompt_ids(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None
    ) -> list[int]:
        """Ids of ``messages`` rendered with the generation prompt open (LRU-cached)."""
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
        ended_with_eot: bool,
        tools: Sequence[Any] | None = None,
    ) -> list[int]:
        """Ids to append after a model turn, up to and including the next generation prompt.

        They are the rest of the assistant turn's closing (all of ``closing_ids`` when the
        turn was cut by max_tokens or a stop string; without the leading end-of-turn tokens
        when the model emitted them itself, see ``ends_with_eot``), then ``env_messages``
        rendered, then the next generation prompt. Every glue token is mask 0. LRU-cached.
        """
        key = _key(env_messages, tools)
        ids = self._glues.get(key)
        if ids is None:
            ids = self._derive_glue(env_messages, tools)
            self._glues.put(key, ids)
        skip = len(self.end_of_turn_ids) if ended_with_eot else 0
        return list(ids[skip:])

    def ends_with_eot(self, token_ids: Sequence[int]) -> bool:
        """Whether a model turn's ids end with this template's end-of-turn tokens."""
        n = len(self.end_of_turn_ids)
        return n > 0 and tuple(token_ids[-n:]) == self.end_of_turn_ids

    # -- plumbing -----------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None = None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        """The template's text for ``messages`` (uncached)."""
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
        """Token ids of template text; special tokens come from the text, none are added."""
        return self._encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept, so markers stay visible."""
        return self._decode(ids)

    def cache_stats(self) -> dict[str, CacheStats]:
        """Counters of the ``prompt`` and ``glue`` caches."""
        return {"prompt": self._prompts.stats(), "glue": self._glues.stats()}

    def clear_caches(self) -> None:
        self._prompts.clear()
        self._glues.clear()

    # -- probing ------------------------------------------------------------------------

    def _derive_glue(
        self, env_messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None
    ) -> tuple[int, ...]:
        roles = [m.get("role") for m in env_messages]
        ids = self._probe_tail(
            env_messages, add_generation_prompt=True, tools=tools, what=f"glue for roles {roles}"
        )
        eot = self.end_of_turn_ids
        if ids[: len(eot)] != eot:
            raise TemplateError(
                f"chat template problem: an assistant turn followed by roles {roles} is not "
                f"closed by the end-of-turn token(s) {self.decode(eot)!r} that close a final "
                f"assistant turn; the template renders {self.decode(ids[:8])!r} after it, so "
                "the glue after an end-of-turn-ended model turn would be wrong"
            )
        return ids

    def _probe_tail(
        self,
        after: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool,
        what: str,
        tools: Sequence[Any] | None = None,
    ) -> tuple[int, ...]:
        """Ids of whatever the template renders after a probe assistant turn's content."""
        messages = [
            {"role": "user", "content": CONTEXT_PROBE},
            {"role": "assistant", "content": PROBE},
            *after,
        ]
        text = self.render(messages, tools, add_generation_prompt=add_generation_prompt)
        count = text.count(PROBE)
        if count != 1:
            fault = "drops or rewrites it" if count == 0 else "repeats it"
            raise TemplateError(
                f"chat template problem ({what}): the probe assistant content {PROBE!r} "
                f"appears {count} times in the rendering, expected exactly once; the "
                f"template {fault}, so the end of an assistant turn cannot be located. "
                f"Rendering: {text[:300]!r}"
            )
        cut = text.index(PROBE) + len(PROBE)
        head, tail = text[:cut], text[cut:]
        head_ids, tail_ids = self.encode(head), self.encode(tail)
        if head_ids + tail_ids != self.encode(text):
            raise TemplateError(
                f"chat template problem ({what}): the tokenizer merges text across the end "
                f"of assistant content: {tail[:40]!r} tokenizes differently alone than right "
                "after the content, so glue ids would not match what the template renders"
            )
        return tuple(tail_ids)


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """Outcome of ``verify``: ``ok``, or where and how the ids leave the re-rendering.

    ``index`` is the first position where they differ (``None`` when ok); ``context`` is
    the decoded text just before it; ``expected_text`` / ``actual_text`` decode what follows
    in the re-rendering and in the ids. ``leftover`` are rendering ids past the end of the
    ids that were accepted as the unfinished closing of the last turn.
    """

    ok: bool
    index: int | None
    expected_id: int | None
    actual_id: int | None
    context: str
    expected_text: str
    actual_text: str
    leftover: tuple[int, ...]
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return self.message


def verify(
    chat: ChatTokenizer,
    messages: Sequence[Mapping[str, Any]],
    token_ids: Sequence[int],
    tools: Sequence[Any] | None = None,
    *,
    add_generation_prompt: bool = False,
    window: int = 12,
) -> VerifyResult:
    """Compare concatenated ids with a fresh rendering of ``messages``; report the first drift.

    The rendering has no generation prompt unless asked (pass ``True`` when the ids end
    with one). It may run past the ids by at most a tail of ``chat.closing_ids``: a last
    turn that ended with its end-of-turn token, or was cut by max_tokens, is not closed.
    Only meaningful for templates that round-trip; for others it shows the drift.
    """
    rendered = chat.render(messages, tools, add_generation_prompt=add_generation_prompt)
    expected = chat.encode(rendered)
    ids = list(token_ids)
    n = min(len(ids), len(expected))
    index = next((i for i in range(n) if ids[i] != expected[i]), None)
    leftover: tuple[int, ...] = ()
    if index is None:
        rest, closing = tuple(expected[len(ids) :]), chat.closing_ids
        unclosed = not rest or (len(rest) <= len(closing) and closing[-len(rest) :] == rest)
        if len(ids) > len(expected) or not unclosed:
            index = n
        else:
            leftover = rest
    if index is None:
        note = f" (left over: {chat.decode(leftover)!r})" if leftover else ""
        message = f"ok: {len(ids)} ids match the re-rendered conversation{note}"
        return VerifyResult(True, None, None, None, "", "", "", leftover, message)

    exp_id = expected[index] if index < len(expected) else None
    act_id = ids[index] if index < len(ids) else None
    context = chat.decode(ids[max(0, index - window) : index])
    exp_text = chat.decode(expected[index : index + window])
    act_text = chat.decode(ids[index : index + window])

    def show(token: int | None) -> str:
        return "nothing (end)" if token is None else f"{token} {chat.decode([token])!r}"

    message = (
        f"drift at token {index} (ids: {len(ids)}, re-rendering: {len(expected)}): "
        f"the re-rendering has {show(exp_id)} where the ids have {show(act_id)}\n"
        f"  after:            {context!r}\n"
        f"  re-rendering has: {exp_text!r}\n"
        f"  ids have:         {act_text!r}"
    )
    return VerifyResult(False, index, exp_id, act_id, context, exp_text, act_text, (), message)
