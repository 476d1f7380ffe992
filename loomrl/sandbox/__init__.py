"""Isolated execution of model-written Python: one stateful interpreter per episode.

``Sandbox(config)`` decides the isolation once (bubblewrap namespaces, else a loudly
announced rlimit-only fallback) and hands out ``Session``s from a warm pool;
``await session.run(code)`` returns an ``ExecResult`` whatever the code does, and
``session.close()`` kills the interpreter and everything it started. See docs/tools.md.
"""

from loomrl.sandbox.config import ExecResult, SandboxConfig, SandboxUnavailable
from loomrl.sandbox.sandbox import Sandbox
from loomrl.sandbox.session import Session

__all__ = ["ExecResult", "Sandbox", "SandboxConfig", "SandboxUnavailable", "Session"]
