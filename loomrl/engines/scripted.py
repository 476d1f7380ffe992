"""A deterministic engine for tests and orchestration benchmarks.

Replies come from a script (a list, used in order) or a callable. Time follows a cost
model of continuous batching, the shape of vLLM's scheduler: at most ``capacity``
sequences decode together, each engine step produces one token for every running
sequence and costs ``step_base_s + step_per_seq_s * running`` plus
``prefill_per_token_s`` for each prompt token admitted in that step. With all costs at
zero the engine answers without sleeping, which measures pure orchestration overhead.
Each step's cost is awaited through ``sleep`` (``asyncio.sleep`` unless a test passes a
fake clock), so tests can check the schedule, or hold the engine still, without timing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loomrl.codec import fast_decoder
from loomrl.engines.base import check_prompt, tokens_left
from loomrl.types import Completion, FinishReason, SamplingParams

Reply = str | Sequence[int]
# Deterministic negative logprobs (a fixed pattern; their values carry no meaning).
_LOGPROBS = [-0.01 * (1 + i % 97) for i in range(4096)]
ReplyFn = Callable[[Sequence[int], SamplingParams], Reply]


@dataclass(slots=True)
class _Request:
    request_id: str
    prompt_len: int
    tokens: list[int]
    finish_reason: FinishReason
    stop_reason: str | int | None
    future: asyncio.Future[Completion]
    produced: int = 0
    admitted: bool = field(default=False)


class ScriptedEngine:
    """Engine protocol over scripted replies with a simulated continuous-batching clock.

    Without a tokenizer, string replies are encoded as UTF-8 bytes (ids 0-255), which
    keeps unit tests free of model files; with one (any HF tokenizer) they use its ids
    and its EOS token, which is appended to every reply that does not end with it.
    ``decode_text=False`` leaves ``Completion.text`` empty, so orchestration benchmarks
    do not time the fake engine's own detokenisation. ``sleep`` is awaited with every
    step's cost instead of ``asyncio.sleep``: a fake clock for tests.

    ``generate`` takes ``images`` as a vision engine does and ignores them in its reply;
    ``images_seen`` maps the id of each request sent with images to those images, so
    tests of wrappers (pools, Ray actors) can check what got through (requests without
    images are not recorded: text-only benchmarks keep no per-request state).
    """

    def __init__(
        self,
        reply: ReplyFn | Sequence[Reply] | None = None,
        *,
        tokenizer: Any = None,
        max_model_len: int = 4096,
        vocab_size: int | None = None,
        eos_token_id: int | None = None,
        step_base_s: float = 0.0,
        step_per_seq_s: float = 0.0,
        prefill_per_token_s: float = 0.0,
        capacity: int = 256,
        decode_text: bool = True,
        sleep: Callable[[float], Awaitable[object]] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._reply = self._as_reply_fn(reply)
        self.tokenizer = tokenizer
        self._fast_decode: Callable[[Sequence[int]], str] | None = None
        self._max_model_len = max_model_len
        self._vocab_size = vocab_size or (len(tokenizer) if tokenizer is not None else 256)
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
        self.eos_token_id = eos_token_id
        self.step_base_s = step_base_s
        self.step_per_seq_s = step_per_seq_s
        self.prefill_per_token_s = prefill_per_token_s
        self.capacity = capacity
        self.decode_text = decode_text
        self._sleep = sleep
        self._policy_version = 0
        self.weight_updates: list[int] = []
        self._ids = itertools.count()
        self._waiting: deque[_Request] = deque()
        self._running: dict[str, _Request] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False
        self.steps = 0
        self.requests_served = 0
        self.images_seen: dict[str, list[Any]] = {}

    # -- protocol properties -------------------------------------------------------------
    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def policy_version(self) -> int:
        return self._policy_version

    def set_policy_version(self, version: int) -> None:
        """Simulate a weight update (tests of staleness and version stamping use this)."""
        self._policy_version = version

    async def update_weights(self, weights: Any, version: int | None = None) -> float:
        """The weight-sync contract without weights: abort what is in flight, bump the
        version, record the tensor count (a LoRA adapter's) in ``weight_updates``;
        returns 0 seconds."""
        await self.abort()
        self.weight_updates.append(len(getattr(weights, "tensors", weights)))
        self._policy_version = self._policy_version + 1 if version is None else version
        return 0.0

    @property
    def in_flight(self) -> int:
        """Requests queued or decoding; zero after every caller has returned or aborted."""
        return len(self._waiting) + len(self._running)

    # -- generation ----------------------------------------------------------------------
    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        images: Sequence[Any] | None = None,
    ) -> Completion:
        if self._closed:
            raise RuntimeError("ScriptedEngine is closed")
        check_prompt(prompt_ids, self._vocab_size, self._max_model_len)
        request_id = request_id or f"scripted-{next(self._ids)}"
        if images:
            self.images_seen[request_id] = list(images)
        ids = self._encode(self._reply(prompt_ids, params))
        budget = tokens_left(len(prompt_ids), params, self._max_model_len)
        tokens, finish, stop_reason = self._apply_stops(ids, params, budget)
        self.requests_served += 1
        if not (self.step_base_s or self.step_per_seq_s or self.prefill_per_token_s):
            await asyncio.sleep(0)
            return self._completion(request_id, len(prompt_ids), tokens, finish, stop_reason)
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        request = _Request(request_id, len(prompt_ids), tokens, finish, stop_reason, future)
        self._waiting.append(request)
        self._ensure_loop()
        try:
            return await future
        except asyncio.CancelledError:
            self._drop(request_id)
            raise

    async def abort(self, request_ids: str | Iterable[str] | None = None) -> list[str]:
        if request_ids is None:
            wanted = {r.request_id for r in self._waiting} | set(self._running)
        else:
            wanted = {request_ids} if isinstance(request_ids, str) else set(request_ids)
        aborted = []
        for request in [r for r in self._waiting if r.request_id in wanted] + [
            r for r in self._running.values() if r.request_id in wanted
        ]:
            self._drop(request.request_id)
            if not request.future.done():
                request.future.set_result(
                    self._completion(
                        request.request_id,
                        request.prompt_len,
                        request.tokens[: request.produced],
                        "abort",
                        None,
                    )
                )
            aborted.append(request.request_id)
        return aborted

    async def close(self) -> None:
        await self.abort()
        self._closed = True
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task

    # -- internals -----------------------------------------------------------------------
    @staticmethod
    def _as_reply_fn(reply: ReplyFn | Sequence[Reply] | None) -> ReplyFn:
        if reply is None:
            return lambda _ids, _params: "ok"
        if callable(reply):
            return reply
        script = iter(list(reply))

        def next_reply(_ids: Sequence[int], _params: SamplingParams) -> Reply:
            try:
                return next(script)
            except StopIteration:
                raise RuntimeError("ScriptedEngine script is exhausted") from None

        return next_reply

    def _encode(self, reply: Reply) -> list[int]:
        if isinstance(reply, str):
            if self.tokenizer is None:
                ids = list(reply.encode())
            else:
                ids = self.tokenizer.encode(reply, add_special_tokens=False)
            if self.eos_token_id is not None and (not ids or ids[-1] != self.eos_token_id):
                ids.append(self.eos_token_id)
            return ids
        return list(reply)

    def _decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:  # EOS is left out, as skip_special_tokens does below
            return bytes(t for t in ids if t < 256 and t != self.eos_token_id).decode(
                errors="replace"
            )
        if self._fast_decode is None:
            self._fast_decode = fast_decoder(self.tokenizer, skip_special_tokens=True)
        return self._fast_decode(ids)

    def _apply_stops(
        self, ids: list[int], params: SamplingParams, budget: int
    ) -> tuple[list[int], FinishReason, str | int | None]:
        """Cut a scripted reply the way a real engine's stop checks would."""
        floor = params.min_tokens
        if not (params.stop or params.stop_token_ids or floor):
            # Fast path (no stop strings, stop ids or min_tokens): only EOS can end early.
            head = ids[:budget]
            if self.eos_token_id in head and not params.ignore_eos:
                return ids[: head.index(self.eos_token_id) + 1], "stop", None
            return (ids[:budget], "length", None) if len(ids) >= budget else (ids, "stop", None)
        for i, token in enumerate(ids[:budget]):
            if i + 1 <= floor:
                continue
            if token == self.eos_token_id and not params.ignore_eos:
                return ids[: i + 1], "stop", None
            if token in params.stop_token_ids:
                return ids[: i + 1], "stop", token
            if params.stop:
                # Like vLLM: only a stop string ending in this token's text counts (so one
                # inside the first min_tokens never does); the one ending first wins.
                text, seen = self._decode(ids[: i + 1]), len(self._decode(ids[:i]))
                ends = [
                    (at + len(s), s)
                    for s in params.stop
                    if (at := text.find(s, max(0, seen - len(s) + 1))) != -1
                ]
                if ends:
                    return ids[: i + 1], "stop", min(ends, key=lambda end: end[0])[1]
        # Like vLLM: a reply that fills the budget without ending on a stop hit the limit.
        if len(ids) >= budget:
            return ids[:budget], "length", None
        return ids, "stop", None

    def _completion(
        self,
        request_id: str,
        prompt_len: int,
        tokens: list[int],
        finish: FinishReason,
        stop_reason: str | int | None,
    ) -> Completion:
        logprobs = (
            _LOGPROBS[: len(tokens)]
            if len(tokens) <= len(_LOGPROBS)
            else [_LOGPROBS[i % len(_LOGPROBS)] for i in range(len(tokens))]
        )
        return Completion(
            token_ids=tokens,
            logprobs=logprobs,
            text=self._decode(tokens) if self.decode_text else "",
            finish_reason=finish,
            policy_version=self._policy_version,
            stop_reason=stop_reason,
            prompt_len=prompt_len,
            request_id=request_id,
        )

    def _drop(self, request_id: str) -> None:
        self._running.pop(request_id, None)
        for request in self._waiting:
            if request.request_id == request_id:
                self._waiting.remove(request)
                break

    def _ensure_loop(self) -> None:
        self._wake.set()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        """The simulated engine core: admit, sleep one step's cost, advance every sequence."""
        while True:
            if not self._waiting and not self._running:
                self._wake.clear()
                await self._wake.wait()
                continue
            prefill = 0
            while self._waiting and len(self._running) < self.capacity:
                request = self._waiting.popleft()
                self._running[request.request_id] = request
                prefill += request.prompt_len
            cost = (
                self.step_base_s
                + self.step_per_seq_s * len(self._running)
                + self.prefill_per_token_s * prefill
            )
            await (self._sleep or asyncio.sleep)(cost)
            self.steps += 1
            for request in list(self._running.values()):
                request.produced += 1
                if request.produced >= len(request.tokens):
                    del self._running[request.request_id]
                    if not request.future.done():
                        request.future.set_result(
                            self._completion(
                                request.request_id,
                                request.prompt_len,
                                request.tokens,
                                request.finish_reason,
                                request.stop_reason,
                            )
                        )
