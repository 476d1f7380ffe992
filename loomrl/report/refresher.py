"""Keep a running training's report.html current without stopping the training for it.

The page is rebuilt in one worker thread, never on the event loop that drives rollouts
and learner steps; a request that comes while a rebuild runs is coalesced into one more
rebuild after it (the newest steps are always shown, never a queue of stale pages). Step
files already read are not read again (``load``'s summary cache).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from loomrl.report import refresh_report


class BackgroundRefresh:
    """``request()`` from the loop; ``close()`` waits for the rebuild in progress."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.refreshes = 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="loomrl-report")
        self._lock = threading.Lock()
        self._running: Future[None] | None = None
        self._again = False

    def request(self) -> None:
        with self._lock:
            if self._running is not None and not self._running.done():
                self._again = True
                return
            self._running = self._pool.submit(self._rebuild)

    def _rebuild(self) -> None:
        while True:
            refresh_report(self.run_dir)  # never raises: a report never stops the run
            self.refreshes += 1
            with self._lock:
                if not self._again:
                    return
                self._again = False

    def close(self) -> None:
        self._pool.shutdown(wait=True)
