"""One probe: inventory, multicast capability, host policy, smoke tests, verdict, report.

Shared by ``fiar-agent probe`` (one shot, no Kubernetes) and the daemon. Every step that can fail
degrades to a reason in the report; nothing here raises for a broken host.

Which GPUs a test uses: one rank per GPU, the first N GPUs in NVML order, where N is the largest
world size the backend supports (its row in ``node_agent.backends``) not above the GPU count (or
``--gpus``).

Idle guard: a test runs only when no compute process uses the GPUs under test, unless forced.
When the GPUs are busy and an earlier report for the same driver and GPUs holds a conclusive
result, that result is kept (the report says from when), so a busy node keeps its verified labels.

Prebuilt kernels: with ``require_prebuilt`` and ``FLASHINFER_CUDA_ARCH_LIST`` set, a GPU whose
compute capability no entry of the list covers (``9.0a``: exactly SM 9.0; ``10.0``/``10.0f``: SM
10.0 and later 10.x) is not tested: the test is skipped (degraded, kind ``not_prebuilt``), as its
kernels were never built for it.

No conclusive test: the verdict is never ``none`` (docs/DESIGN.md#verdict-none; ``verdict`` applies it).

Shared GPU (``shared_gpu``, ``fiar-agent probe --shared-gpu``; test hosts only, never the daemon): the
backends that need no multicast are tested with two ranks on the first GPU (a gloo group), so the
two-rank kernels run on a one-GPU machine. The ranks take turns on the GPU: the test proves the
kernels right and times nothing, and its verdict writes no label (``verdict.correctness_only``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import fiar_contract as contract
from node_agent import backends
from node_agent import report as report_mod
from node_agent.errors import ConfigError, HardwareError
from node_agent.hardware import Hardware
from node_agent.inventory import COMM_KERNEL_GENERATIONS, Gpu, Inventory, has_comm_kernels
from node_agent.policy import HostPolicy, resolve
from node_agent.smoke import launcher
from node_agent.smoke.outcome import SHARED_GPU_MARK, SmokeOutcome, SmokeRequest
from node_agent.verdict import DEFAULT_BENCH_MARGIN, Verdict, correctness_only, decide

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ProbeConfig:
    forbid_multicast: bool = False
    """Treat the host as forbidding multicast, whatever its environment says."""
    force: bool = False
    """Run smoke tests even when compute processes use the GPUs."""
    timeout_s: float = 900.0
    """Hard timeout of one smoke test, cold JIT included (a cold trtllm build takes minutes)."""
    inventory_timeout_s: float = 60.0
    gpus: int | None = None
    """Ranks to test (a power of two, 2..64); default: as many GPUs as the backend supports."""
    benchmark: bool = True
    """Benchmark passing backends against NCCL allreduce; the verdict then passes over slow ones."""
    bench_margin: float = DEFAULT_BENCH_MARGIN
    require_prebuilt: bool = False
    """Skip a test rather than compile kernels on the critical path."""
    iters: int = 50
    peer_grace_s: float = 10.0
    shared_gpu: bool = False
    """Test hosts only: two ranks share the first GPU; correctness only, no timing, no label."""

    def validate(self) -> None:
        if not self.timeout_s > 0:
            raise ConfigError(f"--timeout must be positive, got {self.timeout_s}")
        if not self.inventory_timeout_s > 0:
            raise ConfigError(f"inventory timeout must be positive, got {self.inventory_timeout_s}")
        if self.gpus is not None and self.gpus not in backends.RANK_COUNTS:
            low, high = backends.RANK_COUNTS[0], backends.RANK_COUNTS[-1]
            raise ConfigError(f"--gpus must be a power of two from {low} to {high}, got {self.gpus}")
        if self.shared_gpu and self.gpus not in (None, 2):
            raise ConfigError(f"--shared-gpu runs 2 ranks on one GPU; --gpus {self.gpus} does not apply")
        if not 0 <= self.bench_margin <= 10:
            raise ConfigError(f"--bench-margin must be between 0 and 10, got {self.bench_margin}")
        if self.iters < 1:
            raise ConfigError(f"--iters must be at least 1, got {self.iters}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ProbeResult:
    report: dict[str, Any]
    """The JSON document (``report.build``): written to the annotation or printed, never read back here."""
    verdict: Verdict
    inventory: Inventory | None
    tests: Mapping[contract.Backend, SmokeOutcome]
    policy: HostPolicy
    hardware: str
    started_at: float
    """Wall-clock time the probe started (the report's ``probe_time``)."""
    duration_s: float

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.verdict.labels)

    @property
    def exit_code(self) -> int:
        """0 ok, 1 degraded (see ``fiar-agent probe --help``)."""
        return 0 if self.verdict.status == "ok" else 1

    def as_previous(self) -> report_mod.PreviousReport:
        """This probe as the next one compares with it (what ``PreviousReport.parse`` reads back from its report)."""
        inv = self.inventory
        return report_mod.PreviousReport(
            probe_time=report_mod.rfc3339(self.started_at),
            fingerprint=inv.fingerprint() if inv is not None else None,
            labels=dict(self.verdict.labels),
            multicast_forbidden=self.policy.multicast_forbidden,
            tests=dict(self.tests),
            labels_kept_from=self.verdict.kept_from,
        )


def world_size(backend: contract.Backend, available: int) -> int | None:
    return backends.spec(backend).world_size(available)


def _covers(entry: str, cc: tuple[int, int]) -> bool | None:
    """Whether one FLASHINFER_CUDA_ARCH_LIST entry has kernels for ``cc``; None if it cannot be read."""
    major_text, _, minor_text = entry.partition(".")
    suffix = minor_text.lstrip("0123456789")
    digits = minor_text[: len(minor_text) - len(suffix)]
    if not major_text.isdigit() or not digits or suffix not in ("", "a", "f"):
        return None
    major, minor = int(major_text), int(digits)
    if suffix == "a":  # architecture-specific code runs on exactly that compute capability
        return cc == (major, minor)
    return cc[0] == major and cc[1] >= minor


def unsupported_generation(gpus: Sequence[Gpu]) -> str | None:
    """Why FlashInfer has no allreduce-fusion kernels for one of ``gpus`` (``COMM_KERNEL_GENERATIONS``),
    or None. On such a GPU neither backend exists: the tests are not applicable, a conclusive ``none``."""
    for g in gpus:
        if g.cc is not None and not has_comm_kernels(g.cc):
            majors = " and ".join(f"{m}.x" for m in COMM_KERNEL_GENERATIONS)
            return (
                f"GPU {g.index} is SM {g.cc_str}: FlashInfer builds its allreduce-fusion kernels for SM {majors} only"
            )
    return None


def arch_mismatch(gpus: Sequence[Gpu], arch_list: str | None) -> str | None:
    """Why ``FLASHINFER_CUDA_ARCH_LIST`` has no kernels for one of ``gpus``, or None (covered, or unknown)."""
    entries = (arch_list or "").split()
    for g in gpus:
        if g.cc is None:
            continue
        covers = [_covers(entry, g.cc) for entry in entries]
        if any(c is not None for c in covers) and not any(covers):
            return (
                f"GPU {g.index} is SM {g.cc_str} but FLASHINFER_CUDA_ARCH_LIST={arch_list!r} builds no kernels "
                "for it and --require-prebuilt forbids compiling"
            )
    return None


def host_policy(hw: Hardware, config: ProbeConfig, environ: Mapping[str, str]) -> HostPolicy:
    environments: list[tuple[str, Mapping[str, str]]] = [("env", environ)]
    if hw.simulated:
        environments.append(("recorded host env", hw.host_environment()))
    return resolve(environments, config.forbid_multicast)


def _plan(
    backend: contract.Backend,
    inv: Inventory | None,
    policy: HostPolicy,
    config: ProbeConfig,
    software: Mapping[str, str | None],
    reuse: Mapping[contract.Backend, SmokeOutcome],
    environ: Mapping[str, str],
) -> SmokeOutcome | tuple[int, ...]:
    """Either the outcome of a test that does not run, or the GPUs to run it on."""
    if inv is None:
        return SmokeOutcome.skipped(backend, "no_inventory", "the GPUs could not be read", degraded=True)
    if backends.spec(backend).needs_multicast and policy.multicast_forbidden:
        return SmokeOutcome.skipped(
            backend,
            "policy",
            f"host policy forbids multicast ({', '.join(policy.sources)}); no multicast object is created",
        )
    n = len(inv.gpus)
    if config.shared_gpu:
        if backends.spec(backend).needs_multicast:
            return SmokeOutcome.skipped(backend, "not_applicable", f"{SHARED_GPU_MARK}: {backend} needs multicast")
        if n < 1:
            return SmokeOutcome.skipped(backend, "not_applicable", "no GPU to share")
        devices: tuple[int, ...] = (min(g.index for g in inv.gpus),) * 2
    elif n < 2:
        return SmokeOutcome.skipped(
            backend, "not_applicable", f"{n} GPU{'s' if n != 1 else ''}; an allreduce needs 2 or more"
        )
    else:
        size = world_size(backend, min(config.gpus or n, n))
        assert size is not None  # n >= 2 and 2 is a world size of every backend
        devices = tuple(sorted(g.index for g in inv.gpus))[:size]
    unsupported = unsupported_generation([g for g in inv.gpus if g.index in devices])
    if unsupported is not None:
        return SmokeOutcome.skipped(backend, "not_applicable", unsupported)
    busy = [f"GPU {g.index}: {g.compute_processes}" for g in inv.gpus if g.index in devices and g.compute_processes]
    if busy and not config.force:
        if backend in reuse:
            return reuse[backend]
        return SmokeOutcome.skipped(
            backend,
            "busy",
            f"GPUs busy (compute processes {', '.join(busy)}); --force tests anyway",
            degraded=True,
        )
    missing = [name for name in ("torch", "flashinfer") if not software.get(name)]
    if missing:
        return SmokeOutcome.skipped(backend, "unavailable", f"{' and '.join(missing)} not installed", degraded=True)
    if config.require_prebuilt:
        mismatch = arch_mismatch([g for g in inv.gpus if g.index in devices], environ.get("FLASHINFER_CUDA_ARCH_LIST"))
        if mismatch is not None:
            return SmokeOutcome.skipped(backend, "not_prebuilt", mismatch, degraded=True)
    return devices


def probe(
    hw: Hardware,
    config: ProbeConfig,
    *,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    heartbeat: Callable[[], None] | None = None,
    previous: report_mod.PreviousReport | None = None,
    node: str | None = None,
    environ: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
) -> ProbeResult:
    """Probe ``hw`` once. ``previous`` is an earlier report whose results may be kept (busy GPUs, no
    conclusive test). ``environ`` is the agent's environment (host policy, FLASHINFER_CUDA_ARCH_LIST).
    ``clock`` gives the wall-clock probe time written into the report."""
    say: Progress = progress or (lambda _line: None)
    started, t0 = clock(), time.monotonic()
    env = os.environ if environ is None else environ
    policy = host_policy(hw, config, env)
    if policy.multicast_forbidden:
        say(f"policy: multicast forbidden ({', '.join(policy.sources)})")

    say("inventory: reading NVML and the CUDA driver (child process)")
    inv: Inventory | None = None
    inventory_error: str | None = None
    try:
        inv = hw.read_inventory(config.inventory_timeout_s)
    except HardwareError as exc:
        inventory_error = f"inventory unavailable: {exc}"
        say(inventory_error)
    software = hw.software_versions()  # after the inventory: a simulated host is re-read there
    if inv is not None:
        models = ", ".join(sorted({g.name for g in inv.gpus})) or "no GPUs"
        say(f"inventory: {len(inv.gpus)} GPU(s) ({models}), driver {inv.driver_version}, CUDA {inv.cuda_driver_str}")
    reuse = report_mod.reusable_tests(previous, inv.fingerprint()) if inv is not None else {}
    fingerprint = inv.fingerprint() if inv is not None else None
    kept = report_mod.previous_verdict(previous, fingerprint, policy.multicast_forbidden)

    tests: dict[contract.Backend, SmokeOutcome] = {}
    for backend in backends.NAMES:  # in order of preference
        if cancel is not None and cancel.is_set():  # stopping: start no new GPU work
            tests[backend] = SmokeOutcome.skipped(backend, "cancelled", "the agent was stopped", degraded=True)
            continue
        plan = _plan(backend, inv, policy, config, software, reuse, env)
        if isinstance(plan, SmokeOutcome):
            tests[backend] = plan
            say(f"{backend}: {plan.result} ({plan.reason})")
            continue
        request = SmokeRequest(
            backend=backend,
            devices=plan,
            timeout_s=config.timeout_s,
            benchmark=config.benchmark and not config.shared_gpu,
            require_prebuilt=config.require_prebuilt,
            iters=config.iters,
            shared_gpu=config.shared_gpu,
        )
        shared = f" ({SHARED_GPU_MARK})" if config.shared_gpu else ""
        say(f"{backend}: smoke test, {len(plan)} ranks on GPUs {list(plan)}{shared}, timeout {config.timeout_s:.0f}s")
        outcome = launcher.run_smoke(
            request,
            hw.smoke_worker(backend),
            policy.child_env(backend),
            cancel=cancel,
            progress=say,
            heartbeat=heartbeat,
            peer_grace_s=config.peer_grace_s,
        )
        tests[backend] = outcome
        say(f"{backend}: {outcome.result}" + (f" ({outcome.reason})" if outcome.reason else ""))

    verdict = decide(
        inv,
        policy,
        tests,
        margin=config.bench_margin,
        inventory_error=inventory_error,
        previous=kept,
        flashinfer=software.get("flashinfer"),
    )
    if config.shared_gpu:
        verdict = correctness_only(verdict)
    duration_s = time.monotonic() - t0
    doc = report_mod.build(
        hardware=hw.description,
        started_at=started,
        duration_s=duration_s,
        inv=inv,
        inventory_error=inventory_error,
        policy=policy,
        tests=tests,
        verdict=verdict,
        software=software,
        config=config.to_dict(),
        node=node,
    )
    return ProbeResult(
        report=doc,
        verdict=verdict,
        inventory=inv,
        tests=tests,
        policy=policy,
        hardware=hw.description,
        started_at=started,
        duration_s=duration_s,
    )
