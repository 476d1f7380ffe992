"""The key in front of every route of a ``loomrl serve`` server, not only ``/v1``.

vLLM's ``--api-key`` guards ``/v1`` (and a few other prefixes) only; the RL routes that
``VLLM_SERVER_DEV_MODE`` turns on (``/collective_rpc``, ``/update_weights``, ``/pause``,
``/sleep``, ...) would answer anyone who reaches the port. ``ServerGuard`` is an ASGI
middleware loaded into vLLM's API server (its ``--middleware`` option) that asks for the
same bearer token on every route except the liveness probes: deny by default, so a
route a later vLLM adds is guarded too. The key reaches the server process in its
environment (``KEY_ENV``), never on its command line.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

#: The environment variable the server process reads its key from.
KEY_ENV = "LOOMRL_SERVE_KEY"
#: What answers without a key: liveness probes only.
PUBLIC = frozenset({"/health", "/ping", "/version"})
#: Import path of the middleware, for vLLM's ``--middleware``.
MIDDLEWARE = f"{__name__}.ServerGuard"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class ServerGuard:
    """401 for any request without ``Authorization: Bearer <key>`` (the key in
    ``$LOOMRL_SERVE_KEY``; without it, everything passes)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        key = os.environ.get(KEY_ENV)
        self.key = _digest(key) if key else None

    def allows(self, scope: dict[str, Any]) -> bool:
        if self.key is None or scope["type"] not in ("http", "websocket"):
            return True  # lifespan events, or no key asked for
        if scope.get("method") == "OPTIONS":
            return True
        path = scope["path"].removeprefix(scope.get("root_path", "")).rstrip("/") or "/"
        if path in PUBLIC:
            return True
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(_digest(token), self.key)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.allows(scope):
            await self.app(scope, receive, send)
            return
        from starlette.responses import JSONResponse

        reply = JSONResponse({"error": "Unauthorized: this server needs its key"}, 401)
        await reply(scope, receive, send)


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
