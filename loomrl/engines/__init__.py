"""Inference engines behind one protocol, created by spec: ``engines.load("vllm:MODEL")``.

Backends register a factory by name; a spec is ``NAME`` or ``NAME:ARG`` where ``ARG``
goes to the factory as its first argument (the model spec, for vLLM). A URL,
``http://HOST:PORT`` or ``https://...``, is a vLLM server (``RemoteEngine``); several
engines behind one protocol are a pool (``pool([...])``, ``loomrl.engines.pool``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loomrl.engines.base import Engine, EngineUnavailable, PromptTooLongError, check_prompt
from loomrl.engines.pool import EnginePool, pool
from loomrl.engines.scripted import ScriptedEngine

__all__ = [
    "Engine",
    "EnginePool",
    "EngineUnavailable",
    "PromptTooLongError",
    "ScriptedEngine",
    "check_prompt",
    "load",
    "pool",
    "register",
]

EngineFactory = Callable[..., Engine]
_FACTORIES: dict[str, EngineFactory] = {}


def register(name: str, factory: EngineFactory) -> None:
    """Make ``load(f"{name}:ARG")`` build an engine with ``factory(ARG, **kw)``."""
    _FACTORIES[name] = factory


def load(spec: str, **kwargs: Any) -> Engine:
    """Build an engine from ``"vllm:MODEL"``, ``"vllm"`` (default model), ``"scripted"``
    or a server URL ``"http://HOST:PORT"`` (``model=SPEC`` names the run's model)."""
    if spec.startswith(("http://", "https://")):
        from loomrl.engines.remote import RemoteEngine

        return RemoteEngine(spec, **kwargs)
    name, _, arg = spec.partition(":")
    if name not in _FACTORIES:
        known = ", ".join(sorted(_FACTORIES))
        raise ValueError(f"unknown engine {name!r} in spec {spec!r}; known engines: {known}")
    return _FACTORIES[name](arg, **kwargs) if arg else _FACTORIES[name](**kwargs)


def _vllm(model: str = "smollm2-135m-instruct", **kwargs: Any) -> Engine:
    from loomrl.engines.vllm import VLLMEngine  # vLLM is an extra; import it only when asked

    return VLLMEngine(model, **kwargs)


register("vllm", _vllm)
register("scripted", lambda *args, **kwargs: ScriptedEngine(*args, **kwargs))
