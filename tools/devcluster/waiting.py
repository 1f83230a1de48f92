"""Poll for a condition instead of sleeping for a guess."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(RuntimeError):
    """A condition did not become true in time; the message names it."""


def wait_for(
    predicate: Callable[[], T | None], timeout: float = 30.0, what: str = "condition", interval: float = 0.1
) -> T:
    """Call ``predicate`` until it returns a truthy value, and return that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(f"{what}: not met within {timeout:.0f}s (last value {value!r})")
        time.sleep(interval)
