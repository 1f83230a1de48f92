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
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
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


def _merge(
    request: SmokeRequest, ranks: Sequence[Sequence[Mapping[str, Any]]]
) -> tuple[dict[str, float], dict[str, Any], dict[str, Any], dict[str, float], tuple[BenchPoint, ...], dict[str, Any]]:
    steps: dict[str, float] = {}
    jit: dict[str, Any] = {}
    numerics: dict[str, Any] = {}
    latency: dict[str, float] = {}
    bench: dict[tuple[int, int], BenchPoint] = {}
    versions: dict[str, Any] = {}
    for events in ranks:
        for e in events:
            if e.get("status") != "ok":
                continue
            step = str(e.get("step"))
            steps[step] = round(max(steps.get(step, 0.0), float(e.get("dt", 0.0))), 4)
            if step == "import" and not versions:
                versions = dict(e.get("versions", {}))
            elif step == "jit":
                jit["seconds"] = steps["jit"]
                jit["cached"] = bool(e.get("cached", False)) and jit.get("cached", True)
                if "source" in e:
                    jit["source"] = e["source"]
            elif step in ("eager", "graph"):
                numerics[f"{step}_checks"] = int(e.get("checks", 0))
                err = float(e.get("max_abs_err", 0.0))
                numerics["max_abs_err"] = max(float(numerics.get("max_abs_err", 0.0)), err)
            elif step == "timing":
                for key in ("eager_us", "graph_us"):
                    if key in e:
                        latency[key] = round(max(latency.get(key, 0.0), float(e[key])), 2)
            elif step == "benchmark":
                for raw in e.get("points", ()):
                    point = BenchPoint.from_dict(raw)
                    where = (point.hidden, point.tokens)
                    old = bench.get(where)
                    if old is None:
                        bench[where] = point
                    else:
                        graph = [g for g in (old.backend_graph_us, point.backend_graph_us) if g is not None]
                        bench[where] = BenchPoint(
                            point.hidden,
                            point.tokens,
                            max(old.nccl_us, point.nccl_us),
                            max(old.backend_us, point.backend_us),
                            max(graph) if graph else None,
                        )
    if numerics:
        numerics["reference"] = "sum over ranks computed in fp32 from the same bf16 inputs"
        numerics["shape"] = [request.tokens, request.hidden]
    return steps, jit, numerics, latency, tuple(bench[k] for k in sorted(bench)), versions


def classify(
    request: SmokeRequest,
    ranks: Sequence[Sequence[Mapping[str, Any]]],
    supervisor: Mapping[str, Any] | None,
    child: ChildResult,
    child_env: Mapping[str, str],
) -> SmokeOutcome:
    """One outcome from every rank's events (see the module docstring for the rules)."""
    steps, jit, numerics, latency, bench, versions = _merge(request, ranks)
    common: dict[str, Any] = {
        "devices": request.devices,
        "steps": steps,
        "jit": jit,
        "numerics": numerics,
        "latency_us": latency,
        "bench": bench,
        "versions": versions,
        "child_env": dict(child_env),
        "duration_s": child.duration_s,
    }
    b = request.backend
    if child.timed_out:
        stuck = [f"rank {r} in {_current_step(ev)}" for r, ev in enumerate(ranks) if _last(ev, "done") is None] or [
            "the launcher"
        ]
        reason = f"no result within {request.timeout_s:.0f}s ({'; '.join(stuck)}); the whole process group was killed"
        return SmokeOutcome(backend=b, result="timeout", kind=KIND_HANG, reason=reason, degraded=True, **common)
    if child.cancelled:
        return SmokeOutcome(b, "skipped", KIND_CANCELLED, "the agent was stopped during the test", True, **common)

    terminal: list[tuple[int, Mapping[str, Any]]] = []
    for r, events in enumerate(ranks):
        for e in events:
            if e.get("status") in FAILURE_STATUSES:
                terminal.append((r, e))
                break
    by_status = {status: [(r, e) for r, e in terminal if e["status"] == status] for status in FAILURE_STATUSES}
    if by_status["missing"]:
        r, e = by_status["missing"][0]
        reason = f"torch or FlashInfer is not importable: {e.get('error', '?')}"
        return SmokeOutcome(b, "skipped", KIND_UNAVAILABLE, reason, True, **common)
    if by_status["refused"]:
        r, e = by_status["refused"][0]
        return SmokeOutcome(b, "skipped", KIND_POLICY, str(e.get("error", "refused")), False, **common)
    if by_status["not_prebuilt"]:
        r, e = by_status["not_prebuilt"][0]
        reason = f"kernels are not prebuilt and JIT was not allowed: {e.get('error', '')}".rstrip(": ")
        return SmokeOutcome(b, "skipped", KIND_NOT_PREBUILT, reason, True, **common)
    for r, e in by_status["fail"]:
        step, error = str(e.get("step")), str(e.get("error", "failed"))
        kind = failure_kind(step, error, str(e.get("kind", KIND_ERROR)))
        if kind in UNTESTED_KINDS:
            what = UNTESTED_WHY[kind]
            reason = f"rank {r}, step {step}: {what} ({error}); the backend was not tested"
            return SmokeOutcome(b, "skipped", kind, reason, True, **common)
    if by_status["fail"]:
        r, e = by_status["fail"][0]
        kind = str(e.get("kind", KIND_ERROR))
        reason = f"rank {r}, step {e.get('step')}: {e.get('error', 'failed')}"
        return SmokeOutcome(b, "fail", kind, reason, False, **common)

    codes = list((supervisor or {}).get("returncodes", []))
    killed = set((supervisor or {}).get("killed", []))
    reached = any(_reached_backend(ev) for ev in ranks)
    for r, code in enumerate(codes):
        if isinstance(code, int) and code < 0 and r not in killed:
            events = ranks[r] if r < len(ranks) else []
            step = _current_step(events)
            reason = f"rank {r} died with {_signal_name(code)} during {step} (contained in its process group)"
            if code == -signal.SIGKILL:
                why = UNTESTED_WHY[KIND_INFRASTRUCTURE]
                reason += f": killed from outside the test (the kernel's OOM killer sends SIGKILL); {why}"
                return SmokeOutcome(b, "skipped", KIND_INFRASTRUCTURE, reason, True, **common)
            if not _reached_backend(events):
                reason += f"; {UNTESTED_WHY[KIND_STARTUP]}, the backend was not tested"
                return SmokeOutcome(b, "skipped", KIND_STARTUP, reason, True, **common)
            return SmokeOutcome(b, "fail", KIND_CRASH, reason, False, **common)
    if supervisor is None and child.signal_name is not None:
        reason = f"the test supervisor died with {child.signal_name}"
        if child.returncode == -signal.SIGKILL or not reached:
            kind = KIND_INFRASTRUCTURE if child.returncode == -signal.SIGKILL else KIND_STARTUP
            return SmokeOutcome(b, "skipped", kind, f"{reason}; the backend was not tested", True, **common)
        return SmokeOutcome(b, "fail", KIND_CRASH, reason, False, **common)

    if len(ranks) == request.ranks and all(_last(ev, "done") is not None for ev in ranks):
        return SmokeOutcome(b, "pass", KIND_OK, "", False, **common)

    details = []
    for r, events in enumerate(ranks):
        if _last(events, "done") is None:
            code = codes[r] if r < len(codes) else None
            details.append(f"rank {r} exited with {code} during {_current_step(events)}")
    tail = child.stderr_tail(4)
    reason = "; ".join(details) or f"the test supervisor exited with {child.returncode}"
    unfinished = [ev for ev in ranks if _last(ev, "done") is None]
    if not any(_reached_backend(ev) for ev in unfinished):
        kind = KIND_INFRASTRUCTURE if infrastructure_error(child.stderr_tail(40)) else KIND_STARTUP
        reason += f": {UNTESTED_WHY[kind]}; the backend was not tested"
        if tail:
            reason += f" | {tail}"
        return SmokeOutcome(b, "skipped", kind, reason, True, **common)
    if tail:
        reason += f" | {tail}"
    return SmokeOutcome(b, "fail", KIND_ERROR, reason, False, **common)
