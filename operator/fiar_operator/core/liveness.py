"""Whether every part of the operator still makes progress: what ``/healthz`` answers.

``/healthz`` is served by the webhook server's event loop, so when that loop is blocked, or the
process is stopped, the kubelet's probe gets no answer and its timeout counts a failure. The other
parts run elsewhere and could hang unseen behind a loop that still answers: kopf's event loop on the
main thread (peering), the reconciler's thread, and the threads that parse and answer reviews. Each
beats here (the review threads are probed by ``/healthz`` itself), and ``/healthz`` fails while one
has been silent for longer than its bound, so the kubelet restarts the operator.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Final

KOPF_LOOP: Final = "kopf-loop"
RECONCILER: Final = "reconciler"
PULSE: Final = 1.0
"""Seconds between beats of an event loop's heartbeat task."""
LOOP_SILENCE: Final = 20.0
"""Seconds kopf's event loop may miss its beats: far above any pause of a working loop (a beat is a
timer callback; a busy loop answers it within milliseconds), far below the 60 s after which peers
take a silent replica's leadership."""
RECONCILER_SILENCE: Final = 60.0
"""Seconds the reconciler may go without a step or a reviewed pod (it steps at least every 0.5 s
and beats for each pod it reviews, so only a call that never returns silences it this long)."""


class Heartbeats:
    """Named heartbeats, each with the longest silence it may keep. Thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last: dict[str, float] = {}
        self._bound: dict[str, float] = {}
        self._lock = threading.Lock()

    def expect(self, name: str, within: float) -> None:
        """From now on ``name`` beats at least every ``within`` seconds (counted from now)."""
        with self._lock:
            self._bound[name] = within
            self._last[name] = self.clock()

    def beat(self, name: str) -> None:
        with self._lock:
            if name in self._bound:
                self._last[name] = self.clock()

    def forget(self, name: str) -> None:
        with self._lock:
            self._bound.pop(name, None)
            self._last.pop(name, None)

    def silent(self) -> list[tuple[str, float]]:
        """(name, seconds since its last beat) of every heartbeat silent beyond its bound."""
        now = self.clock()
        with self._lock:
            ages = {name: now - last for name, last in self._last.items()}
            return sorted((name, age) for name, age in ages.items() if age > self._bound[name])

    async def pulse(self, name: str, within: float = LOOP_SILENCE, every: float = PULSE) -> None:
        """Beat ``name`` from the running event loop every ``every`` seconds, until cancelled."""
        self.expect(name, within)
        try:
            while True:
                self.beat(name)
                await asyncio.sleep(every)
        finally:
            self.forget(name)
