"""One session per episode: the requests of one harness run, answered one at a time.

The endpoint hands each request to its session (``submit``) and waits for the answer;
the episode (``loomrl.harness.env``) takes requests in order (``next_request``) and
answers them with the model's turns (``answer``). A session that closes answers what is
still waiting with an error, so no harness request hangs past its episode.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from loomrl.harness.conversation import same_request
from loomrl.harness.protocol import Answer, ChatRequest, RequestError

Message = dict[str, Any]


@dataclass(slots=True)
class Pending:
    """A request waiting for the model's turn."""

    request: ChatRequest
    reply: asyncio.Future[Answer | RequestError]


class Session:
    """The conversation of one episode as its harness sees it, and its request queue."""

    def __init__(self, key: str, base_url: str) -> None:
        self.key = key
        #: What an OpenAI client is given: the URL names the session, and so does the key.
        self.base_url = base_url
        self.api: list[Message] = []  # the conversation as the harness was told it
        self.tools: list[dict[str, Any]] | None = None
        self.counts: Counter[str] = Counter()
        self.closed: str | None = None  # why, once closed
        self._inbox: asyncio.Queue[Pending] = asyncio.Queue()
        self._open: Pending | None = None  # submitted, not yet answered (one at a time)
        self._last: Pending | None = None  # the last one answered

    def submit(self, request: ChatRequest) -> asyncio.Future[Answer | RequestError]:
        """Queue ``request``; the future gets its answer (or the error to send).

        A request that repeats the open one, or the last one answered, is a client's
        retry (a timeout, a lost connection): it gets that request's answer rather than
        a new turn, so an SDK's automatic retries never sample turns the agent never
        sees (counted as ``resends``)."""
        if self.closed is not None:
            raise ended_error(self.closed)
        for earlier in (self._open, self._last):
            if earlier is not None and same_request(earlier.request, request):
                self.counts["resends"] += 1
                return earlier.reply
        if self._open is not None:
            raise RequestError(
                "this session is already waiting for an answer: one request at a time per "
                "session (each session is one trajectory)",
                status=409,
                code="concurrent_request",
            )
        future: asyncio.Future[Answer | RequestError] = asyncio.get_running_loop().create_future()
        self._open = Pending(request, future)
        self._inbox.put_nowait(self._open)
        self.counts["requests"] += 1
        return future

    async def next_request(self, ended: Awaitable[Any]) -> ChatRequest | None:
        """The next request, or None once ``ended`` (the harness program) finishes first."""
        if self._inbox.empty():
            getting = asyncio.ensure_future(self._inbox.get())
            done_task = asyncio.ensure_future(ended)
            try:
                await asyncio.wait({getting, done_task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not getting.done():
                    getting.cancel()
            if not getting.done() or getting.cancelled():
                return None
            pending = getting.result()
        else:
            pending = self._inbox.get_nowait()
        return pending.request

    def answer(self, answer: Answer | RequestError) -> None:
        """Send the open request its answer (a client that went away is let go)."""
        pending, self._open = self._open, None
        if pending is None:
            return
        if not pending.reply.done():
            pending.reply.set_result(answer)
        self._last = pending

    def close(self, why: str) -> None:
        """End the session: every waiting request gets an ``episode_ended`` error."""
        if self.closed is not None:
            return
        self.closed = why
        self.answer(ended_error(why))  # the open request, taken by the episode or not


def ended_error(why: str) -> RequestError:
    """What a request to an ended episode's session gets."""
    return RequestError(
        f"this session's episode has ended ({why})", status=409, code="episode_ended"
    )
