"""The daemon's clock: monotonic time and a wait on an event, behind one small interface.

The loop never calls ``time`` itself; it is handed a ``Clock``. ``SYSTEM_CLOCK`` is the real one;
tests hand it a clock whose time moves only when the loop waits, so deadlines, backoff and outages
of hours run in milliseconds.
"""

from __future__ import annotations

import threading
import time
from typing import Final, Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Wait until ``event`` is set or ``timeout_s`` has passed; whether it is set."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        return event.wait(max(0.0, timeout_s))


SYSTEM_CLOCK: Final = SystemClock()
