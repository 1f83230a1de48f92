"""Watch streams: the byte stream split into JSON events, each line bounded."""

from __future__ import annotations

import json
from typing import Any, Final

from .errors import EventTooLarge

MAX_EVENT_BYTES: Final = 16 * 1024 * 1024
"""Longest watch event line accepted: well above the API server's largest object (its request limit
is 3 MiB), far below what an endless line would take."""


class WatchLines:
    """Splits a watch stream into its JSON events (one per line); a line over ``limit`` bytes raises
    ``EventTooLarge`` before it is kept whole, a line that is not JSON raises ValueError."""

    def __init__(self, limit: int = MAX_EVENT_BYTES) -> None:
        self.limit = limit
        self._buffer = bytearray()

    @property
    def pending(self) -> bool:
        """Whether part of a line came and its end has not."""
        return bool(self._buffer)

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        self._buffer.extend(chunk)
        events: list[dict[str, Any]] = []
        newline = self._buffer.find(b"\n")
        while newline != -1:
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            if len(line) > self.limit:
                raise EventTooLarge(f"a watch event of {len(line)} bytes (at most {self.limit})")
            if line.strip():
                events.append(_event(line))
            newline = self._buffer.find(b"\n")
        if len(self._buffer) > self.limit:
            raise EventTooLarge(f"a watch event over {self.limit} bytes")
        return events


def _event(line: bytes) -> dict[str, Any]:
    event = json.loads(line)
    if not isinstance(event, dict):
        raise ValueError(f"a watch event that is not an object: {line[:100]!r}")
    return event
