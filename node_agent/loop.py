"""What the node daemon does next: pure functions over the loop's state. No threads, no clock, no I/O.

The daemon (``daemon.Agent.run``) is one loop: it hands the triggers that arrived to ``arrive``,
asks ``step`` what to do at the current time, does it, and hands the result back (``probed``,
``probe_failed``, ``wrote``, ``driver_read``). ``step`` answers exactly one ``Action``:

1. ``Stop`` once ``stop`` arrived (SIGTERM/SIGINT);
2. ``Probe`` when triggers are due and no probe retry is being waited for; the triggers that
   arrive meanwhile are merged into one probe. A ``reprobe`` trigger carries the value of
   ``fiar.io/reprobe`` the probe answers (the newest one seen);
3. ``Write`` when a verdict or a reprobe answer waits for the API server and its backoff has
   passed. The first write after a probe made before the Node could be read reads it first
   (``read_previous``): if that probe concluded nothing and the Node's report holds a verdict
   (``node_verdict_wins``), the probe is dropped for a ``previous-report`` probe that keeps it;
4. ``CheckDriver`` every ``driver_check_s``;
5. ``Wait`` until the first deadline (at most ``HEARTBEAT_S``, so /healthz sees the loop live).

The interval fires inside ``step``: ``interval`` after an ok probe, ``retry`` (after
``min(retry_interval_s, interval_s)``) after a degraded one. An unexpected error inside a probe
puts its triggers back and holds probes for an exponential backoff (30 s doubling, capped at the
interval); a failed write is retried with its own (1 s doubling, capped at ``api_backoff_max_s``).
Both are reset by a success. Jitter is drawn by the caller and passed in, so the functions stay pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final, Literal

import fiar_contract as contract
import fiar_kube
from node_agent.report import PreviousReport
from node_agent.verdict import Status

Trigger = Literal["start", "interval", "retry", "driver-change", "reprobe", "previous-report", "stop"]
"""Why the loop acts: start-up, the interval, the retry after a degraded probe, a changed driver
version, the ``fiar.io/reprobe`` annotation, a Node verdict found after a blind probe, SIGTERM."""
Timer = Literal["interval", "retry"]

HEARTBEAT_S: Final = 5.0
"""The loop never waits longer than this, so its heartbeat (/healthz) stays fresh."""
PROBE_RETRY_INITIAL_S: Final = 30.0
"""First wait after a probe failed unexpectedly; doubles per failure, capped at the interval."""
API_RETRY_INITIAL_S: Final = 1.0
"""First wait after a failed write; doubles per failure, capped at ``api_backoff_max_s``."""


@dataclass(frozen=True)
class Timing:
    interval_s: float
    retry_interval_s: float
    """Wait after a degraded probe (capped by ``interval_s``)."""
    driver_check_s: float
    api_backoff_max_s: float

    @property
    def degraded_wait_s(self) -> float:
        return min(self.retry_interval_s, self.interval_s)

    @property
    def probe_retry_cap_s(self) -> float:
        return max(PROBE_RETRY_INITIAL_S, self.interval_s)


def backoff_s(failures: int, initial: float, cap: float, jitter: float = 0.0) -> float:
    """The wait after ``failures`` failures in a row (1: the first): ``initial * 2**(failures-1)``,
    capped at ``cap``, times ``1 + jitter`` (the caller draws ``jitter`` from [-0.2, 0.2])."""
    return fiar_kube.backoff_delay(max(0, failures - 1), initial=initial, cap=cap, jitter=(jitter, jitter))


@dataclass(frozen=True)
class Publish:
    """A verdict that waits for the API server: the labels and the report annotation's text."""

    labels: Mapping[str, str]
    report_text: str


@dataclass(frozen=True)
class LoopState:
    probe_at: float
    """When the interval (or the retry after a degraded probe) fires."""
    driver_at: float
    driver: str | None
    """The driver version last read; a different one is a ``driver-change``."""
    previous_read: bool
    """Whether the Node's report was read (the API may be down at start)."""
    probe_timer: Timer = "interval"
    due: tuple[Trigger, ...] = ()
    """Triggers waiting for the next probe, in order of arrival, each once."""
    reprobe: str | None = None
    """The ``fiar.io/reprobe`` value the next probe answers (``""`` is a request too)."""
    probe_failures: int = 0
    probe_hold_until: float = 0.0
    """After an unexpected probe error no probe starts before this."""
    publish: Publish | None = None
    clear: str | None = None
    """A reprobe value answered by a probe, to be removed from the Node once the verdict is written."""
    write_at: float = 0.0
    write_failures: int = 0
    stopping: bool = False

    @property
    def write_pending(self) -> bool:
        return self.publish is not None or self.clear is not None


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Probe:
    triggers: tuple[Trigger, ...]
    reprobe: str | None
    """The reprobe value this probe answers, if a ``reprobe`` trigger is among ``triggers``."""

    @property
    def name(self) -> str:
        """The triggers as one metric label value: ``start``, ``interval+reprobe``."""
        return "+".join(self.triggers)


@dataclass(frozen=True)
class Write:
    publish: Publish | None
    clear: str | None
    read_previous: bool
    """Read the Node's report first (``node_verdict_wins``): the probe ran before it could be read."""


@dataclass(frozen=True)
class CheckDriver:
    pass


@dataclass(frozen=True)
class Wait:
    until: float


Action = Stop | Probe | Write | CheckDriver | Wait

WriteOutcome = Literal["written", "failed", "superseded"]


@dataclass(frozen=True)
class Wrote:
    """What came of a ``Write``."""

    outcome: WriteOutcome
    """``superseded``: the Node holds a verdict the blind probe would have written over."""
    previous_read: bool = False
    published: bool = False
    """The labels and report reached the Node (also when clearing the reprobe then failed)."""
    cleared: bool = False
    """The reprobe answer is done: removed, or changed meanwhile and kept."""
    error: str | None = None
    """Why it ``failed`` (the API's answer)."""


def initial(now: float, driver: str | None, previous_read: bool, timing: Timing) -> LoopState:
    """The state at start-up, before the ``start`` trigger arrives."""
    return LoopState(
        probe_at=now + timing.interval_s,
        driver_at=now + timing.driver_check_s,
        driver=driver,
        previous_read=previous_read,
    )


def _merge(due: tuple[Trigger, ...], new: Iterable[Trigger]) -> tuple[Trigger, ...]:
    return tuple(dict.fromkeys((*due, *new)))


def arrive(state: LoopState, triggers: Iterable[Trigger], reprobe: str | None = None) -> LoopState:
    """Triggers that arrived from outside the loop (start, the watch, a signal)."""
    triggers = tuple(triggers)
    if "stop" in triggers:
        state = replace(state, stopping=True)
    state = replace(state, due=_merge(state.due, (t for t in triggers if t != "stop")))
    if reprobe is not None:
        state = replace(state, reprobe=reprobe)
    return state


def step(state: LoopState, now: float, timing: Timing) -> tuple[LoopState, Action]:
    """The next thing to do at ``now``, and the state once it is under way."""
    if state.stopping:
        return state, Stop()
    if now >= state.probe_at:
        state = replace(
            state, due=_merge(state.due, (state.probe_timer,)), probe_at=now + timing.interval_s, probe_timer="interval"
        )
    if state.due and now >= state.probe_hold_until:
        answers = state.reprobe if "reprobe" in state.due else None
        probe = Probe(triggers=state.due, reprobe=answers)
        return replace(state, due=(), reprobe=None if answers is not None else state.reprobe), probe
    if state.write_pending and now >= state.write_at:
        read = state.publish is not None and not state.previous_read
        return state, Write(publish=state.publish, clear=state.clear, read_previous=read)
    if now >= state.driver_at:
        return replace(state, driver_at=now + timing.driver_check_s), CheckDriver()
    deadlines = [state.probe_at, state.driver_at, now + HEARTBEAT_S]
    if state.write_pending:
        deadlines.append(state.write_at)
    if state.due:
        deadlines.append(state.probe_hold_until)
    return state, Wait(until=min(deadlines))


def probed(state: LoopState, now: float, probe: Probe, status: Status, publish: Publish, timing: Timing) -> LoopState:
    """A probe finished: its verdict waits to be written at once; the next probe is timed by its status."""
    degraded = status == "degraded"
    return replace(
        state,
        probe_failures=0,
        probe_hold_until=0.0,
        publish=publish,
        clear=probe.reprobe if probe.reprobe is not None else state.clear,
        write_at=0.0,
        probe_at=now + (timing.degraded_wait_s if degraded else timing.interval_s),
        probe_timer="retry" if degraded else "interval",
    )


def probe_failed(state: LoopState, now: float, probe: Probe, timing: Timing, jitter: float = 0.0) -> LoopState:
    """A probe raised: its triggers (and reprobe value, unless a newer one came) wait for the backoff."""
    failures = state.probe_failures + 1
    wait = backoff_s(failures, PROBE_RETRY_INITIAL_S, timing.probe_retry_cap_s, jitter)
    return replace(
        state,
        due=_merge(probe.triggers, state.due),
        reprobe=state.reprobe if state.reprobe is not None else probe.reprobe,
        probe_failures=failures,
        probe_hold_until=now + wait,
    )


def node_verdict_wins(labels: Mapping[str, str], node_report: PreviousReport | None) -> bool:
    """A probe made before the Node could be read concluded nothing, and the Node's report holds a
    verdict: probe again with that report rather than write "no verdict" over it."""
    return contract.LABEL_BACKEND not in labels and node_report is not None and node_report.has_verdict


def wrote(state: LoopState, now: float, result: Wrote, timing: Timing, jitter: float = 0.0) -> LoopState:
    state = replace(state, previous_read=state.previous_read or result.previous_read)
    if result.outcome == "superseded":
        return replace(state, publish=None, due=_merge(state.due, ("previous-report",)))
    if result.published:
        state = replace(state, publish=None)
    if result.cleared:
        state = replace(state, clear=None)
    if result.outcome == "failed":
        failures = state.write_failures + 1
        wait = backoff_s(failures, API_RETRY_INITIAL_S, timing.api_backoff_max_s, jitter)
        return replace(state, write_failures=failures, write_at=now + wait)
    return replace(state, write_failures=0)


def driver_read(state: LoopState, current: str | None) -> LoopState:
    """A driver version that differs from the last one read (and is readable) triggers a probe."""
    if current is None or current == state.driver:
        return state
    return replace(state, driver=current, due=_merge(state.due, ("driver-change",)))
