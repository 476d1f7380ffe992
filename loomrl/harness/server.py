"""The loopback HTTP endpoint harness programs talk to, one session per episode.

``POST /v1/chat/completions`` (JSON or server-sent events) and ``GET /v1/models``. The
session is named by the API key (``Authorization: Bearer KEY``), or by the URL
(``/sessions/KEY/v1/...``) for clients that cannot set a key. The server listens only
while sessions are open: the first episode starts it, the last one to end closes it,
so no server outlives the rollout that used it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import TYPE_CHECKING, Any

from loomrl.harness.protocol import RequestError, parse_request
from loomrl.harness.session import Session, ended_error

if TYPE_CHECKING:
    from aiohttp import web

_SESSION_PREFIX = "/sessions/"
ENDED_KEPT = 4096
"""Ended sessions remembered, so a late request hears its episode ended (409), not 401."""


def _web() -> Any:
    """aiohttp's server API (the ``harness`` extra), imported when a server starts."""
    try:
        from aiohttp import web
    except ImportError as exc:
        raise ImportError(
            "harness environments serve the model over HTTP with aiohttp: "
            "pip install 'loomrl[harness]'"
        ) from exc
    return web


class HarnessServer:
    """Sessions behind one loopback port; ``open_session`` / ``close_session``."""

    def __init__(self, model: str = "loomrl", host: str = "127.0.0.1") -> None:
        self.model, self.host = model, host
        self.sessions: dict[str, Session] = {}
        self._ended: dict[str, str] = {}  # key -> why, the newest ENDED_KEPT
        self._web: web.Server | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._port = 0
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def listening(self) -> bool:
        return self._listener is not None

    async def open_session(self) -> Session:
        """A new session (starting the server if it is not listening)."""
        if self._listener is None:
            await self._start()
        key = "loomrl-" + secrets.token_urlsafe(18)
        session = Session(key, f"http://{self.host}:{self._port}{_SESSION_PREFIX}{key}/v1")
        self.sessions[key] = session
        return session

    def close_session(self, session: Session, why: str) -> None:
        """End ``session``; the server stops listening when it was the last one."""
        session.close(why)
        if self.sessions.pop(session.key, None) is not None:
            self._ended[session.key] = why
            if len(self._ended) > ENDED_KEPT:
                del self._ended[next(iter(self._ended))]
        if not self.sessions:
            self.stop()

    def stop(self) -> None:
        """Stop listening now and drop open connections (sync: cleanup hooks call it)."""
        listener, web_server, self._listener, self._web = self._listener, self._web, None, None
        if listener is None:
            return
        listener.close()
        if web_server is not None:
            task = asyncio.get_running_loop().create_task(web_server.shutdown(0.5))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _start(self) -> None:
        self._web = _web().Server(self._handle)
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(self._web, self.host, 0)
        self._port = self._listener.sockets[0].getsockname()[1]

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        web = _web()
        key, path = _route(request)
        if path == "/v1/models" and request.method == "GET":
            return web.json_response(
                {
                    "object": "list",
                    "data": [{"id": self.model, "object": "model", "owned_by": "loomrl"}],
                }
            )
        if path != "/v1/chat/completions":
            return _error(RequestError(f"no route {request.method} {path}", status=404))
        if request.method != "POST":
            return _error(RequestError(f"{path} takes POST", status=405))
        session = self.sessions.get(key or "")
        if session is None and key in self._ended:
            return _error(ended_error(self._ended[key]))
        if session is None:
            return _error(
                RequestError(
                    "unknown session key: each episode's harness gets its own key "
                    "(OPENAI_API_KEY) and base URL",
                    status=401,
                    code="invalid_api_key",
                )
            )
        try:
            chat = parse_request(await _json(request))
            reply = await session.submit(chat)
        except RequestError as exc:
            session.counts["bad_requests"] += exc.status == 400
            return _error(exc)
        if isinstance(reply, RequestError):
            return _error(reply)
        if not chat.stream:
            return web.json_response(reply.body())
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for chunk in reply.chunks(chat.include_usage):
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _route(request: web.BaseRequest) -> tuple[str | None, str]:
    """(session key, path under it): from ``/sessions/KEY/...`` or the bearer key."""
    path = request.path
    if path.startswith(_SESSION_PREFIX):
        key, _, rest = path[len(_SESSION_PREFIX) :].partition("/")
        return key, "/" + rest
    auth = request.headers.get("Authorization", "")
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("api-key")
    return key, path


async def _json(request: web.BaseRequest) -> Any:
    try:
        return json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not JSON ({exc})") from None


def _error(exc: RequestError) -> web.Response:
    # Every refusal here is deterministic: tell OpenAI SDKs not to retry it (they retry
    # 409s by default, which would only be refused again).
    headers = {"x-should-retry": "false"}
    return _web().json_response(exc.body(), status=exc.status, headers=headers)
