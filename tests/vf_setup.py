"""What the verifiers tests share: the test tasksets (tests/vf_tasksets) made importable,
and the process variables the adapter sets put back afterwards."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TASKSETS = str(Path(__file__).resolve().parent / "vf_tasksets")
VARIABLES = ("PATH", "PYTHONPATH", "LOOMRL_VERIFIERS_API_KEY")


@contextmanager
def tasksets_importable() -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in VARIABLES}
    sys.path.insert(0, TASKSETS)
    try:
        yield
    finally:
        sys.path.remove(TASKSETS)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
