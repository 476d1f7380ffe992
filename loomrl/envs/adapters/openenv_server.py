"""An installed OpenEnv environment class served on loopback for a rollout.

``openenv:MODULE:CLASS`` names an environment class (an ``openenv.core`` ``Environment``
subclass); loomrl serves it with openenv-core's own ``create_fastapi_app`` under uvicorn in
a child process (``python -m loomrl.envs.adapters.openenv_server``), so the episodes talk
to it exactly as they would to a deployed one, over its WebSocket sessions. The child
dies with the process that started it (``loomrl.lifeline.watch``).
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import typing
import urllib.error
import urllib.request
from typing import Any

STARTUP_TIMEOUT = 120.0  # openenv-core imports gradio: a cold start takes seconds


class OpenEnvError(ValueError):
    """An OpenEnv environment that cannot be reached, loaded or served."""


def load_class(target: str) -> type:
    """The environment class ``MODULE:CLASS``; ``OpenEnvError`` names what is missing."""
    module_name, colon, class_name = target.partition(":")
    if not colon or not module_name or not class_name:
        raise OpenEnvError(f"OpenEnv environment {target!r}: expected MODULE:CLASS or a URL")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise OpenEnvError(
            f"OpenEnv environment {target!r}: cannot import {module_name!r} ({exc})"
        ) from None
    cls = getattr(module, class_name, None)
    from openenv.core.env_server import Environment

    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise OpenEnvError(
            f"OpenEnv environment {target!r}: {module_name} has no OpenEnv Environment "
            f"class {class_name!r}"
        )
    return cls


def io_classes(cls: type) -> tuple[type, type]:
    """The action and observation classes of an ``Environment[Act, Obs, State]``
    subclass, read from its generic base."""
    from openenv.core.env_server import Action, Environment, Observation

    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is Environment:
                action, observation = typing.get_args(base)[:2]
                if (
                    isinstance(action, type) and issubclass(action, Action)
                    and isinstance(observation, type) and issubclass(observation, Observation)
                ):  # fmt: skip
                    return action, observation
    raise OpenEnvError(
        f"OpenEnv environment {cls.__module__}:{cls.__name__} does not say its action and "
        "observation classes (subclass Environment[MyAction, MyObservation, State])"
    )


def installed() -> list[str]:
    """``MODULE:CLASS`` of the environment classes of installed OpenEnv packages (those
    openenv-core's discovery finds: ``openenv-*`` distributions), from each package's
    ``server`` modules, where OpenEnv's layout keeps them."""
    import inspect
    import pkgutil

    from openenv.auto._discovery import get_discovery
    from openenv.core.env_server import Environment

    found: list[str] = []
    for info in get_discovery().discover(use_cache=False).values():
        package = info.client_module_path.rpartition(".")[0] or info.client_module_path
        try:
            server = importlib.import_module(f"{package}.server")
            names = [f"{server.__name__}.{m.name}" for m in pkgutil.iter_modules(server.__path__)]
        except (ImportError, AttributeError):
            continue
        for name in names:
            try:
                module = importlib.import_module(name)
            except Exception:  # a module that fails to import is not listed
                continue
            for attr, value in inspect.getmembers(module, inspect.isclass):
                if issubclass(value, Environment) and value.__module__ == name:
                    found.append(f"{name}:{attr}")
    return sorted(set(found))


def concurrent(cls: type) -> bool:
    """Whether one server may hold many sessions of ``cls`` at once."""
    return bool(getattr(cls, "SUPPORTS_CONCURRENT_SESSIONS", False))


class LocalServer:
    """One child process serving an environment class on a free loopback port."""

    def __init__(self, target: str, sessions: int, env_args: dict[str, Any]) -> None:
        self.target, self.sessions, self.env_args = target, sessions, env_args
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = STARTUP_TIMEOUT) -> str:
        """Start the server and wait until it answers ``/health``; its URL."""
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", __name__, self.target, str(port), str(self.sessions),
                json.dumps(self.env_args), str(os.getpid())]  # fmt: skip
        with tempfile.TemporaryFile() as log:  # the child's output, for a failed start
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    log.seek(0)
                    tail = log.read().decode(errors="replace").strip().splitlines()[-3:]
                    raise OpenEnvError(
                        f"OpenEnv environment {self.target!r} exited while starting "
                        f"(status {self.process.returncode}): {' | '.join(tail)}"
                    )
                if healthy(self.url, 1.0):
                    return self.url
                time.sleep(0.1)
        self.stop()
        raise OpenEnvError(f"OpenEnv environment {self.target!r} did not start in {timeout:.0f} s")

    def stop(self) -> None:
        """Kill the server (its sessions end with it)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


def healthy(url: str, timeout: float) -> bool:
    """Whether an OpenEnv server answers ``GET /health``."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def schema(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """The server's ``/schema``: JSON schemas of its action, observation and state."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/schema", timeout=timeout) as reply:
            return json.loads(reply.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise OpenEnvError(f"OpenEnv server {url}: not reachable ({exc})") from None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str]) -> None:
    """Serve ``MODULE:CLASS`` on ``PORT`` with up to ``SESSIONS`` sessions."""
    target, port, sessions, env_args, parent = argv
    from loomrl.lifeline import watch

    watch(int(parent))
    import uvicorn
    from openenv.core.env_server import create_fastapi_app

    cls = load_class(target)
    action, observation = io_classes(cls)
    kwargs = json.loads(env_args)

    def factory() -> Any:
        return cls(**kwargs)

    factory.SUPPORTS_CONCURRENT_SESSIONS = concurrent(cls)  # type: ignore[attr-defined]
    most = int(sessions) if concurrent(cls) else 1
    app = create_fastapi_app(factory, action, observation, max_concurrent_envs=most)
    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
