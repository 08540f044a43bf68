"""Ctrl-C during a reply: stop after the current step and keep what was written."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cancel_on_interrupt() -> Iterator[threading.Event]:
    """First Ctrl-C asks the loop to stop after the current step; a second one aborts."""
    cancel = threading.Event()
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):  # noqa: ANN001
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    signal.signal(signal.SIGINT, handler)
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)
