"""The engine contract every backend meets, and the prompt checks they share.

vLLM does no bounds check on token-id prompts: an id past the vocabulary fails deep in
the model with an opaque error (a CUDA assert on GPU). Every engine therefore runs
``check_prompt`` before it queues a request, so bad input fails loudly and at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from loomrl.types import Completion, SamplingParams


@runtime_checkable
class Engine(Protocol):
    """What the rollout layer needs from an inference backend.

    ``generate`` takes token ids and returns token ids with the sampling logprob of each.
    An engine for a vision-language model also takes keyword ``images`` (PIL images, in
    the order of their blocks in the ids); callers pass it only when there are images, so
    text-only engines need not take it, and wrappers forward it the same way.
    ``abort`` ends in-flight requests; their ``generate`` calls return with
    ``finish_reason="abort"`` and the tokens produced so far (when the backend keeps them).
    """

    @property
    def max_model_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def policy_version(self) -> int: ...

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str | None = None
    ) -> Completion: ...

    async def abort(self, request_ids: str | Iterable[str] | None = None) -> list[str]:
        """Abort the given in-flight requests (all of them when ``None``); return their ids."""
        ...

    async def close(self) -> None: ...


class EngineUnavailable(ConnectionError):
    """The replica cannot serve: connection refused or reset, process died, timed out.

    Engines raise it (or another ``ConnectionError`` / ``TimeoutError``) when the fault is
    the replica's, not the request's: an engine pool then retires the replica and sends the
    same request to another one.
    """


class PromptTooLongError(ValueError):
    """The prompt leaves no room for a single generated token in the model's context."""


def check_prompt(prompt_ids: Sequence[int], vocab_size: int, max_model_len: int) -> None:
    """Raise ``ValueError`` naming what is wrong with a token-id prompt, else return."""
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty: an engine needs at least one prompt token")
    if min(prompt_ids) < 0 or max(prompt_ids) >= vocab_size:
        bad = [(i, t) for i, t in enumerate(prompt_ids) if not 0 <= t < vocab_size]
        shown = ", ".join(f"position {i}: {t}" for i, t in bad[:8])
        more = f" (and {len(bad) - 8} more)" if len(bad) > 8 else ""
        raise ValueError(
            f"prompt_ids has {len(bad)} token id(s) outside [0, {vocab_size}): {shown}{more}"
        )
    if len(prompt_ids) >= max_model_len:
        raise PromptTooLongError(
            f"prompt of {len(prompt_ids)} tokens does not fit the model context of "
            f"{max_model_len} tokens (it must leave room for at least one generated token)"
        )


def tokens_left(prompt_len: int, params: SamplingParams, max_model_len: int) -> int:
    """The number of tokens a request may generate: ``max_tokens`` clamped to the context."""
    return min(params.max_tokens, max_model_len - prompt_len)
