"""The HTTP side of ``RemoteEngine``: one pooled ``httpx.AsyncClient``, retries on
connection errors only, and every failure turned into one clear line.

Retried (with exponential backoff): a connection that could not be opened (refused,
reset while connecting, connect timeout); the request never reached the server. Never
retried: an HTTP error status (raised as below), a read timeout or a connection lost
mid-request (``EngineUnavailable``: the server may have done part of the work).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx

from loomrl.engines.base import EngineUnavailable


class RemoteEngineError(RuntimeError):
    """The server answered with an error that is not the caller's input (a 5xx, a
    missing route, a malformed reply)."""


class ModelMismatchError(ValueError):
    """The server serves another model or tokenizer than the run's."""


class HttpSession:
    """Requests to one vLLM server: JSON in, JSON (or server-sent events) out."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None,
        timeout_s: float,
        connect_timeout_s: float,
        connect_retries: int,
        retry_backoff_s: float,
        max_connections: int,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.connect_retries = connect_retries
        self.retry_backoff_s = retry_backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            # The read timeout bounds the wait for each piece of a reply (one streamed
            # chunk), not a whole generation; waiting for a free connection never fails.
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s, pool=None),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            transport=transport,
        )

    async def close(self) -> None:
        await self.client.aclose()

    async def request(
        self, method: str, path: str, *, json_body: Any = None, params: Any = None,
        headers: dict[str, str] | None = None, timeout: float | None = None,
    ) -> Any:  # fmt: skip
        """Send one request and return its decoded JSON (``None`` for an empty body)."""
        extra: dict[str, Any] = {}
        if timeout is not None:
            extra["timeout"] = httpx.Timeout(timeout, connect=self.client.timeout.connect)
        request = self.client.build_request(
            method, path, json=json_body, params=params, headers=headers, **extra
        )
        response = await self._send(request, stream=False)
        raise_for_status(response, self.url, path)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise RemoteEngineError(
                f"vLLM server at {self.url}{path} answered with non-JSON: {response.text[:200]!r}"
            ) from None

    async def stream_events(
        self, path: str, json_body: Any, headers: dict[str, str] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """POST ``json_body`` and yield each server-sent event's JSON until ``[DONE]``.
        Leaving the loop early closes the connection (vLLM then aborts the request)."""
        request = self.client.build_request("POST", path, json=json_body, headers=headers)
        response = await self._send(request, stream=True)
        try:
            if response.status_code >= 400:
                await response.aread()
                raise_for_status(response, self.url, path)
            async for line in _lines(response, self.url):
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:  # an error after the stream began
                    raise RemoteEngineError(
                        f"vLLM server at {self.url} failed mid-generation: {_error_text(event)}"
                    )
                yield event
            raise EngineUnavailable(
                f"vLLM server at {self.url} closed the stream before the generation ended"
            )
        finally:
            await response.aclose()

    async def _send(self, request: httpx.Request, *, stream: bool) -> httpx.Response:
        for attempt in range(self.connect_retries + 1):
            try:
                return await self.client.send(request, stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt == self.connect_retries:
                    raise EngineUnavailable(
                        f"cannot reach vLLM server at {self.url}: {_reason(exc)}"
                    ) from None
                await asyncio.sleep(self.retry_backoff_s * 2**attempt)
            except httpx.TimeoutException:
                raise EngineUnavailable(
                    f"vLLM server at {self.url} did not answer {request.url.path} within "
                    f"{self.timeout_s:g} s"
                ) from None
            except httpx.TransportError as exc:
                raise lost(self.url, exc) from None
        raise AssertionError("unreachable")  # pragma: no cover


async def _lines(response: httpx.Response, url: str) -> AsyncIterator[str]:
    try:
        async for line in response.aiter_lines():
            yield line
    except httpx.TimeoutException:
        raise EngineUnavailable(f"vLLM server at {url} stopped sending mid-generation") from None
    except httpx.TransportError as exc:
        raise lost(url, exc) from None


def lost(url: str, exc: BaseException) -> EngineUnavailable:
    return EngineUnavailable(f"lost the connection to vLLM server at {url}: {_reason(exc)}")


def raise_for_status(response: httpx.Response, url: str, path: str) -> None:
    """Raise the error an HTTP status means, phrased as one line."""
    code = response.status_code
    if code < 400:
        return
    if code == 401:
        raise PermissionError(f"server at {url} refused the API key")
    detail = _error_text(_json_or_text(response))
    if code == 404:
        raise RemoteEngineError(
            f"vLLM server at {url} has no route {path}: start it with VLLM_SERVER_DEV_MODE=1 "
            f"(`loomrl serve` does){': ' + detail if detail else ''}"
        )
    if 400 <= code < 500:
        raise ValueError(f"vLLM server at {url} rejected {path} ({code}): {detail}")
    raise RemoteEngineError(f"vLLM server at {url} failed on {path} ({code}): {detail}")


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _error_text(body: Any) -> str:
    """The message of a vLLM/FastAPI error body, one line."""
    if isinstance(body, dict):
        error = body.get("error", body.get("detail", body))
        if isinstance(error, dict):
            error = error.get("message", error)
        body = error
    return re.sub(r"\s+", " ", str(body)).strip()[:500]


_CAUSES: tuple[tuple[type[BaseException], str], ...] = (
    (ConnectionRefusedError, "connection refused"),
    (ConnectionResetError, "connection reset"),
    (socket.gaierror, "unknown host"),
)


def _reason(exc: BaseException) -> str:
    """``connection refused`` from ``[Errno 111] Connection refused`` and the like (httpx
    says "All connection attempts failed": the cause is further down the chain)."""
    seen: BaseException | None = exc
    while seen is not None:
        for kind, words in _CAUSES:
            if isinstance(seen, kind):
                return words
        seen = seen.__cause__ or seen.__context__
    text = re.sub(r"\[Errno -?\d+\]\s*", "", str(exc)).strip()
    if not text:
        return type(exc).__name__
    return text[0].lower() + text[1:]
