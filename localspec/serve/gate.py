"""One generation at a time, the rest waiting in arrival order, up to a limit.

llama.cpp contexts are not thread-safe, so the engine runs one request at a
time (:attr:`Engine.lock`). A lock alone wakes waiters in no particular
order and lets a queue grow without bound; the gate hands out tickets, serves
them in order, skips a ticket whose client gave up while waiting, and refuses
a request outright (the server answers 503 with ``Retry-After``) when
``limit`` requests are already waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class QueueFull(Exception):
    """``limit`` requests are already waiting."""

    def __init__(self, waiting: int) -> None:
        super().__init__(f"{waiting} requests are already waiting")
        self.waiting = waiting


class Cancelled(Exception):
    """The request's client gave up while it waited."""


class Gate:
    """Tickets served first come, first served; at most ``limit`` waiting besides the one running."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._condition = threading.Condition()
        self._next = 0  # the next ticket to hand out
        self._serving = 0  # the ticket whose turn it is
        self._abandoned: set[int] = set()
        self.running = False

    @property
    def waiting(self) -> int:
        with self._condition:
            return self._waiting()

    def _waiting(self) -> int:
        return self._next - self._serving - (1 if self.running else 0) - len(self._abandoned)

    def ticket(self) -> int:
        """A place in the queue, or :class:`QueueFull`."""
        with self._condition:
            if self._waiting() >= self.limit:
                raise QueueFull(self._waiting())
            ticket = self._next
            self._next += 1
            return ticket

    @contextmanager
    def turn(self, ticket: int, cancel: threading.Event) -> Iterator[None]:
        """Wait until ``ticket`` is served (or ``cancel`` is set: :class:`Cancelled`), then hold the turn."""
        with self._condition:
            while self._serving != ticket:
                if cancel.is_set():
                    self._abandoned.add(ticket)
                    raise Cancelled()
                self._condition.wait()
            self.running = True
        try:
            yield
        finally:
            with self._condition:
                self.running = False
                self._serving += 1
                while self._serving in self._abandoned:
                    self._abandoned.discard(self._serving)
                    self._serving += 1
                self._condition.notify_all()

    def wake(self) -> None:
        """Let waiters re-check their cancel flags (a client went away)."""
        with self._condition:
            self._condition.notify_all()
