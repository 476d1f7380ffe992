"""What loomrl's live displays (spinners, progress bars, live tables) do with other output.

Rich's live displays catch whatever else the process prints and show it above
themselves. While a run sends the libraries' output to its log (``loomrl.cli.quiet``)
they must not: a library that sets up its logging during a spinner (vLLM does, on first
import) would otherwise print through the console for the rest of the run.
"""

from __future__ import annotations

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner

_catch = True


def catch_other_output(on: bool) -> None:
    """Whether live displays show other output above themselves (off while quiet)."""
    global _catch
    _catch = on


def live_options() -> dict[str, bool]:
    """Keyword arguments for ``rich.live.Live`` and ``rich.progress.Progress``."""
    return {"redirect_stdout": _catch, "redirect_stderr": _catch}


def status(console: Console, text: str) -> Live:
    """``console.status(text)`` (a spinner and a line of markup), as ``live_options`` say."""
    spinner = Spinner("dots", text=text, style="status.spinner")
    return Live(spinner, console=console, transient=True, refresh_per_second=12.5, **live_options())
