"""OpenEnv environments as loomrl environments: ``openenv:URL`` and ``openenv:MODULE:CLASS``.

An episode is one session of the environment server (openenv-core's WebSocket client,
``GenericEnvClient``): ``reset`` opens it and its first observation is the first user
message; each model reply becomes an action and the observation that comes back the next
user message; each step's reward is that turn's reward and the episode's reward is their
sum (``turn_reward = "sum"``); ``done`` ends the episode.

- **Reply -> action.** An action with one text field (``action_field``, or the only
  string field of the action's schema) takes the reply's text; any other action is read
  as a JSON object from the reply. A reply that is no such object, or that the server
  refuses (its ``VALIDATION_ERROR``), is answered with an ``Invalid action: ...`` message
  and counted (``openenv/invalid_actions``); the episode goes on.
- **Observation -> message.** ``observation_field``, else the observation's only string
  field, else its fields (without ``done``, ``reward``, ``metadata``) as JSON.
- **Servers.** ``openenv:URL`` talks to a running server, one session per episode.
  ``openenv:MODULE:CLASS`` serves the class on loopback itself (``openenv_server``): one
  server with a session per episode when the class declares
  ``SUPPORTS_CONCURRENT_SESSIONS``, else a server per episode; stopped with the episode
  or the run. A server that dies or errors fails that episode with its reason; others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from loomrl.envs.adapters.openenv_server import (
    LocalServer,
    OpenEnvError,
    concurrent,
    io_classes,
    load_class,
    schema,
)
from loomrl.envs.base import Environment, EnvState, EnvStep, Message

HIDDEN = ("done", "reward", "metadata")  # observation fields that are not its content
SESSIONS = 256  # sessions one local server holds at once (a concurrent class)


class OpenEnvEnv(Environment):
    """One OpenEnv environment (``target``: a server URL, or ``MODULE:CLASS``)."""

    name = "openenv"
    max_turns = 32
    nonblocking = True  # the episode's methods are async; cleanup only schedules
    turn_reward = "sum"

    def __init__(
        self,
        target: str,
        *,
        env_args: dict[str, Any] | None = None,
        reset_args: dict[str, Any] | None = None,
        action_field: str | None = None,
        observation_field: str | None = None,
        system_prompt: str | None = None,
        max_turns: int | None = None,
        timeout: float = 60.0,
    ) -> None:
        try:
            import openenv.core  # noqa: F401
        except ImportError:
            raise OpenEnvError(
                "OpenEnv environments need openenv-core: pip install 'loomrl[openenv]'"
            ) from None
        self.target, self.timeout = target, timeout
        self.env_args, self.reset_args = dict(env_args or {}), dict(reset_args or {})
        self.observation_field = observation_field
        if max_turns is not None:
            self.max_turns = max_turns
        self.url: str | None = None
        self._class: type | None = None
        if target.startswith(("http://", "https://")):
            if self.env_args:
                raise OpenEnvError(
                    f"OpenEnv server {target}: env_args build a class loomrl serves itself "
                    "(openenv:MODULE:CLASS); a running server was built by its owner"
                )
            self.url = target.rstrip("/")
            action_schema = schema(self.url).get("action") or {}
        else:
            self._class = load_class(target)
            action_schema = io_classes(self._class)[0].model_json_schema()
        self.action_field = action_field or text_field(action_schema)
        self.action_schema = action_schema
        if action_field is not None and action_field not in action_schema.get("properties", {}):
            raise OpenEnvError(
                f"OpenEnv environment {target!r}: its action has no field {action_field!r}"
            )
        self.system_prompt = system_prompt
        self._server: asyncio.Task[LocalServer] | None = None  # a concurrent class's one
        self._closing: set[asyncio.Task[None]] = set()

    # -- the episode -------------------------------------------------------------------------
    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` episodes, each with a reset seed of its own (a group's samples share it)."""
        return [{"id": i, "seed": seed * 1_000_003 + i} for i in range(n)]

    async def reset(self, example: dict[str, Any]) -> EnvState:
        from openenv.core.generic_client import GenericEnvClient

        server, url = await self._open_server()
        client = GenericEnvClient(base_url=url, message_timeout_s=self.timeout)
        data = {"client": client, "server": server, "url": url}
        args = dict(self.reset_args)
        if "seed" in example:
            args.setdefault("seed", example["seed"])
        try:
            result = await self._call(url, client.reset(**args))
        except BaseException:
            await _close(client, server)
            raise
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": self.render(result.observation)})
        return EnvState(messages=messages, example=example, data=data)

    async def step(self, state: EnvState, message: Message) -> EnvStep:
        data = state.data
        action, problem = self.action_of(message.get("content") or "")
        if action is not None:
            try:
                result = await self._call(data["url"], data["client"].step(action))
            except _Refused as exc:
                problem = str(exc)
            else:
                reply = {"role": "user", "content": self.render(result.observation)}
                reward = None if result.reward is None else float(result.reward)
                return EnvStep([reply], done=bool(result.done), reward=reward, info=_info(0))
        reply = {"role": "user", "content": f"Invalid action: {problem}"}
        return EnvStep([reply], done=False, reward=0.0, info=_info(1))

    def score(self, state: EnvState) -> float:
        return 0.0  # the reward is the sum of the steps' rewards (turn_reward = "sum")

    def cleanup(self, state: EnvState) -> None:
        client, server = state.data.get("client"), state.data.get("server")
        if client is not None:  # closed in the background: cleanup is sync
            task = asyncio.get_running_loop().create_task(_close(client, server))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def state_dict(self, state: EnvState) -> dict[str, Any]:
        raise TypeError("an OpenEnv episode is a live server session: it cannot be checkpointed")

    async def aclose(self) -> None:
        """Stop the server this environment started (the run is over)."""
        started, self._server = self._server, None
        await asyncio.gather(*self._closing)
        if started is not None and not started.cancelled():
            try:
                server = await started
            except OpenEnvError:
                return
            server.stop()

    # -- mapping -----------------------------------------------------------------------------
    def action_of(self, text: str) -> tuple[dict[str, Any] | None, str]:
        """The action a reply makes, or None and why it makes none."""
        if self.action_field is not None:
            return {self.action_field: text.strip()}, ""
        start, end = text.find("{"), text.rfind("}")
        try:
            action = json.loads(text[start : end + 1]) if 0 <= start < end else None
        except ValueError:
            action = None
        if not isinstance(action, dict):
            fields = ", ".join(sorted(set(self.action_schema.get("properties", {})) - {"metadata"}))
            return None, f"reply with a JSON object with the action's fields ({fields})"
        return action, ""

    def render(self, observation: Any) -> str | list[dict[str, Any]]:
        """An observation as a user message's content: its text, and before it one image
        part per image field (a ``data:image/...`` URL, or ``H x W x 3|4`` pixel lists)."""
        if not isinstance(observation, dict):
            return str(observation)
        shown = {k: v for k, v in observation.items() if k not in HIDDEN}
        pictures = {k: v for k, v in shown.items() if is_image(v)}
        if self.observation_field is not None:
            text = str(observation.get(self.observation_field, ""))
        else:
            rest = {k: v for k, v in shown.items() if k not in pictures}
            texts = [v for v in rest.values() if isinstance(v, str)]
            one = len(rest) == 1 and len(texts) == 1
            text = texts[0] if one else json.dumps(rest, sort_keys=True, default=str)
        if not pictures:
            return text
        parts = [{"type": "image", "image": as_image(v)} for v in pictures.values()]
        return [*parts, {"type": "text", "text": text}]

    # -- servers -----------------------------------------------------------------------------
    async def _open_server(self) -> tuple[LocalServer | None, str]:
        """The URL this episode's session opens on, and the server to stop with the
        episode (a non-concurrent class's own)."""
        if self.url is not None:
            return None, self.url
        assert self._class is not None
        if not concurrent(self._class):
            server = LocalServer(self.target, 1, self.env_args)
            start = asyncio.ensure_future(asyncio.to_thread(server.start))
            try:
                return server, await asyncio.shield(start)
            except asyncio.CancelledError:  # a timed-out reset: stop it once it is up
                start.add_done_callback(lambda _: server.stop())
                raise
        if self._server is None:
            self._server = asyncio.create_task(self._start_shared())
        return None, (await asyncio.shield(self._server)).url

    async def _start_shared(self) -> LocalServer:
        server = LocalServer(self.target, SESSIONS, self.env_args)
        await asyncio.to_thread(server.start)
        return server

    async def _call(self, url: str, call: Any) -> Any:
        """An awaited client call; a refused action raises ``_Refused``, any other server
        failure ``OpenEnvError`` naming the server (the episode fails with it)."""
        try:
            return await call
        except (TimeoutError, asyncio.CancelledError):
            raise
        except RuntimeError as exc:
            if "VALIDATION_ERROR" in str(exc):
                raise _Refused(str(exc).removeprefix("Server error: ")) from None
            raise OpenEnvError(f"OpenEnv server {url}: {exc}") from None
        except Exception as exc:
            raise OpenEnvError(f"OpenEnv server {url}: {type(exc).__name__}: {exc}") from None


class _Refused(Exception):
    """The server refused an action as invalid."""


def text_field(action_schema: dict[str, Any]) -> str | None:
    """The action's one string field (besides ``metadata``), or None."""
    properties = action_schema.get("properties", {})
    strings = [k for k, v in properties.items() if k != "metadata" and v.get("type") == "string"]
    others = [k for k in properties if k != "metadata" and k not in strings]
    return strings[0] if len(strings) == 1 and not others else None


def is_image(value: Any) -> bool:
    """An observation field that holds an image: a ``data:image/`` URL, or pixel rows of
    RGB(A) values (a uint8 array as JSON)."""
    if isinstance(value, str):
        return value.startswith("data:image/")
    return (
        isinstance(value, list) and bool(value) and isinstance(value[0], list)
        and bool(value[0]) and isinstance(value[0][0], list) and len(value[0][0]) in (3, 4)
    )  # fmt: skip


def as_image(value: Any) -> Any:
    """An image field as an image part's value (a data URL stays one; pixels -> PIL)."""
    if isinstance(value, str):
        return value
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.asarray(value, dtype=np.uint8))


def _info(invalid: int) -> dict[str, Any]:
    return {"metrics": {"openenv/invalid_actions": invalid}}


async def _close(client: Any, server: LocalServer | None) -> None:
    with contextlib.suppress(Exception):  # a dead server's session is closed already
        await client.close()
    if server is not None:
        server.stop()
