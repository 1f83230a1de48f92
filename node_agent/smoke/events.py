"""Per-rank event files: one JSON object per line, appended and flushed as each step starts and ends.

An event is ``{"step": ..., "status": ..., "t": <unix time>, "pid": ..., ...}``. Statuses:

* ``start`` / ``ok``: a step began / finished (``ok`` carries ``dt``, its seconds);
* ``fail``: the step failed (``kind``: ``null_mc_ptr``, ``numerics``, ``error``; ``jit`` and
  ``no_kernel_image`` when the kernels could not be built, loaded or run on this GPU at all;
  ``infrastructure`` and ``startup`` for a host error or a failure before ``workspace``);
* ``missing``: torch or FlashInfer could not be imported;
* ``refused``: the worker refused to run (host policy forbids multicast);
* ``not_prebuilt``: the kernels are not in the JIT cache and ``--require-prebuilt`` was given;
* ``done``: the rank finished every step.

Steps in order: ``import``, ``init``, ``jit``, ``workspace``, ``eager``, ``graph``, ``timing``,
``benchmark``, ``done``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, TextIO

ENV_EVENTS_FILE = "FIAR_EVENTS_FILE"
STEPS = ("import", "init", "jit", "workspace", "eager", "graph", "timing", "benchmark", "done")
FAILURE_STATUSES = ("missing", "refused", "not_prebuilt", "fail")
"""The statuses that end a rank before ``done``, in the order ``rules.classify`` weighs them."""
TERMINAL = frozenset({*FAILURE_STATUSES, "done"})


class EventLog:
    """Appends events for one rank; a no-op sink when no file is configured."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self._file: TextIO | None = open(path, "a", buffering=1) if path else None  # noqa: SIM115
        self._started: dict[str, float] = {}

    @classmethod
    def from_env(cls) -> EventLog:
        return cls(os.environ.get(ENV_EVENTS_FILE))

    def emit(self, step: str, status: str, **fields: Any) -> None:
        event = {"step": step, "status": status, "t": time.time(), "pid": os.getpid(), **fields}
        if self._file is not None:
            self._file.write(json.dumps(event, default=str) + "\n")
            self._file.flush()

    def start(self, step: str, **fields: Any) -> None:
        self._started[step] = time.perf_counter()
        self.emit(step, "start", **fields)

    def ok(self, step: str, **fields: Any) -> float:
        dt = time.perf_counter() - self._started.get(step, time.perf_counter())
        self.emit(step, "ok", dt=round(dt, 6), **fields)
        return dt


def read_events(path: Path) -> list[dict[str, Any]]:
    """Events of one rank; a torn last line (the rank was killed mid-write) is ignored."""
    events: list[dict[str, Any]] = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return events
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events
