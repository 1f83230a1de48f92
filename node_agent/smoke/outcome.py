"""What a smoke test is asked to do, what came of it, and how rank events become a result.

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
rules into ``Measurements``, one function per step in ``STEP_MERGES``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import fiar_contract as contract
from node_agent.childproc import ChildResult
from node_agent.smoke.events import FAILURE_STATUSES

KIND_OK = "ok"
KIND_NULL_MC_PTR = "null_mc_ptr"
KIND_NUMERICS = "numerics"
KIND_ERROR = "error"
KIND_CRASH = "crash"
KIND_HANG = "hang"
KIND_UNAVAILABLE = "unavailable"
KIND_POLICY = "policy"
KIND_BUSY = "busy"
KIND_NOT_APPLICABLE = "not_applicable"
KIND_NOT_PREBUILT = "not_prebuilt"
KIND_CANCELLED = "cancelled"
KIND_NO_INVENTORY = "no_inventory"
KIND_JIT = "jit"
KIND_NO_KERNEL_IMAGE = "no_kernel_image"
KIND_INFRASTRUCTURE = "infrastructure"
KIND_STARTUP = "startup"
UNTESTED_KINDS = frozenset({KIND_JIT, KIND_NO_KERNEL_IMAGE, KIND_INFRASTRUCTURE, KIND_STARTUP})
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

UNTESTED_WHY = {
    KIND_JIT: "the kernels could not be built or loaded",
    KIND_NO_KERNEL_IMAGE: "CUDA has no kernel image for this GPU",
    KIND_INFRASTRUCTURE: "an error of the host's resources, not of the backend",
    KIND_STARTUP: "the rank ended before the backend's first step (workspace)",
}

DEFAULT_BENCH_HIDDEN = (4096, 8192)
DEFAULT_BENCH_TOKENS = (1, 8, 64, 256, 1024, 4096)


@dataclass(frozen=True)
class SmokeRequest:
    backend: contract.Backend
    devices: tuple[int, ...]
    timeout_s: float
    benchmark: bool = False
    require_prebuilt: bool = False
    hidden: int = 4096
    tokens: int = 128
    bench_hidden: tuple[int, ...] = DEFAULT_BENCH_HIDDEN
    bench_tokens: tuple[int, ...] = DEFAULT_BENCH_TOKENS
    iters: int = 50

    @property
    def ranks(self) -> int:
        return len(self.devices)

    def worker_args(self) -> list[str]:
        args = [
            "--hidden", str(self.hidden),
            "--tokens", str(self.tokens),
            "--iters", str(self.iters),
        ]  # fmt: skip
        if self.benchmark:
            args += [
                "--benchmark",
                "--bench-hidden", ",".join(map(str, self.bench_hidden)),
                "--bench-tokens", ",".join(map(str, self.bench_tokens)),
            ]  # fmt: skip
        if self.require_prebuilt:
            args.append("--require-prebuilt")
        return args


@dataclass(frozen=True)
class BenchPoint:
    """Mean latency of one allreduce, max over ranks, in microseconds."""

    hidden: int
    tokens: int
    nccl_us: float
    backend_us: float
    backend_graph_us: float | None = None

    @property
    def ratio(self) -> float:
        """backend / NCCL, both launched eagerly: < 1 means the backend is faster."""
        return self.backend_us / self.nccl_us if self.nccl_us > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "hidden": self.hidden,
            "tokens": self.tokens,
            "nccl_us": round(self.nccl_us, 2),
            "backend_us": round(self.backend_us, 2),
        }
        if self.backend_graph_us is not None:
            d["backend_graph_us"] = round(self.backend_graph_us, 2)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BenchPoint:
        graph = d.get("backend_graph_us")
        return cls(
            hidden=int(d["hidden"]),
            tokens=int(d["tokens"]),
            nccl_us=float(d["nccl_us"]),
            backend_us=float(d["backend_us"]),
            backend_graph_us=None if graph is None else float(graph),
        )


@dataclass(frozen=True)
class SmokeOutcome:
    backend: contract.Backend
    result: contract.TestResult
    kind: str
    reason: str = ""
    degraded: bool = False
    """The test could not give an answer about the backend (timeout, missing software, busy GPUs)."""
    devices: tuple[int, ...] = ()
    steps: Mapping[str, float] = field(default_factory=dict)
    """Seconds per step, max over ranks; ``jit`` is the kernel build/load, apart from the test."""
    jit: Mapping[str, Any] = field(default_factory=dict)
    numerics: Mapping[str, Any] = field(default_factory=dict)
    latency_us: Mapping[str, float] = field(default_factory=dict)
    bench: tuple[BenchPoint, ...] = ()
    versions: Mapping[str, Any] = field(default_factory=dict)
    child_env: Mapping[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    reused_from: str | None = None
    failed_step: str = ""
    """The step a rank reported failing (``fail`` results of a failed step only)."""
    failed_on_every_rank: bool = False
    """Every rank reported failing, in ``failed_step``."""

    @classmethod
    def skipped(cls, backend: contract.Backend, kind: str, reason: str, degraded: bool = False) -> SmokeOutcome:
        return cls(backend=backend, result="skipped", kind=kind, reason=reason, degraded=degraded)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"result": self.result, "kind": self.kind}
        if self.reason:
            d["reason"] = self.reason
        if self.degraded:
            d["degraded"] = True
        if self.devices:
            d["ranks"] = len(self.devices)
            d["devices"] = list(self.devices)
        for key in ("steps", "jit", "numerics", "latency_us", "versions", "child_env"):
            value = getattr(self, key)
            if value:
                d[key] = dict(value)
        if self.bench:
            d["bench"] = [p.to_dict() for p in self.bench]
        if self.duration_s:
            d["duration_s"] = round(self.duration_s, 3)
        if self.reused_from:
            d["reused_from"] = self.reused_from
        if self.failed_step:
            d["failed_step"] = self.failed_step
        if self.failed_on_every_rank:
            d["failed_on_every_rank"] = True
        return d

    @classmethod
    def from_dict(cls, backend: contract.Backend, d: Mapping[str, Any]) -> SmokeOutcome:
        result = d.get("result")
        if result not in contract.TEST_RESULTS:
            raise ValueError(f"{backend}: result {result!r} is not one of {contract.TEST_RESULTS}")
        return cls(
            backend=backend,
            result=result,
            kind=str(d.get("kind", "")),
            reason=str(d.get("reason", "")),
            degraded=bool(d.get("degraded", False)),
            devices=tuple(int(x) for x in d.get("devices", ())),
            steps=dict(d.get("steps", {})),
            jit=dict(d.get("jit", {})),
            numerics=dict(d.get("numerics", {})),
            latency_us=dict(d.get("latency_us", {})),
            bench=tuple(BenchPoint.from_dict(p) for p in d.get("bench", ())),
            versions=dict(d.get("versions", {})),
            child_env=dict(d.get("child_env", {})),
            duration_s=float(d.get("duration_s", 0.0)),
            reused_from=d.get("reused_from"),
            failed_step=str(d.get("failed_step", "")),
            failed_on_every_rank=bool(d.get("failed_on_every_rank", False)),
        )


def infrastructure_error(message: str) -> bool:
    """Whether ``message`` names an error of the host's resources (``INFRASTRUCTURE_MARKERS``)."""
    lowered = message.lower()
    return any(marker in lowered for marker in INFRASTRUCTURE_MARKERS)


def failure_kind(step: str, message: str, kind: str = KIND_ERROR) -> str:
    """The kind of a failed step: CUDA's "no kernel image" anywhere, an infrastructure error
    anywhere, any error in ``jit``, any error before the backend's steps, else ``kind``."""
    lowered = message.lower()
    if any(marker in lowered for marker in NO_KERNEL_IMAGE_MARKERS):
        return KIND_NO_KERNEL_IMAGE
    if infrastructure_error(message):
        return KIND_INFRASTRUCTURE
    if step == "jit":
        return KIND_JIT
    if step not in BACKEND_STEPS:
        return KIND_STARTUP
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


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


@dataclass(frozen=True)
class Measurements:
    """What the ranks' ``ok`` events measured, merged over ranks (the worst rank counts)."""

    steps: Mapping[str, float] = field(default_factory=dict)
    jit: Mapping[str, Any] = field(default_factory=dict)
    numerics: Mapping[str, Any] = field(default_factory=dict)
    latency_us: Mapping[str, float] = field(default_factory=dict)
    bench: tuple[BenchPoint, ...] = ()
    versions: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class _Merging:
    """The measurements while they are merged, event by event."""

    steps: dict[str, float] = field(default_factory=dict)
    jit: dict[str, Any] = field(default_factory=dict)
    numerics: dict[str, Any] = field(default_factory=dict)
    latency: dict[str, float] = field(default_factory=dict)
    bench: dict[tuple[int, int], BenchPoint] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)


def _merge_import(m: _Merging, event: Mapping[str, Any]) -> None:
    if not m.versions:
        m.versions = dict(event.get("versions", {}))


def _merge_jit(m: _Merging, event: Mapping[str, Any]) -> None:
    m.jit["seconds"] = m.steps["jit"]
    m.jit["cached"] = bool(event.get("cached", False)) and m.jit.get("cached", True)
    if "source" in event:
        m.jit["source"] = event["source"]


def _merge_check(m: _Merging, event: Mapping[str, Any]) -> None:
    m.numerics[f"{event.get('step')}_checks"] = int(event.get("checks", 0))
    err = float(event.get("max_abs_err", 0.0))
    m.numerics["max_abs_err"] = max(float(m.numerics.get("max_abs_err", 0.0)), err)


def _merge_timing(m: _Merging, event: Mapping[str, Any]) -> None:
    for key in ("eager_us", "graph_us"):
        if key in event:
            m.latency[key] = round(max(m.latency.get(key, 0.0), float(event[key])), 2)


def _merge_benchmark(m: _Merging, event: Mapping[str, Any]) -> None:
    for raw in event.get("points", ()):
        point = BenchPoint.from_dict(raw)
        where = (point.hidden, point.tokens)
        old = m.bench.get(where)
        if old is None:
            m.bench[where] = point
            continue
        graph = [g for g in (old.backend_graph_us, point.backend_graph_us) if g is not None]
        m.bench[where] = BenchPoint(
            point.hidden,
            point.tokens,
            max(old.nccl_us, point.nccl_us),
            max(old.backend_us, point.backend_us),
            max(graph) if graph else None,
        )


STEP_MERGES: Mapping[str, Callable[[_Merging, Mapping[str, Any]], None]] = {
    "import": _merge_import,
    "jit": _merge_jit,
    "eager": _merge_check,
    "graph": _merge_check,
    "timing": _merge_timing,
    "benchmark": _merge_benchmark,
}
"""What an ``ok`` event of a step adds besides its duration (which every step has)."""


def merge(request: SmokeRequest, ranks: Sequence[Sequence[Mapping[str, Any]]]) -> Measurements:
    """Every rank's ``ok`` events as one set of measurements."""
    m = _Merging()
    for events in ranks:
        for e in events:
            if e.get("status") != "ok":
                continue
            step = str(e.get("step"))
            m.steps[step] = round(max(m.steps.get(step, 0.0), float(e.get("dt", 0.0))), 4)
            merge_step = STEP_MERGES.get(step)
            if merge_step is not None:
                merge_step(m, e)
    if m.numerics:
        m.numerics["reference"] = "sum over ranks computed in fp32 from the same bf16 inputs"
        m.numerics["shape"] = [request.tokens, request.hidden]
    return Measurements(m.steps, m.jit, m.numerics, m.latency, tuple(m.bench[k] for k in sorted(m.bench)), m.versions)


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
    kind: str
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
    return Ruling("timeout", KIND_HANG, reason, True)


def cancelled(end: Ending) -> Ruling | None:
    if not end.child.cancelled:
        return None
    return Ruling("skipped", KIND_CANCELLED, "the agent was stopped during the test", True)


def software_missing(end: Ending) -> Ruling | None:
    for _r, e in end.terminal("missing")[:1]:
        return Ruling(
            "skipped", KIND_UNAVAILABLE, f"torch or FlashInfer is not importable: {e.get('error', '?')}", True
        )
    return None


def refused(end: Ending) -> Ruling | None:
    for _r, e in end.terminal("refused")[:1]:
        return Ruling("skipped", KIND_POLICY, str(e.get("error", "refused")))
    return None


def not_prebuilt(end: Ending) -> Ruling | None:
    for _r, e in end.terminal("not_prebuilt")[:1]:
        reason = f"kernels are not prebuilt and JIT was not allowed: {e.get('error', '')}".rstrip(": ")
        return Ruling("skipped", KIND_NOT_PREBUILT, reason, True)
    return None


def untested_failure(end: Ending) -> Ruling | None:
    """A failed step that says nothing about the backend (``UNTESTED_KINDS``)."""
    for r, e in end.terminal("fail"):
        step, error = str(e.get("step")), str(e.get("error", "failed"))
        kind = failure_kind(step, error, str(e.get("kind", KIND_ERROR)))
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
        return Ruling("fail", str(e.get("kind", KIND_ERROR)), reason, step=step, every_rank=every)
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
            why = UNTESTED_WHY[KIND_INFRASTRUCTURE]
            reason += f": killed from outside the test (the kernel's OOM killer sends SIGKILL); {why}"
            return Ruling("skipped", KIND_INFRASTRUCTURE, reason, True)
        if not _reached_backend(events):
            reason += f"; {UNTESTED_WHY[KIND_STARTUP]}, the backend was not tested"
            return Ruling("skipped", KIND_STARTUP, reason, True)
        return Ruling("fail", KIND_CRASH, reason)
    return None


def supervisor_signal(end: Ending) -> Ruling | None:
    """The supervisor died from a signal before it wrote its summary."""
    if end.supervisor is not None or end.child.signal_name is None:
        return None
    reason = f"the test supervisor died with {end.child.signal_name}"
    sigkill = end.child.returncode == -signal.SIGKILL
    if sigkill or not any(_reached_backend(ev) for ev in end.ranks):
        kind = KIND_INFRASTRUCTURE if sigkill else KIND_STARTUP
        return Ruling("skipped", kind, f"{reason}; the backend was not tested", True)
    return Ruling("fail", KIND_CRASH, reason)


def all_done(end: Ending) -> Ruling | None:
    if len(end.ranks) == end.request.ranks and not end.unfinished():
        return Ruling("pass", KIND_OK, "")
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
        kind = KIND_INFRASTRUCTURE if infrastructure_error(end.child.stderr_tail(40)) else KIND_STARTUP
        reason += f": {UNTESTED_WHY[kind]}; the backend was not tested"
        return Ruling("skipped", kind, reason + (f" | {tail}" if tail else ""), True)
    return Ruling("fail", KIND_ERROR, reason + (f" | {tail}" if tail else ""))


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
    measured = merge(request, ranks)
    return SmokeOutcome(
        backend=request.backend,
        result=ruling.result,
        kind=ruling.kind,
        reason=ruling.reason,
        degraded=ruling.degraded,
        devices=request.devices,
        steps=measured.steps,
        jit=measured.jit,
        numerics=measured.numerics,
        latency_us=measured.latency_us,
        bench=measured.bench,
        versions=measured.versions,
        child_env=dict(child_env),
        duration_s=child.duration_s,
        failed_step=ruling.step,
        failed_on_every_rank=ruling.every_rank,
    )
