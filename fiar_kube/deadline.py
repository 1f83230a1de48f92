"""Time limits of a request: a ``Timeout`` as (connect seconds, seconds per read, deadline)."""

from __future__ import annotations

import time

Timeout = float | tuple[float, float] | None
"""A total in seconds, or (connect, read) seconds, or None for no limit."""


def limits(timeout: Timeout) -> tuple[float | None, float | None, float | None]:
    """(connect seconds, seconds per read, deadline) of a ``Timeout``: a total bounds both by one deadline."""
    if isinstance(timeout, tuple):
        return timeout[0], timeout[1], None
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
