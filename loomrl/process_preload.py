"""Imported by the fork server of ``loomrl.process_calls`` when it starts: puts the
starting process's ``sys.path`` in place and imports the environment's module, so every
worker forked later has it loaded (Python 3.11's fork server neither applies the parent's
``sys.path`` nor says when a module to preload fails to import; without this, each
worker of an env defined outside site-packages imported it anew, ~4 s with transformers).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

from loomrl.process_calls import PRELOAD_MAIN, PRELOAD_MODULE, PRELOAD_PATH


def _preload() -> None:
    path = [p for p in os.environ.pop(PRELOAD_PATH, "").split(os.pathsep) if p]
    module, script = os.environ.pop(PRELOAD_MODULE, ""), os.environ.pop(PRELOAD_MAIN, "")
    sys.path[:0] = [p for p in path if p not in sys.path]
    with contextlib.suppress(Exception):  # the worker says what fails, by name
        if module == "__main__":  # a class of the script that was run: import the script
            if script and getattr(sys.modules["__main__"], "__file__", None) != script:
                from multiprocessing import process, spawn

                process.current_process()._inheriting = True  # type: ignore[attr-defined]
                spawn.import_main_path(script)
        elif module:
            importlib.import_module(module)


_preload()
