"""Retries: exponential backoff with jitter (``Backoff``, ``backoff_delay``). urllib3 never retries
on its own, and the lane sends again only a GET whose kept connection turned out closed before any
byte of an answer."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


def backoff_delay(
    attempt: int,
    *,
    initial: float,
    cap: float,
    factor: float = 2.0,
    jitter: tuple[float, float] = (-0.2, 0.2),
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """``min(cap, initial * factor**attempt)``, scaled by ``1 + uniform(*jitter)``."""
    try:
        base = min(cap, initial * factor**attempt)
    except OverflowError:  # after about a thousand attempts factor**attempt leaves the floats
        base = cap
    low, high = jitter
    return base * (1.0 + (uniform(low, high) if low != high else low))


@dataclass
class Backoff:
    """Exponential backoff with jitter: ``initial * factor**n`` capped at ``cap`` seconds, each delay
    scaled by a random factor in ``1 + jitter`` (by default 0.8 to 1.2)."""

    initial: float = 1.0
    cap: float = 60.0
    factor: float = 2.0
    jitter: tuple[float, float] = (-0.2, 0.2)
    attempts: int = field(default=0, init=False)

    def next_delay(self) -> float:
        delay = backoff_delay(self.attempts, initial=self.initial, cap=self.cap, factor=self.factor, jitter=self.jitter)
        self.attempts += 1
        return delay

    def reset(self) -> None:
        self.attempts = 0
