"""What a smoke test is asked to do and what came of it: the value types.

Pure (no processes, no torch). ``rules.classify`` makes a ``SmokeOutcome`` of a test's end: its kind
and result from the ordered rules (``node_agent.smoke.rules``), its ``Measurements`` from the
ranks' events (``node_agent.smoke.measure``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeGuard, get_args

import fiar_contract as contract

OutcomeKind = Literal[
    "ok",  # passed
    "null_mc_ptr", "numerics", "error", "crash", "hang",  # the backend failed, or hung
    "unavailable", "policy", "busy", "not_applicable", "not_prebuilt", "cancelled", "no_inventory",  # not run
    "jit", "no_kernel_image", "infrastructure", "startup",  # a failed step that says nothing of the backend
]  # fmt: skip
"""What a smoke test's result is about."""
OUTCOME_KINDS: Final[tuple[OutcomeKind, ...]] = get_args(OutcomeKind)


def is_kind(value: object) -> TypeGuard[OutcomeKind]:
    """Whether ``value`` (read from an event or a report) names an outcome kind."""
    return value in OUTCOME_KINDS


SHARED_GPU_MARK: Final = "shared GPU: correctness only, no timing"
"""How a test whose ranks share a GPU is marked: it proves the kernels right, never a node's labels."""

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
    shared_gpu: bool = False
    """Test hosts only: ``devices`` repeats a GPU, so several ranks share it (a gloo group, no timing;
    ``SHARED_GPU_MARK``). The DaemonSet never asks for it (``DaemonConfig.validate``)."""

    @property
    def ranks(self) -> int:
        return len(self.devices)

    @property
    def visible_devices(self) -> tuple[int, ...]:
        """``CUDA_VISIBLE_DEVICES``: each GPU once, in order (a rank uses ``LOCAL_RANK % device_count``)."""
        return tuple(dict.fromkeys(self.devices))

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
        if self.shared_gpu:
            args.append("--shared-gpu")
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
class Measurements:
    """What the ranks' ``ok`` events measured, merged over ranks (the worst rank counts)."""

    steps: Mapping[str, float] = field(default_factory=dict)
    """Seconds per step, max over ranks; ``jit`` is the kernel build/load, apart from the test."""
    jit: Mapping[str, Any] = field(default_factory=dict)
    numerics: Mapping[str, Any] = field(default_factory=dict)
    latency_us: Mapping[str, float] = field(default_factory=dict)
    bench: tuple[BenchPoint, ...] = ()
    versions: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Measurements:
        return cls(
            steps=dict(d.get("steps", {})),
            jit=dict(d.get("jit", {})),
            numerics=dict(d.get("numerics", {})),
            latency_us=dict(d.get("latency_us", {})),
            bench=tuple(BenchPoint.from_dict(p) for p in d.get("bench", ())),
            versions=dict(d.get("versions", {})),
        )


@dataclass(frozen=True)
class SmokeOutcome:
    backend: contract.Backend
    result: contract.TestResult
    kind: OutcomeKind
    reason: str = ""
    degraded: bool = False
    """The test could not give an answer about the backend (timeout, missing software, busy GPUs)."""
    devices: tuple[int, ...] = ()
    measured: Measurements = field(default_factory=Measurements)
    child_env: Mapping[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    reused_from: str | None = None
    failed_step: str = ""
    """The step a rank reported failing (``fail`` results of a failed step only)."""
    failed_on_every_rank: bool = False
    """Every rank reported failing, in ``failed_step``."""

    @classmethod
    def skipped(cls, backend: contract.Backend, kind: OutcomeKind, reason: str, degraded: bool = False) -> SmokeOutcome:
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
        m = self.measured
        maps = {
            "steps": m.steps,
            "jit": m.jit,
            "numerics": m.numerics,
            "latency_us": m.latency_us,
            "versions": m.versions,
            "child_env": self.child_env,
        }
        d.update({key: dict(value) for key, value in maps.items() if value})
        if m.bench:
            d["bench"] = [p.to_dict() for p in m.bench]
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
        """Raises ``ValueError`` (and the like) for an entry that is not an outcome."""
        result, kind = d.get("result"), d.get("kind")
        if result not in contract.TEST_RESULTS:
            raise ValueError(f"{backend}: result {result!r} is not one of {contract.TEST_RESULTS}")
        if not is_kind(kind):
            raise ValueError(f"{backend}: kind {str(kind)[:40]!r} is not one of {OUTCOME_KINDS}")
        return cls(
            backend=backend,
            result=result,
            kind=kind,
            reason=str(d.get("reason", "")),
            degraded=bool(d.get("degraded", False)),
            devices=tuple(int(x) for x in d.get("devices", ())),
            measured=Measurements.from_dict(d),
            child_env=dict(d.get("child_env", {})),
            duration_s=float(d.get("duration_s", 0.0)),
            reused_from=d.get("reused_from"),
            failed_step=str(d.get("failed_step", "")),
            failed_on_every_rank=bool(d.get("failed_on_every_rank", False)),
        )
