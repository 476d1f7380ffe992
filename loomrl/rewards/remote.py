"""``RemoteReward``: scores from an HTTP JSON reward server (standard library only).

Protocol: one request per batch of at most ``batch_size`` samples, ``max_concurrency``
requests in flight::

    POST <url>
    Content-Type: application/json
    Authorization: Bearer <token>        # only with token_env=; read from that variable

    {"items": [{"prompt": "...", "completion": "...", "messages": [{"role": ..., ...}],
                "example": {...}, "label": "default"}, ...]}

    200 OK
    {"scores": [0.7, -1.0, ...]}         # one finite number per item, in the items' order

Failures and retries. A refused or dropped connection, no response within ``timeout_s``
(per attempt) and HTTP 408/425/429/500/502/503/504 are retried up to ``retries`` times,
sleeping ``min(max_backoff_s, backoff_s * 2**attempt)`` in between. Anything else fails
at once: another HTTP status (a 401/403 says whether a token was sent), a redirect (never
followed: it would forward the body and the token), a body that is not JSON, has no
``scores`` list, has the wrong number of scores or a non-finite one. Every failure is a
``RemoteRewardError`` naming the URL (without query) and the problem.

Secrets. The token is kept out of ``repr``, logs and error messages (server replies
quoted in errors have it and any URL secrets redacted, ``loomrl.redact``). A URL with
credentials in it (``user:pass@``) is refused: ``urllib`` does not send them, and they
would end up in logs; put the token in an environment variable and name it with
``token_env``. A token sent over plain ``http://`` to a host that is not loopback
warns once per host and process (``RuntimeWarning``): anyone on the path can read it.

Loopback URLs bypass proxy environment variables; other URLs honour them. Requests run
through ``urllib`` on daemon worker threads (``loomrl.workers.shared_pool``); a
timed-out request's thread ends by itself within ``timeout_s`` (the socket timeout),
and never keeps the process from exiting.
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import json
import math
import os
import socket
import urllib.request
import warnings
from collections.abc import Sequence
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import urlsplit

from loomrl.aio import gather_or_cancel
from loomrl.redact import redact_text, redact_url
from loomrl.rewards.base import RewardError, RewardSample
from loomrl.workers import shared_pool

RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_warned_plain_http: set[str] = set()  # hosts already warned about (once per process)


class RemoteRewardError(RewardError):
    """The reward server could not be reached or gave an unusable answer."""


class _Problem(Exception):
    """One failed attempt: what went wrong and whether another attempt may help."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


class _Secret:
    """A string that never shows itself in repr/str (the bearer token)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises HTTPError with the 3xx status


class RemoteReward:
    """A ``RewardSource`` backed by an HTTP server speaking the protocol above."""

    def __init__(
        self,
        url: str,
        *,
        token_env: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        batch_size: int = 64,
        max_concurrency: int = 4,
    ) -> None:
        try:
            parts = urlsplit(url)
            host, _ = parts.hostname, parts.port  # a malformed host or port raises here
        except ValueError:
            parts, host = None, None
        if parts is None or parts.scheme not in ("http", "https") or not host:
            raise ValueError(
                f"RemoteReward needs an http(s) URL with a host, got {redact_url(url)!r:.200}"
            )
        if "@" in parts.netloc:
            raise ValueError(
                f"RemoteReward URL {redact_url(url)!r:.200} has credentials in it (user:pass@), "
                "which are never sent; put the token in an environment variable and pass "
                "token_env='VARIABLE' (it goes in an Authorization: Bearer header)"
            )
        problems = []
        if not timeout_s > 0:
            problems.append(f"timeout_s must be > 0, got {timeout_s}")
        if not 0 <= retries <= 20:
            problems.append(f"retries must be in [0, 20], got {retries}")
        if not 0 <= backoff_s <= max_backoff_s:
            problems.append(
                f"need 0 <= backoff_s <= max_backoff_s, got {backoff_s}, {max_backoff_s}"
            )
        if batch_size < 1 or max_concurrency < 1:
            problems.append(
                f"batch_size and max_concurrency must be >= 1, got {batch_size}, {max_concurrency}"
            )
        if problems:
            raise ValueError("invalid RemoteReward: " + "; ".join(problems))
        self.url = url
        port = f":{parts.port}" if parts.port else ""
        self.display_url = f"{parts.scheme}://{parts.hostname}{port}{parts.path}"
        self.token_env = token_env
        self._token: _Secret | None = None
        if token_env is not None:
            value = os.environ.get(token_env, "")
            if not value:
                raise ValueError(
                    f"environment variable {token_env} is not set or empty; "
                    f"RemoteReward(token_env={token_env!r}) reads its bearer token from it"
                )
            self._token = _Secret(value)
            if parts.scheme == "http" and not is_loopback(host):
                _warn_plain_http(host, token_env)
        self.timeout_s, self.retries = float(timeout_s), retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.batch_size, self.max_concurrency = batch_size, max_concurrency
        proxies = urllib.request.ProxyHandler({} if host in _LOOPBACK else None)
        self._opener = urllib.request.build_opener(proxies, _NoRedirect())

    async def __call__(self, samples: Sequence[RewardSample]) -> list[float]:
        items = [self._item(s, i) for i, s in enumerate(samples)]
        gate = asyncio.Semaphore(self.max_concurrency)

        async def one(batch: list[dict[str, Any]]) -> list[float]:
            async with gate:
                return await self._post(batch)

        batches = [items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)]
        results = await gather_or_cancel([one(b) for b in batches])
        return [score for scores in results for score in scores]

    def _item(self, sample: RewardSample, index: int) -> dict[str, Any]:
        item = {
            "prompt": sample.prompt,
            "completion": sample.completion,
            "messages": list(sample.messages),
            "example": dict(sample.example),
            "label": sample.label,
        }
        try:
            json.dumps(item, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"sample {index} cannot be sent to {self.display_url}: it is not plain JSON ({exc})"
            ) from None
        return item

    async def _post(self, items: list[dict[str, Any]]) -> list[float]:
        body = json.dumps({"items": items}, allow_nan=False).encode()
        for attempt in range(self.retries + 1):
            try:
                try:
                    async with asyncio.timeout(self.timeout_s):
                        status, reason, payload = await asyncio.get_running_loop().run_in_executor(
                            shared_pool(), self._send, body
                        )
                except TimeoutError:
                    raise _Problem(self._slow(), retry=True) from None
                return self._scores(status, reason, payload, len(items))
            except _Problem as problem:
                if not problem.retry or attempt == self.retries:
                    tries = f" (gave up after {attempt + 1} attempts)" if attempt else ""
                    raise RemoteRewardError(
                        redact_text(f"reward server {self.display_url}: {problem}{tries}")
                    ) from None
            await asyncio.sleep(min(self.max_backoff_s, self.backoff_s * 2**attempt))
        raise AssertionError("unreachable")  # the loop returns or raises

    def _send(self, body: bytes) -> tuple[int, str, bytes]:
        """One blocking POST: ``(status, reason, body)``, or ``_Problem`` for transport errors."""
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        if self._token is not None:
            request.add_unredirected_header("Authorization", f"Bearer {self._token.reveal()}")
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                return response.status, response.reason, _read(response)
        except HTTPError as exc:
            try:
                payload = exc.read(2048)
            except Exception:  # the error body is only for the message
                payload = b""
            return exc.code, str(exc.reason), payload
        except URLError as exc:
            raise _Problem(self._transport(exc.reason), retry=True) from None
        except (OSError, http.client.HTTPException) as exc:
            raise _Problem(self._transport(exc), retry=True) from None

    def _transport(self, reason: object) -> str:
        if isinstance(reason, TimeoutError):  # socket.timeout is TimeoutError
            return self._slow()
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused (is the server running?)"
        if isinstance(reason, socket.gaierror):
            return f"cannot resolve the host ({reason})"
        if isinstance(reason, ConnectionError | http.client.HTTPException):
            return f"connection failed: {type(reason).__name__}: {reason}"
        return f"request failed: {reason}"

    def _slow(self) -> str:
        return f"no response within timeout_s={self.timeout_s:g}s"

    def _scores(self, status: int, reason: str, payload: bytes, n: int) -> list[float]:
        if not 200 <= status < 300:
            message = f"HTTP {status} {reason}".rstrip()
            if 300 <= status < 400:
                raise _Problem(f"{message}: redirects are not followed", retry=False)
            if status in (401, 403):
                message += (
                    f" (the bearer token from ${self.token_env} was refused)"
                    if self._token is not None
                    else " (no bearer token was sent; set token_env= to the variable holding it)"
                )
            snippet = self._snippet(payload)
            raise _Problem(
                f"{message}: {snippet}" if snippet else message, retry=status in RETRY_STATUS
            )
        try:
            data = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise _Problem(
                f"response is not JSON: {self._snippet(payload)!r}", retry=False
            ) from None
        scores = data.get("scores") if isinstance(data, dict) else None
        if not isinstance(scores, list):
            shape = f"keys {sorted(data)}" if isinstance(data, dict) else type(data).__name__
            raise _Problem(f"response JSON has no 'scores' list (got {shape})", retry=False)
        if len(scores) != n:
            raise _Problem(f"returned {len(scores)} scores for {n} items", retry=False)
        for i, score in enumerate(scores):
            if isinstance(score, bool) or not isinstance(score, int | float):
                raise _Problem(f"score {i} is {score!r:.50}, expected a number", retry=False)
            if not math.isfinite(score):
                raise _Problem(f"score {i} is {score}, expected a finite number", retry=False)
        return [float(s) for s in scores]

    def _snippet(self, payload: bytes) -> str:
        text = " ".join(payload[:400].decode("utf-8", errors="replace").split())[:200]
        if self._token is not None:
            text = text.replace(self._token.reveal(), "<redacted>")
        return text

    def __repr__(self) -> str:
        token = f", token_env={self.token_env!r}" if self.token_env else ""
        return f"RemoteReward({self.display_url!r}{token})"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name, not an address
        return False


def _warn_plain_http(host: str, token_env: str) -> None:
    if host in _warned_plain_http:
        return
    _warned_plain_http.add(host)
    warnings.warn(
        f"RemoteReward sends the bearer token from ${token_env} to {host} over plain http: "
        "anyone on the network path can read it; use an https:// URL",
        RuntimeWarning,
        stacklevel=3,
    )


def _read(response: http.client.HTTPResponse) -> bytes:
    payload = response.read(MAX_RESPONSE_BYTES + 1)
    if len(payload) > MAX_RESPONSE_BYTES:
        raise _Problem(f"response is larger than {MAX_RESPONSE_BYTES} bytes", retry=False)
    return payload
