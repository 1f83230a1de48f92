"""Time limits of a request: a ``Timeout`` as (connect seconds, seconds per read, deadline), and the
``Watchdog`` that ends a read urllib3 would let run past its deadline."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable

Timeout = float | tuple[float, float] | None
"""A total in seconds; or (connect, read) seconds: each wait bounded by its own, and the whole exchange
by their sum, so that a server that trickles bytes cannot hold a request longer; or None for no limit."""


def limits(timeout: Timeout) -> tuple[float | None, float | None, float | None]:
    """(connect seconds, seconds per read, deadline) of a ``Timeout``."""
    if isinstance(timeout, tuple):
        return timeout[0], timeout[1], time.monotonic() + timeout[0] + timeout[1]
    if timeout is None:
        return None, None, None
    return timeout, timeout, time.monotonic() + timeout


def within(seconds: float | None, deadline: float | None) -> float | None:
    if deadline is None:
        return seconds
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the request's time is up")
    return left if seconds is None else min(seconds, left)


class Alarm:
    """One armed deadline: ``fired`` once its callback ran; ``cancel`` before that keeps it from running."""

    __slots__ = ("callback", "cancelled", "fired")

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback = callback
        self.cancelled = False
        self.fired = False

    def cancel(self) -> None:
        self.cancelled = True


class Watchdog:
    """One daemon thread that runs each armed callback at its deadline unless it was cancelled first
    (the client shuts a urllib3 answer's socket down with it: a blocked read then ends)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, Alarm]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float, callback: Callable[[], object]) -> Alarm:
        alarm = Alarm(callback)
        with self._wake:
            heapq.heappush(self._heap, (deadline, next(self._order), alarm))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fiar-kube-watchdog", daemon=True)
                self._thread.start()
            self._wake.notify()
        return alarm

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._wake.wait()
                    continue
                wait = self._heap[0][0] - self.clock()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                _, _, alarm = heapq.heappop(self._heap)
            alarm.fired = True
            with contextlib.suppress(Exception):  # an answer closed meanwhile: nothing left to end
                alarm.callback()


WATCHDOG = Watchdog()
