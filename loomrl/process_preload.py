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

PATH_VARIABLE = "LOOMRL_FORK_SERVER_PATH"
MODULE_VARIABLE = "LOOMRL_FORK_SERVER_MODULE"
MAIN_VARIABLE = "LOOMRL_FORK_SERVER_MAIN"


def _preload() -> None:
    path = [p for p in os.environ.pop(PATH_VARIABLE, "").split(os.pathsep) if p]
    sys.path[:0] = [p for p in path if p not in sys.path]
    module = os.environ.pop(MODULE_VARIABLE, "")
    with contextlib.suppress(Exception):  # the worker says what fails, by name
        if module == "__main__":  # a class of the script that was run: import it (its
            main = getattr(sys.modules["__main__"], "__file__", None)  # own imports
            script = os.environ.pop(MAIN_VARIABLE, "")  # need the path above first)
            if script and main != script:
                from multiprocessing import process, spawn

                process.current_process()._inheriting = True  # type: ignore[attr-defined]
                spawn.import_main_path(script)
        elif module:
            importlib.import_module(module)


_preload()
