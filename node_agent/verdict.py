"""From inventory, host policy and smoke-test outcomes to node labels and reasons. Pure.

Labels (values are exactly those of ``fiar_contract``):

``fiar.io/backend``
    ``mnnvl`` if its smoke test passed, else ``trtllm`` if its test passed, else ``none``; a
    backend whose benchmark is slower than NCCL by more than the margin is passed over (see
    ``judge_bench``). One GPU or none: ``none`` (there is no allreduce between GPUs on the node).
    ``none`` is a finding, so it is only written when the probe is conclusive; see below.
``fiar.io/multicast``
    ``disabled`` when the host policy forbids it (whatever the hardware says); ``unsupported`` when
    ``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`` reads 0 on a GPU, libcuda lacks
    ``cuMulticastCreate``, or the mnnvl workspace came up with a null multicast pointer;
    ``supported`` only when the mnnvl test passed; ``unknown`` otherwise (the attribute is
    necessary, not sufficient).
``fiar.io/multicast-usable``
    whether every consumer of NVLink multicast may use it (``multicast_usable``): ``forbidden`` by the
    host policy; ``unknown`` when the GPUs could not be read; ``absent`` when a GPU's
    ``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`` reads 0 or libcuda lacks ``cuMulticastCreate``;
    ``verified`` when the mnnvl test passed on a complete fabric; ``broken`` when the attribute reads 1
    but the mnnvl test failed, or a GPU's NVLink fabric is not complete (NVSwitch hosts whose fabric
    manager is down: NCCL aborts binding NVLS memory there); ``unknown`` otherwise.
``fiar.io/mnnvl-workspace``
    how an mnnvl workspace ends on this node (``mnnvl_workspace``): ``no-multicast`` when every GPU's
    multicast attribute reads 0 (FlashInfer refuses it before any collective); ``created`` when the
    mnnvl test's workspace step completed; ``failed-on-every-rank`` when it failed on every rank (a
    null multicast pointer or an error); absent otherwise (not tested, a crash or hang in it, or a
    failure on some ranks only). An engine that creates the same workspace meets the same end.
``fiar.io/mnnvl``, ``fiar.io/trtllm``
    the smoke-test result: ``pass``, ``fail``, ``timeout`` or ``skipped``.
``fiar.io/gpus``
    the number of GPUs NVML reports (``0`` when NVML cannot be read).
``fiar.io/clique``
    ``<clusterUUID>.<cliqueId>`` when every GPU's fabric is COMPLETED in one clique of a non-zero
    cluster; absent otherwise (single-node NVSwitch fabrics report an all-zero cluster UUID).
``fiar.io/flashinfer``
    the flashinfer-python version the smoke tests imported (else the installed one): the kernels the
    verdict was made with (``verdict_flashinfer``); absent when not known or not a plain release number.
``fiar.io/compute-capability``
    the CUDA compute capability every GPU shares (``9.0``, ``10.0``); absent when the GPUs differ, a
    GPU's could not be read, or there are none (``compute_capability``).

The probe is ``degraded`` when a step could not give an answer (no inventory, a timeout, missing
software, busy GPUs, kernels that could not be built or loaded); a backend that fails its test is a
finding, not a degradation.

``none`` is written only by a conclusive probe (the rule and its reasons:
docs/DESIGN.md#verdict-none; ``conclude`` applies it). An inconclusive probe claims no verdict. With
a ``PreviousVerdict`` (an earlier report of the same driver, GPUs and host policy that wrote
``fiar.io/backend``; of the same host policy when the GPUs cannot be read now) its ``backend``,
``multicast``, ``mnnvl`` and ``trtllm`` labels are kept, and also ``gpus`` and ``clique`` when the
GPUs cannot be read; without one ``fiar.io/backend`` is left out (absent means "not probed", not
``none``). The reasons say which.

Each rule is one function with typed input and output, and ``decide`` composes them:
``multicast_state`` (``fiar.io/multicast``), ``choose_backend`` (one ``judge_backend`` per backend,
in ``backends.NAMES`` order), ``conclude`` (whether that choice may be written: the ``none`` rule),
``hardware_labels`` (``fiar.io/gpus``, ``fiar.io/clique``), and for an inconclusive probe
``keep_previous`` or ``claim_nothing``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import fiar_contract as contract
from node_agent import backends
from node_agent.inventory import Inventory
from node_agent.policy import HostPolicy
from node_agent.smoke.outcome import SHARED_GPU_MARK, SmokeOutcome

DEFAULT_BENCH_MARGIN = 0.10
"""A backend whose geometric-mean latency is more than 10% above plain NCCL's is not recommended."""

Status = Literal["ok", "degraded"]

VERDICT_LABELS = (
    contract.LABEL_BACKEND,
    contract.LABEL_MULTICAST,
    contract.LABEL_MULTICAST_USABLE,
    contract.LABEL_MNNVL_WORKSPACE,
    contract.LABEL_FLASHINFER,
    *contract.RESULT_LABELS,
)
"""The labels a smoke test decides; ``HARDWARE_LABELS`` are read from NVML."""
HARDWARE_LABELS = (contract.LABEL_GPUS, contract.LABEL_CLIQUE, contract.LABEL_COMPUTE_CAPABILITY)
"""The labels read from NVML: kept from an earlier report, with its verdict, while the GPUs cannot be read."""


@dataclass(frozen=True)
class PreviousVerdict:
    """The labels of an earlier report of the same driver, GPUs and host policy, or of the same host
    policy when the GPUs cannot be read now (``report.previous_verdict``)."""

    labels: Mapping[str, str]
    probe_time: str
    hardware: Mapping[str, str] = field(default_factory=dict)
    """The ``HARDWARE_LABELS`` of that report: kept too when the GPUs cannot be read."""


@dataclass(frozen=True)
class BenchJudgement:
    backend: contract.Backend
    points: int
    geomean_ratio: float
    """Geometric mean over the benchmark points of backend latency / NCCL latency (both eager)."""
    margin: float
    faster_points: int

    @property
    def recommended(self) -> bool:
        return self.geomean_ratio <= 1.0 + self.margin

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": self.points,
            "geomean_ratio_vs_nccl": round(self.geomean_ratio, 3),
            "faster_than_nccl_at": self.faster_points,
            "margin": self.margin,
            "recommended": self.recommended,
        }


@dataclass(frozen=True)
class Verdict:
    labels: dict[str, str]
    backend: contract.Verdict | None
    """None: no smoke test was conclusive and there was no previous verdict to keep."""
    multicast: contract.Multicast
    reasons: tuple[str, ...]
    status: Status
    bench: Mapping[str, BenchJudgement] = field(default_factory=dict)
    kept_from: str | None = None
    """Probe time of the report whose verdict labels were kept (inconclusive probe)."""
    shared_gpu: bool = False
    """Ranks shared a GPU (``SHARED_GPU_MARK``): ``labels`` is empty, and nothing may publish this verdict."""


def judge_bench(outcome: SmokeOutcome, margin: float) -> BenchJudgement | None:
    """Compare a passing backend with NCCL over its benchmark points (None: not benchmarked)."""
    points = [p for p in outcome.measured.bench if p.nccl_us > 0 and p.backend_us > 0]
    if not points:
        return None
    geomean = math.exp(sum(math.log(p.ratio) for p in points) / len(points))
    return BenchJudgement(
        backend=outcome.backend,
        points=len(points),
        geomean_ratio=geomean,
        margin=margin,
        faster_points=sum(1 for p in points if p.ratio < 1.0),
    )


def clique(inv: Inventory) -> str | None:
    """The NVLink clique all GPUs share, or None."""
    fabrics = [g.fabric for g in inv.gpus]
    if not fabrics or any(f is None or not f.completed or not f.has_cluster for f in fabrics):
        return None
    values = {f.clique for f in fabrics if f is not None}
    return values.pop() if len(values) == 1 else None


@dataclass(frozen=True)
class MulticastFinding:
    state: contract.Multicast
    reason: str


def multicast_state(inv: Inventory | None, policy: HostPolicy, mnnvl: SmokeOutcome) -> MulticastFinding:
    """``fiar.io/multicast``: the host policy first, then what the hardware and the mnnvl test showed."""
    if policy.multicast_forbidden:
        return MulticastFinding("disabled", f"multicast disabled by host policy ({', '.join(policy.sources)})")
    if inv is None:
        return MulticastFinding("unknown", "multicast unknown: the GPUs could not be read")
    if not inv.gpus:
        return MulticastFinding("unknown", "multicast unknown: no GPUs")
    attrs = [g.cuda.multicast_supported if g.cuda else None for g in inv.gpus]
    if any(a == 0 for a in attrs):
        zero = [g.index for g, a in zip(inv.gpus, attrs, strict=True) if a == 0]
        return MulticastFinding(
            "unsupported", f"multicast unsupported: CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED is 0 on GPU {zero}"
        )
    if inv.multicast_create_exported is False:
        return MulticastFinding(
            "unsupported", "multicast unsupported: libcuda does not export cuMulticastCreate (driver < 535)"
        )
    if mnnvl.result == "pass":
        return MulticastFinding(
            "supported", "multicast supported: the mnnvl workspace had a multicast pointer and its allreduce passed"
        )
    if mnnvl.kind == "null_mc_ptr":
        return MulticastFinding(
            "unsupported",
            "multicast unsupported: the device attribute reads 1 but the workspace got no multicast pointer",
        )
    if any(a is None for a in attrs):
        return MulticastFinding("unknown", "multicast unknown: the device attribute could not be read")
    return MulticastFinding(
        "unknown",
        "multicast unknown: the device attribute reads 1 (necessary, not sufficient) and no mnnvl test proved it",
    )


@dataclass(frozen=True)
class UsableFinding:
    state: contract.MulticastUsable
    reason: str


def _incomplete_fabric(inv: Inventory) -> list[int]:
    """GPUs that report an NVLink fabric (NVSwitch) that is not COMPLETED with status success."""
    return [g.index for g in inv.gpus if g.fabric is not None and not g.fabric.completed]


def multicast_usable(inv: Inventory | None, policy: HostPolicy, mnnvl: SmokeOutcome) -> UsableFinding:
    """``fiar.io/multicast-usable``: what every multicast consumer on the node may count on."""
    if policy.multicast_forbidden:
        return UsableFinding("forbidden", f"multicast forbidden by host policy ({', '.join(policy.sources)})")
    if inv is None or not inv.gpus:
        return UsableFinding("unknown", "multicast usability unknown: the GPUs could not be read")
    zero = [g.index for g in inv.gpus if g.cuda is not None and g.cuda.multicast_supported == 0]
    if zero:
        return UsableFinding("absent", f"multicast absent: CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED is 0 on GPU {zero}")
    if inv.multicast_create_exported is False:
        return UsableFinding("absent", "multicast absent: libcuda does not export cuMulticastCreate (driver < 535)")
    incomplete = _incomplete_fabric(inv)
    if incomplete:
        return UsableFinding(
            "broken",
            f"multicast broken: the NVLink fabric of GPU {incomplete} is not complete (fabric manager or NVSwitch "
            "fault); NCCL's NVLS fails to bind multicast memory on such hosts",
        )
    if mnnvl.result == "pass":
        return UsableFinding("verified", "multicast verified: the mnnvl workspace and its allreduce passed")
    if mnnvl.result == "fail":
        return UsableFinding(
            "broken", f"multicast broken: the GPUs report multicast but the mnnvl test failed ({mnnvl.kind})"
        )
    return UsableFinding("unknown", f"multicast usability unknown: the mnnvl test gave no answer ({mnnvl.result})")


def mnnvl_workspace(inv: Inventory | None, mnnvl: SmokeOutcome) -> contract.MnnvlWorkspace | None:
    """``fiar.io/mnnvl-workspace``: no-multicast (every GPU's attribute reads 0), created (the workspace
    step completed), failed-on-every-rank (every rank failed in it: a null multicast pointer or an
    error), or None."""
    attrs = [g.cuda.multicast_supported if g.cuda else None for g in inv.gpus] if inv is not None else []
    if attrs and all(a == 0 for a in attrs):
        return "no-multicast"
    if mnnvl.result == "pass" or "workspace" in mnnvl.measured.steps:
        return "created"
    failed_in_workspace = mnnvl.result == "fail" and mnnvl.failed_step == "workspace" and mnnvl.failed_on_every_rank
    if failed_in_workspace and mnnvl.kind in ("null_mc_ptr", "error") and all(a == 1 for a in attrs):
        return "failed-on-every-rank"
    return None


@dataclass(frozen=True)
class BackendJudgement:
    """What one backend's smoke test and benchmark say about recommending it."""

    recommended: bool
    reason: str
    bench: BenchJudgement | None = None


def judge_backend(outcome: SmokeOutcome, margin: float) -> BackendJudgement:
    """A backend is recommended when its test passed and it is not slower than NCCL beyond ``margin``."""
    name = outcome.backend
    if outcome.result != "pass":
        return BackendJudgement(False, f"{name} {outcome.result}: {outcome.reason or outcome.kind}")
    judgement = judge_bench(outcome, margin)
    where = f"{len(outcome.devices)} GPUs" if outcome.devices else "the GPUs"
    passed = f"{name} passed eagerly and under CUDA-graph replay on {where}"
    if outcome.reused_from:
        passed += f" (result kept from the probe at {outcome.reused_from})"
    if judgement is None:
        return BackendJudgement(True, passed + "; not benchmarked against NCCL")
    ratio = f"{judgement.geomean_ratio:.2f}x NCCL's latency (geometric mean of {judgement.points} sizes)"
    if not judgement.recommended:
        return BackendJudgement(False, f"{passed}, but is not recommended: {ratio} exceeds 1 + {margin:.2f}", judgement)
    return BackendJudgement(True, f"{passed}; {ratio}", judgement)


@dataclass(frozen=True)
class BackendChoice:
    backend: contract.Verdict
    """The first recommended backend in ``backends.NAMES`` order, else ``none``."""
    reasons: tuple[str, ...]
    bench: Mapping[str, BenchJudgement]


def choose_backend(tests: Mapping[contract.Backend, SmokeOutcome], margin: float) -> BackendChoice:
    """``fiar.io/backend`` before the probe is checked for being conclusive."""
    backend: contract.Verdict = "none"
    reasons: list[str] = []
    bench: dict[str, BenchJudgement] = {}
    for name in backends.NAMES:  # in order of preference
        judged = judge_backend(tests[name], margin)
        reasons.append(judged.reason)
        if judged.bench is not None:
            bench[name] = judged.bench
        if judged.recommended and backend == "none":
            backend = name
    return BackendChoice(backend, tuple(reasons), bench)


@dataclass(frozen=True)
class Conclusion:
    """Whether the probe may write the backend it chose."""

    conclusive: bool
    untested: tuple[str, ...]
    """Backends this probe could not test (skipped as degraded)."""
    reason: str | None = None
    """Why ``none``, when ``none`` is conclusive."""


def conclude(
    inv: Inventory | None, tests: Mapping[contract.Backend, SmokeOutcome], backend: contract.Verdict
) -> Conclusion:
    """``none`` needs every backend that could run here to have been tried: a test this probe could not
    run (kernels not built, torch missing, GPUs busy, cancelled) might have passed, and unreadable GPUs
    say nothing. A backend that passed is conclusive whatever else happened."""
    untested = tuple(name for name, t in tests.items() if t.result == "skipped" and t.degraded)
    if backend != "none":
        return Conclusion(True, untested)
    if inv is None or untested:
        return Conclusion(False, untested)
    gpus = len(inv.gpus)
    if gpus < 2:
        why = f"backend none: {gpus} GPU{'s' if gpus != 1 else ''}, no allreduce between GPUs on this node"
        return Conclusion(True, untested, why)
    return Conclusion(True, untested, "backend none: no backend passed its smoke test and benchmark")


def compute_capability(inv: Inventory) -> str | None:
    """The compute capability every GPU shares, or None (GPUs that differ, one not read, none)."""
    values = {g.cc for g in inv.gpus}
    only = values.pop() if len(values) == 1 else None
    return contract.compute_capability_text(only) if only is not None else None


def hardware_labels(inv: Inventory | None) -> dict[str, str]:
    """``fiar.io/gpus`` (0 when the GPUs cannot be read), ``fiar.io/clique`` where the fabric has one and
    ``fiar.io/compute-capability`` where every GPU shares one."""
    labels = {contract.LABEL_GPUS: str(len(inv.gpus) if inv is not None else 0)}
    for key, value in (
        (contract.LABEL_CLIQUE, clique(inv) if inv is not None else None),
        (contract.LABEL_COMPUTE_CAPABILITY, compute_capability(inv) if inv is not None else None),
    ):
        if value is not None:
            labels[key] = value
    return labels


@dataclass(frozen=True)
class Settled:
    """The labels a probe writes, and the backend and multicast state they say."""

    labels: dict[str, str]
    backend: contract.Verdict | None
    multicast: contract.Multicast
    reason: str | None = None
    kept_from: str | None = None


def keep_previous(found: Settled, inv: Inventory | None, untested: Sequence[str], previous: PreviousVerdict) -> Settled:
    """An inconclusive probe keeps the verdict labels of ``previous`` (and its hardware labels when the
    GPUs cannot be read now)."""
    labels = dict(found.labels)
    for key in VERDICT_LABELS:
        if key in previous.labels:
            labels[key] = previous.labels[key]
    if contract.LABEL_FLASHINFER not in previous.labels:  # the kept verdict's kernels are not known
        labels.pop(contract.LABEL_FLASHINFER, None)
    if inv is None:
        labels.update(previous.hardware)
    multicast = next((m for m in contract.MULTICAST_STATES if m == labels[contract.LABEL_MULTICAST]), found.multicast)
    same = "same host policy; the GPUs could not be read" if inv is None else "same driver, GPUs and host policy"
    reason = (
        f"no backend passed and {_untested(untested, inv)}; the verdict labels of the probe at "
        f"{previous.probe_time} ({same}) are kept"
    )
    return Settled(
        labels, contract.verdict_value(labels[contract.LABEL_BACKEND]), multicast, reason, previous.probe_time
    )


def claim_nothing(found: Settled, inv: Inventory | None, untested: Sequence[str]) -> Settled:
    """An inconclusive probe without a previous verdict leaves ``fiar.io/backend`` out: absent means
    "not probed", ``none`` would be a finding."""
    labels = {k: v for k, v in found.labels.items() if k != contract.LABEL_BACKEND}
    reason = (
        f"no verdict: no backend passed and {_untested(untested, inv)}, and there is no earlier verdict of "
        f"the same driver, GPUs and host policy to keep; {contract.LABEL_BACKEND} is not written (absent "
        "means not probed)"
    )
    return Settled(labels, None, found.multicast, reason)


def verdict_flashinfer(tests: Mapping[contract.Backend, SmokeOutcome], installed: str | None) -> str | None:
    """``fiar.io/flashinfer``: the FlashInfer a smoke test imported (what it ran beats package metadata),
    else the ``installed`` one; None when neither is a plain release number."""
    imported = [t.measured.versions.get("flashinfer") for t in tests.values()]
    for raw in (*imported, installed):
        value = contract.flashinfer_value(raw)
        if value is not None:
            return value
    return None


def decide(
    inv: Inventory | None,
    policy: HostPolicy,
    tests: Mapping[contract.Backend, SmokeOutcome],
    *,
    margin: float = DEFAULT_BENCH_MARGIN,
    inventory_error: str | None = None,
    previous: PreviousVerdict | None = None,
    flashinfer: str | None = None,
) -> Verdict:
    """The labels and reasons of one probe: the rules above, composed."""
    proof = tests[backends.MULTICAST_PROOF]
    multicast = multicast_state(inv, policy, proof)
    usable = multicast_usable(inv, policy, proof)
    workspace = mnnvl_workspace(inv, proof)
    choice = choose_backend(tests, margin)
    conclusion = conclude(inv, tests, choice.backend)
    labels = {
        contract.LABEL_BACKEND: choice.backend,
        contract.LABEL_MULTICAST: multicast.state,
        contract.LABEL_MULTICAST_USABLE: usable.state,
        **({contract.LABEL_MNNVL_WORKSPACE: workspace} if workspace is not None else {}),
        **{contract.result_label(name): tests[name].result for name in backends.NAMES},
        **hardware_labels(inv),
    }
    used = verdict_flashinfer(tests, flashinfer)
    if used is not None:
        labels[contract.LABEL_FLASHINFER] = used
    found = Settled(labels, choice.backend, multicast.state, conclusion.reason)
    if conclusion.conclusive:
        settled = found
    elif previous is not None:
        settled = keep_previous(found, inv, conclusion.untested, previous)
    else:
        settled = claim_nothing(found, inv, conclusion.untested)
    reasons = [*([inventory_error] if inventory_error else []), multicast.reason, usable.reason, *choice.reasons]
    if settled.reason is not None:
        reasons.append(settled.reason)
    degraded = inv is None or any(t.degraded for t in tests.values())
    return Verdict(
        labels=settled.labels,
        backend=settled.backend,
        multicast=settled.multicast,
        reasons=tuple(dict.fromkeys(reasons)),
        status="degraded" if degraded else "ok",
        bench=choice.bench,
        kept_from=settled.kept_from,
    )


def _untested(untested: Sequence[str], inv: Inventory | None) -> str:
    if inv is None:
        return "the GPUs could not be read"
    return f"{' and '.join(untested)} could not be tested"


def correctness_only(verdict: Verdict) -> Verdict:
    """The verdict of a probe whose ranks shared a GPU: its tests prove the kernels right and time
    nothing, so it labels no node. Every label is dropped and the reasons say why first."""
    return dataclasses.replace(
        verdict,
        labels={},
        backend=None,
        bench={},
        kept_from=None,
        reasons=(f"{SHARED_GPU_MARK}: the ranks shared one GPU, so no label is written", *verdict.reasons),
        shared_gpu=True,
    )
