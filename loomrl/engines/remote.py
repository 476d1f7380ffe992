"""A vLLM OpenAI-compatible server as a loomrl engine: ``engines.load("http://HOST:PORT")``.

Token ids go in (``/v1/completions`` with ``prompt`` a list of ids) and come out
(``return_token_ids``) with the logprob of each *sampled* token (``logprobs=0``: the
server's ``token_logprobs``, not a top-1 alternative). Replies are streamed in chunks of
``stream_interval`` tokens: the read timeout bounds the wait for one chunk, not a whole
generation, and ``abort`` keeps the tokens received before it. Sampling maps
``SamplingParams`` fully and pins every other knob to vLLM's neutral value, so a model's
``generation_config.json`` defaults on the server cannot change the behaviour policy.

Requests with images (a vision-language model) go to ``/inference/v1/generate``
instead, token-exact as ``VLLMEngine``'s (``remote_images``).

The server should be started by ``loomrl serve`` (``loomrl.engines.serve``): it serves
``processed_logprobs`` as ``VLLMEngine`` does, mixes loomrl's weight loader into the
workers, turns on the RL routes (``VLLM_SERVER_DEV_MODE=1``) that ``update_weights``
needs and the generate route (``--enable-scale-out``) that images need.
``await engine.check()`` (done by ``async with`` and by the first ``generate``) fetches
the context length and refuses a server that serves another model or tokenizer.

Weights travel through vLLM's weight-transfer routes into loomrl's ``loomrl_tcp`` backend:
the server's workers connect to the trainer and the tensors stream bucket by bucket, so
the server may run on another host (``remote_weights``, ``transfer_sender``). With
``weight_sync="file"`` they go as a safetensors file in ``/dev/shm`` that the server reads,
so both must share that path. Seconds per sync: docs/benchmarks.md "Weight sync".
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from loomrl.engines.base import check_prompt, tokens_left
from loomrl.engines.remote_check import ServerModel, identify
from loomrl.engines.remote_http import HttpSession, RemoteEngineError
from loomrl.engines.remote_images import (
    GENERATE,
    ImageRequests,
    read_choice,
    read_completion_choice,
    scale_out_hint,
)
from loomrl.engines.remote_sampling import NEUTRAL, sampling_fields
from loomrl.engines.remote_weights import (
    RemoteTransfer,
    load_weights,
    require_rl_routes,
    reset_prefix_cache,
)
from loomrl.engines.vllm_sync import sync_link
from loomrl.types import Completion, SamplingParams

if TYPE_CHECKING:
    import httpx
    import torch

__all__ = ["RemoteEngine"]


@dataclass
class _Pending:
    """What one in-flight request has received so far."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    aborted: bool = False
    task: asyncio.Task[None] | None = None


class RemoteEngine(RemoteTransfer):
    """An engine over HTTP. ``model`` (a loomrl model spec or local HF directory) names
    the run's model: ``check()`` refuses a server serving anything else, and its
    tokenizer becomes ``engine.tokenizer``. Without it nothing is compared and the
    tokenizer is loaded from the server's model directory when that path exists here."""

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        connect_retries: int = 3,
        retry_backoff_s: float = 0.5,
        max_connections: int = 1024,
        stream_interval: int = 16,
        policy_version: int = 0,
        transport: httpx.AsyncBaseTransport | None = None,
        weight_sync: str = "transfer",
    ) -> None:
        self.url = url.rstrip("/")
        self.model_spec = model
        self._http = HttpSession(
            self.url, api_key=api_key, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s,
            connect_retries=connect_retries, retry_backoff_s=retry_backoff_s,
            max_connections=max_connections, transport=transport,
        )  # fmt: skip
        self.stream_interval = stream_interval
        self._server: ServerModel | None = None
        self._check_lock = asyncio.Lock()
        self._policy_version = policy_version
        self._updating: asyncio.Event | None = None
        self._counter = itertools.count()
        self._in_flight: dict[str, _Pending] = {}
        self._closed = False
        self._tokenizer: Any = None
        self._images: ImageRequests | None = None
        host = urlsplit(self.url).hostname or "127.0.0.1"
        self._link = sync_link(weight_sync, host)

    # -- what the rollout layer reads -------------------------------------------------

    @property
    def max_model_len(self) -> int:
        return self._known().max_model_len

    @property
    def vocab_size(self) -> int:
        return self._known().vocab_size

    @property
    def served_model(self) -> str:
        return self._known().name

    @property
    def policy_version(self) -> int:
        return self._policy_version

    @property
    def vision(self) -> bool:
        """Whether the served model takes images (known from the run's model directory)."""
        from loomrl.models import is_vision

        path = self._known().local_dir
        return path is not None and is_vision(path)

    @property
    def model_path(self) -> Path | None:
        """The run's local model directory (where the rollout finds the processor)."""
        return self._known().local_dir

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def tokenizer(self) -> Any:
        """The run's tokenizer (the model spec's, else the server's model directory)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            path = self._known().local_dir
            if path is None:
                raise ValueError(
                    f"RemoteEngine({self.url}) has no local tokenizer: pass model=SPEC "
                    "(the served model's spec or directory)"
                )
            self._tokenizer = AutoTokenizer.from_pretrained(path)
        return self._tokenizer

    def _known(self) -> ServerModel:
        if self._server is None:
            raise RuntimeError(
                f"RemoteEngine({self.url}): await engine.check() before reading its limits"
            )
        return self._server

    # -- lifecycle --------------------------------------------------------------------

    async def check(self) -> ServerModel:
        """Reach the server, learn its model and context, and refuse a mismatch with
        the run's model. Raises ``EngineUnavailable`` (unreachable), ``PermissionError``
        (API key refused) or ``ModelMismatchError``; idempotent."""
        async with self._check_lock:
            if self._server is None:
                self._server = await identify(self._http, self.model_spec)
        return self._server

    async def health(self) -> bool:
        """Whether ``/health`` answers 200 now (no retries)."""
        try:
            response = await self._http.client.get("/health", timeout=5.0)
        except Exception:
            return False
        return response.status_code == 200

    async def close(self) -> None:
        """Abort this engine's requests (the server stays up) and close the connections."""
        if self._closed:
            return
        await self.abort()
        self._closed = True
        if self._link is not None:
            self._link.close()
        await self._http.close()

    async def __aenter__(self) -> RemoteEngine:
        await self.check()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- generation -------------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        images: Sequence[Any] | None = None,
    ) -> Completion:
        """``images`` (PIL images, in the order of their blocks in ``prompt_ids``) for a
        vision-language model go to ``/inference/v1/generate`` (see ``remote_images``);
        they are checked against the ids before anything is sent."""
        if self._closed:
            raise RuntimeError("RemoteEngine is closed")
        server = await self.check()
        check_prompt(prompt_ids, server.vocab_size, server.max_model_len)
        request_id = request_id or f"loomrl-{next(self._counter)}"
        if images:
            server_images = self._images or ImageRequests(self.url, server)
            self._images = server_images  # the model's image block, loaded once
            body = server_images.body(prompt_ids, images, params, request_id)
            path = GENERATE
        else:
            body, path = self.request_body(prompt_ids, params), "/v1/completions"
        if self._updating is not None:  # wait for the new weights, then stamp with them
            await self._updating.wait()
        version = self._policy_version  # a weight update aborts every request in flight
        pending = _Pending()
        self._in_flight[request_id] = pending
        try:
            pending.task = asyncio.create_task(self._stream(path, body, request_id, pending))
            await asyncio.wait({pending.task})
            if not pending.task.cancelled():
                pending.task.result()  # raise what the stream raised
        finally:
            if pending.task is not None and not pending.task.done():
                pending.task.cancel()  # generate itself was cancelled: drop the request
            self._in_flight.pop(request_id, None)
        reason = "abort" if pending.aborted else pending.finish_reason
        if reason not in ("stop", "length", "abort"):
            raise RemoteEngineError(
                f"vLLM request {request_id!r} ended with finish_reason={reason!r}"
            )
        return Completion(
            token_ids=pending.token_ids,
            logprobs=pending.logprobs,
            text="".join(pending.text),
            finish_reason=reason,  # type: ignore[arg-type]
            policy_version=version,
            stop_reason=None if reason == "abort" else pending.stop_reason,
            prompt_len=len(prompt_ids),
            request_id=request_id,
        )

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        """The ``/v1/completions`` body for one generation."""
        server = self._known()
        return {
            "model": server.name,
            "prompt": list(prompt_ids),
            **sampling_fields(params, tokens_left(len(prompt_ids), params, server.max_model_len)),
            "add_special_tokens": False,
            "return_token_ids": True,
            "stream": True,
            "stream_interval": self.stream_interval,
        }

    async def _stream(
        self, path: str, body: dict[str, Any], request_id: str, pending: _Pending
    ) -> None:
        headers = {"X-Request-Id": request_id}
        read = read_choice if path == GENERATE else read_completion_choice
        with scale_out_hint(self.url, path):
            async for event in self._http.stream_events(path, body, headers):
                for choice in event.get("choices", ()):
                    ids, logprobs, text = read(choice)
                    if len(ids) != len(logprobs):
                        raise RemoteEngineError(
                            f"vLLM server at {self.url} sent {len(ids)} token ids with "
                            f"{len(logprobs)} logprobs for {request_id!r}"
                        )
                    pending.token_ids += ids
                    pending.logprobs += logprobs
                    pending.text.append(text)
                    if choice.get("finish_reason") is not None:
                        pending.finish_reason = choice["finish_reason"]
                        pending.stop_reason = choice.get("stop_reason")

    async def abort(self, request_ids: str | Iterable[str] | None = None) -> list[str]:
        """End the given requests now: their streams are closed (vLLM aborts a request
        whose client goes away) and ``generate`` returns the tokens received so far."""
        if request_ids is None:
            ids = list(self._in_flight)
        else:
            wanted = [request_ids] if isinstance(request_ids, str) else list(request_ids)
            ids = [r for r in wanted if r in self._in_flight]
        for request_id in ids:
            pending = self._in_flight[request_id]
            if pending.task is not None and not pending.task.done():
                pending.aborted = True
                pending.task.cancel()
        return ids

    async def score(self, token_ids: Sequence[int]) -> list[float]:
        """``log p(token_i | tokens_<i)`` under the server's current weights for
        ``i = 1 .. n-1`` (temperature 1): checks a weight sync against the learner."""
        server = await self.check()
        check_prompt(token_ids, server.vocab_size, server.max_model_len)
        body = {"model": server.name, "prompt": list(token_ids), "max_tokens": 1,
                "temperature": 1.0, "prompt_logprobs": 0, "add_special_tokens": False,
                **NEUTRAL}  # fmt: skip
        reply = await self._http.request("POST", "/v1/completions", json_body=body)
        entries = reply["choices"][0].get("prompt_logprobs")
        if not entries:
            raise RemoteEngineError(f"vLLM server at {self.url} returned no prompt logprobs")
        return [
            float(entry[str(token)]["logprob"])
            for entry, token in zip(entries[1:], token_ids[1:], strict=True)
        ]

    # -- weights ----------------------------------------------------------------------

    async def update_weights(
        self, weights: Mapping[str, torch.Tensor], version: int | None = None
    ) -> float:
        """Load new weights (HF names, any float dtype) into the server's live model.

        The server is paused with its in-flight requests aborted (theirs end with
        ``finish_reason="abort"`` and keep their tokens, all from the old weights), takes
        the weights, clears its prefix cache and resumes. ``weight_sync="transfer"``
        streams them over a connection the server's workers open to this process (any
        host that can reach this one); ``"nccl"`` through vLLM's NCCL backend (a server
        started with ``--weight-transfer nccl``, GPUs on both sides); ``"file"`` writes a
        safetensors file the server reads (it must share this machine's ``/dev/shm``).
        ``policy_version`` becomes ``version`` (default: one more). Returns seconds taken.
        """
        server = require_rl_routes(await self.check(), self.url, weights)
        start = time.perf_counter()
        new = self._policy_version + 1 if version is None else version
        if self._link is not None:
            await self._link.push(self, weights, server.torch_dtype(), new)
        else:
            async with self._paused(new):
                await load_weights(self._http, self.url, weights, server.torch_dtype())
        return time.perf_counter() - start

    @contextlib.asynccontextmanager
    async def _paused(self, version: int) -> AsyncIterator[None]:
        """The server paused (in-flight requests aborted, new ones held here) around a
        load; after one that succeeded, its prefix cache cleared and ``version`` stamped."""
        self._updating = asyncio.Event()
        try:
            pause = {"mode": "abort", "clear_cache": "true"}
            await self._http.request("POST", "/pause", params=pause)
            await self.abort()  # whatever the pause did not end (e.g. still connecting)
            try:
                yield
                await self.reset_prefix_cache()
                await self._http.request(
                    "POST", "/update_weight_version", json_body={"new_version": str(version)}
                )
                self._policy_version = version
            finally:
                await self._http.request("POST", "/resume")
        finally:
            self._updating.set()
            self._updating = None

    async def reset_prefix_cache(self) -> None:
        """Clear the server's prefix cache (a weight update does; benchmarks compare from empty)."""
        await reset_prefix_cache(self._http, self.url)
