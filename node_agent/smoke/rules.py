"""How a smoke test ended: the ordered rules that make its result of the ranks' events.

Pure code (no processes, no torch): ``classify`` turns the event files of every rank, the
supervisor's summary and the child's exit into one ``SmokeOutcome``. The rules, in order:

1. the launcher killed the group at its timeout: ``timeout`` (degraded), naming the step each
   unfinished rank was in;
2. the agent was stopped meanwhile: ``skipped`` (degraded);
3. a rank could not import torch/FlashInfer: ``skipped`` (degraded, kind ``unavailable``);
4. a rank refused (host policy) or found the kernels not prebuilt: ``skipped``;
5. a rank failed in a way that says nothing about the backend: ``skipped`` (degraded), kind
   ``jit`` (a kernel build or load failed: a compile error, a missing prebuilt module),
   ``no_kernel_image`` (CUDA had no kernel image for the device, e.g. an architecture the image
   did not build for), ``infrastructure`` (the host, not the backend: a port in use, ``/dev/shm``
   or the disk full, GPU or host memory exhausted, a failed fork, no file descriptors left; see
   ``INFRASTRUCTURE_MARKERS``) or ``startup`` (it failed before the first step that exercises the
   backend, ``workspace``: in ``import``, ``init`` or before any event);
6. a rank reported a failed step: ``fail`` with that rank's kind (``null_mc_ptr``, ``numerics``,
   ``error``);
7. a rank died from a signal it was not sent by the supervisor: ``fail`` (kind ``crash``) once the
   backend was exercised; before that, or by ``SIGKILL`` (what the kernel's OOM killer sends; the
   supervisor's own kills are known), ``skipped`` (degraded, ``startup`` / ``infrastructure``);
8. every rank reported ``done``: ``pass``;
9. anything else (a rank exited without a verdict): ``fail`` (kind ``error``) if a rank that did
   not finish had reached the backend's steps, else ``skipped`` (degraded, ``startup``, or
   ``infrastructure`` when the ranks' stderr names an infrastructure error).

A test that is ``skipped`` and degraded is inconclusive: the verdict never turns it into ``none``.

Each rule is one function of the test's ``Ending`` that returns a ``Ruling`` or None (does not
apply), listed in order in ``OUTCOME_RULES``; ``no_verdict`` (rule 9) comes last. The measurements
(step durations, JIT, numerics, latency, benchmark points, versions) are merged apart from the
rules (``measure.merge``). A kind a rank reports that is no ``OutcomeKind`` reads as ``error``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import fiar_contract as contract
from node_agent.childproc import ChildResult
from node_agent.smoke.events import FAILURE_STATUSES
from node_agent.smoke.measure import merge
from node_agent.smoke.outcome import OutcomeKind, SmokeOutcome, SmokeRequest, is_kind

UNTESTED_KINDS: Final[frozenset[OutcomeKind]] = frozenset({"jit", "no_kernel_image", "infrastructure", "startup"})
"""Kinds of a failed step that say nothing about the backend: the test is skipped, not failed."""
NO_KERNEL_IMAGE_MARKERS = ("no kernel image is available", "nokernelimagefordevice")
INFRASTRUCTURE_MARKERS = (
    "address already in use",  # EADDRINUSE: the rendezvous port was taken
    "eaddrinuse",
    "no space left on device",  # ENOSPC: /dev/shm (NCCL, FlashInfer IPC) or the cache disk full
    "out of memory",  # CUDA OOM (torch.OutOfMemoryError), CUDA_ERROR_OUT_OF_MEMORY
    "cudaerrormemoryallocation",
    "cannot allocate memory",  # ENOMEM: fork, mmap
    "resource temporarily unavailable",  # EAGAIN: fork at the process limit
    "too many open files",  # EMFILE
)
"""Lower-case fragments of errors caused by the host's resources, not by the backend under test."""
BACKEND_STEPS = ("workspace", "eager", "graph", "timing", "benchmark")
"""Steps that exercise the backend; a rank that ends before ``workspace`` never tested it."""

UNTESTED_WHY: Final[Mapping[OutcomeKind, str]] = {
    "jit": "the kernels could not be built or loaded",
    "no_kernel_image": "CUDA has no kernel image for this GPU",
    "infrastructure": "an error of the host's resources, not of the backend",
    "startup": "the rank ended before the backend's first step (workspace)",
}


def infrastructure_error(message: str) -> bool:
    """Whether ``message`` names an error of the host's resources (``INFRASTRUCTURE_MARKERS``)."""
    lowered = message.lower()
    return any(marker in lowered for marker in INFRASTRUCTURE_MARKERS)


def failure_kind(step: str, message: str, kind: OutcomeKind = "error") -> OutcomeKind:
    """The kind of a failed step: CUDA's "no kernel image" anywhere, an infrastructure error
    anywhere, any error in ``jit``, any error before the backend's steps, else ``kind``."""
    lowered = message.lower()
    if any(marker in lowered for marker in NO_KERNEL_IMAGE_MARKERS):
        return "no_kernel_image"
    if infrastructure_error(message):
        return "infrastructure"
    if step == "jit":
        return "jit"
    if step not in BACKEND_STEPS:
        return "startup"
    return kind


def _last(events: Sequence[Mapping[str, Any]], status: str) -> Mapping[str, Any] | None:
    found: Mapping[str, Any] | None = None
    for event in events:
        if event.get("status") == status:
            found = event
    return found


def _current_step(events: Sequence[Mapping[str, Any]]) -> str:
    """The step a rank was in when its events end."""
    if not events:
        return "start-up"
    last = events[-1]
    step = str(last.get("step", "?"))
    if last.get("status") == "ok":
        return f"after {step}"
    return step


def _reached_backend(events: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a rank got as far as a step that exercises the backend."""
    return any(e.get("step") in BACKEND_STEPS for e in events)


def _reported_kind(event: Mapping[str, Any]) -> OutcomeKind:
    """The kind a rank reported with its failure; ``error`` when it named none (or no kind)."""
    kind = event.get("kind", "error")
    return kind if is_kind(kind) else "error"


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


# -- how a test ended: ordered rules -----------------------------------------------------------------


@dataclass(frozen=True)
class Ending:
    """Everything a test's end is judged from: every rank's events, the supervisor's summary (None
    when it wrote none) and the child's exit."""

    request: SmokeRequest
    ranks: Sequence[Sequence[Mapping[str, Any]]]
    supervisor: Mapping[str, Any] | None
    child: ChildResult

    @property
    def returncodes(self) -> list[Any]:
        return list((self.supervisor or {}).get("returncodes", []))

    def terminal(self, status: str) -> list[tuple[int, Mapping[str, Any]]]:
        """(rank, event) for every rank whose first terminal event has ``status``."""
        found = []
        for r, events in enumerate(self.ranks):
            first = next((e for e in events if e.get("status") in TERMINAL_STATUSES), None)
            if first is not None and first["status"] == status:
                found.append((r, first))
        return found

    def unfinished(self) -> list[tuple[int, Sequence[Mapping[str, Any]]]]:
        return [(r, events) for r, events in enumerate(self.ranks) if _last(events, "done") is None]


TERMINAL_STATUSES = FAILURE_STATUSES
"""Event statuses with which a rank reports that it stops (``events.FAILURE_STATUSES``)."""


@dataclass(frozen=True)
class Ruling:
    """What one rule made of a test's end."""

    result: contract.TestResult
    kind: OutcomeKind
    reason: str
    degraded: bool = False
    step: str = ""
    """The step a rank reported failing, where one did."""
    every_rank: bool = False
    """Every rank reported failing in ``step``."""


OutcomeRule = Callable[[Ending], Ruling | None]
"""One rule: a ruling, or None when the rule does not apply (the next one is asked)."""


def timed_out(end: Ending) -> Ruling | None:
    if not end.child.timed_out:
        return None
    stuck = [f"rank {r} in {_current_step(ev)}" for r, ev in end.unfinished()] or ["the launcher"]
    reason = f"no result within {end.request.timeout_s:.0f}s ({'; '.join(stuck)}); the whole process group was killed"
    return Ruling("timeout", "hang", reason, True)


def cancelled(end: Ending) -> Ruling | None:
    if not end.child.cancelled:
        return None
    return Ruling("skipped", "cancelled", "the agent was stopped during the test", True)


def software_missing(end: Ending) -> Ruling | None:
    for _r, e in end.terminal("missing")[:1]:
        return Ruling("skipped", "unavailable", f"torch or FlashInfer is not importable: {e.get('error', '?')}", True)
    return None


def refused(end: Ending) -> Ruling | None:
    for _r, e in end.terminal("refused")[:1]:
        return Ruling("skipped", "policy", str(e.get("error", "refused")))
    return None


def not_prebuilt(end: Ending) -> Ruling | None:
    for _r, e in end.terminal("not_prebuilt")[:1]:
        reason = f"kernels are not prebuilt and JIT was not allowed: {e.get('error', '')}".rstrip(": ")
        return Ruling("skipped", "not_prebuilt", reason, True)
    return None


def untested_failure(end: Ending) -> Ruling | None:
    """A failed step that says nothing about the backend (``UNTESTED_KINDS``)."""
    for r, e in end.terminal("fail"):
        step, error = str(e.get("step")), str(e.get("error", "failed"))
        kind = failure_kind(step, error, _reported_kind(e))
        if kind in UNTESTED_KINDS:
            reason = f"rank {r}, step {step}: {UNTESTED_WHY[kind]} ({error}); the backend was not tested"
            return Ruling("skipped", kind, reason, True)
    return None


def failed_step(end: Ending) -> Ruling | None:
    failures = end.terminal("fail")
    for r, e in failures[:1]:
        step = str(e.get("step", ""))
        every = len(failures) == end.request.ranks and all(str(f.get("step", "")) == step for _r, f in failures)
        reason = f"rank {r}, step {step}: {e.get('error', 'failed')}"
        return Ruling("fail", _reported_kind(e), reason, step=step, every_rank=every)
    return None


def rank_signal(end: Ending) -> Ruling | None:
    """A rank died from a signal the supervisor did not send."""
    killed = set((end.supervisor or {}).get("killed", []))
    for r, code in enumerate(end.returncodes):
        if not (isinstance(code, int) and code < 0 and r not in killed):
            continue
        events = end.ranks[r] if r < len(end.ranks) else []
        reason = (
            f"rank {r} died with {_signal_name(code)} during {_current_step(events)} (contained in its process group)"
        )
        if code == -signal.SIGKILL:
            why = UNTESTED_WHY["infrastructure"]
            reason += f": killed from outside the test (the kernel's OOM killer sends SIGKILL); {why}"
            return Ruling("skipped", "infrastructure", reason, True)
        if not _reached_backend(events):
            reason += f"; {UNTESTED_WHY['startup']}, the backend was not tested"
            return Ruling("skipped", "startup", reason, True)
        return Ruling("fail", "crash", reason)
    return None


def supervisor_signal(end: Ending) -> Ruling | None:
    """The supervisor died from a signal before it wrote its summary."""
    if end.supervisor is not None or end.child.signal_name is None:
        return None
    reason = f"the test supervisor died with {end.child.signal_name}"
    sigkill = end.child.returncode == -signal.SIGKILL
    if sigkill or not any(_reached_backend(ev) for ev in end.ranks):
        kind: OutcomeKind = "infrastructure" if sigkill else "startup"
        return Ruling("skipped", kind, f"{reason}; the backend was not tested", True)
    return Ruling("fail", "crash", reason)


def all_done(end: Ending) -> Ruling | None:
    if len(end.ranks) == end.request.ranks and not end.unfinished():
        return Ruling("pass", "ok", "")
    return None


def no_verdict(end: Ending) -> Ruling:
    """A rank exited without a verdict: a failure once it had reached the backend's steps."""
    codes = end.returncodes
    unfinished = end.unfinished()
    details = [
        f"rank {r} exited with {codes[r] if r < len(codes) else None} during {_current_step(events)}"
        for r, events in unfinished
    ]
    tail = end.child.stderr_tail(4)
    reason = "; ".join(details) or f"the test supervisor exited with {end.child.returncode}"
    if not any(_reached_backend(ev) for _r, ev in unfinished):
        kind: OutcomeKind = "infrastructure" if infrastructure_error(end.child.stderr_tail(40)) else "startup"
        reason += f": {UNTESTED_WHY[kind]}; the backend was not tested"
        return Ruling("skipped", kind, reason + (f" | {tail}" if tail else ""), True)
    return Ruling("fail", "error", reason + (f" | {tail}" if tail else ""))


OUTCOME_RULES: tuple[OutcomeRule, ...] = (
    timed_out,
    cancelled,
    software_missing,
    refused,
    not_prebuilt,
    untested_failure,
    failed_step,
    rank_signal,
    supervisor_signal,
    all_done,
)
"""The rules of the module docstring, in order; the first that applies decides, ``no_verdict`` last.
A new rule is one function and one line here."""


def rule(end: Ending) -> Ruling:
    """The ruling of the first rule that applies."""
    for outcome_rule in OUTCOME_RULES:
        ruling = outcome_rule(end)
        if ruling is not None:
            return ruling
    return no_verdict(end)


def classify(
    request: SmokeRequest,
    ranks: Sequence[Sequence[Mapping[str, Any]]],
    supervisor: Mapping[str, Any] | None,
    child: ChildResult,
    child_env: Mapping[str, str],
) -> SmokeOutcome:
    """One outcome from every rank's events (see the module docstring for the rules)."""
    ruling = rule(Ending(request, ranks, supervisor, child))
    return SmokeOutcome(
        backend=request.backend,
        result=ruling.result,
        kind=ruling.kind,
        reason=ruling.reason,
        degraded=ruling.degraded,
        devices=request.devices,
        measured=merge(request, ranks),
        child_env=dict(child_env),
        duration_s=child.duration_s,
        failed_step=ruling.step,
        failed_on_every_rank=ruling.every_rank,
    )
