"""The ``loomrl`` command line: thin wrappers over the library, one module a command.

Every user error (a flag value, a config file, an environment argument, a model spec, a
run directory or checkpoint) is one plain line on stderr, ``error: ...``, exit status 2,
and is found before any engine starts. ``LOOMRL_DEBUG=1`` adds the traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import traceback
from typing import Any

from loomrl import lifeline
from loomrl.cli import (
    doctor,
    envs,
    evaluate,
    experience,
    generate,
    models,
    report,
    rollout,
    serve,
    train,
)
from loomrl.cli.doctor import cmd_doctor
from loomrl.cli.envs import cmd_envs
from loomrl.cli.evaluate import cmd_eval
from loomrl.cli.experience import cmd_experience
from loomrl.cli.generate import cmd_generate
from loomrl.cli.models import cmd_models
from loomrl.cli.output import USER_ERRORS, debugging, one_line, print_error
from loomrl.cli.report import cmd_report
from loomrl.cli.rollout import cmd_rollout
from loomrl.cli.serve import cmd_serve
from loomrl.cli.train import cmd_train
from loomrl.run.rank_group import LearnerRankError

__all__ = [
    "build_parser", "cmd_doctor", "cmd_envs", "cmd_eval", "cmd_experience", "cmd_generate",
    "cmd_models", "cmd_report", "cmd_rollout", "cmd_serve", "cmd_train", "main",
]  # fmt: skip

COMMANDS = (
    doctor, models, generate, envs, rollout, experience, train, evaluate, report, serve,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loomrl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _terminate_like_interrupt() -> Any:
    """SIGTERM (``kill``, job schedulers) stops a run the way Ctrl-C does: asyncio
    cancels the main task, so engines close and reap vLLM's processes instead of leaving
    them running, each holding its KV cache. Returns the previous handler.

    A process a non-interactive shell starts in the background (``cmd &``, ``nohup``)
    inherits SIGINT ignored, and then neither Python nor asyncio would act on it: SIGINT
    gets Python's handler back, or SIGTERM would do nothing at all."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    lifeline.start_reaper()  # whatever this command starts dies with it, however it dies
    previous = _terminate_like_interrupt()
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        if debugging():
            traceback.print_exc()
        print_error(one_line(exc))
        return 2
    except LearnerRankError as exc:  # a fault of the run, named: one line, not a traceback
        if debugging():
            traceback.print_exc()
        print_error(one_line(exc))
        return 1
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM; a run says how to continue
        print_error(f"interrupted; {exc}" if str(exc) else "interrupted")
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
