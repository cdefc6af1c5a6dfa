"""Graceful stop on Ctrl-C or SIGTERM for the long commands (train, eval).

The first SIGINT / SIGTERM only sets a flag: the job checks it between steps (or batches), saves what it has and
raises `Interrupted`, which the CLI turns into one line saying how to resume and exit code 130 (SIGINT) or 143
(SIGTERM). A second SIGINT exits at once with 130: the atomic checkpoints and appended samples stay intact.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """The job stopped early on a signal, after saving its work; `what` says what was saved."""

    def __init__(self, signum: int, what: str):
        super().__init__(what)
        self.signum = signum
        self.what = what

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopFlag:
    """Set by the first SIGINT / SIGTERM while `watching()`; `requested` is what loops check between steps."""

    def __init__(self, notice: str = "stopping after the current step") -> None:
        self.signum: int | None = None
        self.notice = notice

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def raise_if_requested(self, what: str) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum, what)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            if signum == signal.SIGINT:  # the second Ctrl-C: the user wants out now
                sys.stderr.write("\ninterrupted again: exiting now (the last complete checkpoint is kept)\n")
                sys.stderr.flush()
                os._exit(128 + signum)
            return
        self.signum = signum
        name = signal.Signals(signum).name
        sys.stderr.write(f"\n{name}: {self.notice} (Ctrl-C again to quit at once)\n")
        sys.stderr.flush()

    def install(self) -> None:
        """(Re)install the handlers; Ray's driver replaces the SIGTERM handler in ray.init, so call it after."""
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                signal.signal(signum, self._handle)

    @contextmanager
    def watching(self) -> Iterator[StopFlag]:
        """Handle the signals in the body; the previous handlers come back afterwards."""
        if threading.current_thread() is not threading.main_thread():
            yield self  # signals can only be handled in the main thread: nothing to watch
            return
        previous: dict[int, Any] = {s: signal.getsignal(s) for s in SIGNALS}
        self.install()
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
