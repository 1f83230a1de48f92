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
``fiar.io/mnnvl``, ``fiar.io/trtllm``
    the smoke-test result: ``pass``, ``fail``, ``timeout`` or ``skipped``.
``fiar.io/gpus``
    the number of GPUs NVML reports (``0`` when NVML cannot be read).
``fiar.io/clique``
    ``<clusterUUID>.<cliqueId>`` when every GPU's fabric is COMPLETED in one clique of a non-zero
    cluster; absent otherwise (single-node NVSwitch fabrics report an all-zero cluster UUID).

The probe is ``degraded`` when a step could not give an answer (no inventory, a timeout, missing
software, busy GPUs, kernels that could not be built or loaded); a backend that fails its test is a
finding, not a degradation.

``none`` needs every backend that could run on the node to have been tried. A probe in which no
backend passed but one could not be tested (skipped as degraded: GPUs busy, torch/FlashInfer
missing, kernels not built, cancelled), or whose GPUs could not be read, claims no verdict: an
untested trtllm may work, and ``none`` would hand the node the fallback (vLLM's ``auto``, which
picks mnnvl). With a ``PreviousVerdict`` (an earlier report of the same driver, GPUs and host
policy that wrote ``fiar.io/backend``; of the same host policy when the GPUs cannot be read now)
its ``backend``, ``multicast``, ``mnnvl`` and ``trtllm`` labels are kept, and also ``gpus`` and
``clique`` when the GPUs cannot be read; without one ``fiar.io/backend`` is left out (absent means
"not probed", not ``none``). The reasons say which.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import fiar_contract as contract
from node_agent import backends
from node_agent.inventory import Inventory
from node_agent.policy import HostPolicy
from node_agent.smoke.outcome import KIND_NULL_MC_PTR, SmokeOutcome

DEFAULT_BENCH_MARGIN = 0.10
"""A backend whose geometric-mean latency is more than 10% above plain NCCL's is not recommended."""

Status = Literal["ok", "degraded"]

VERDICT_LABELS = (contract.LABEL_BACKEND, contract.LABEL_MULTICAST, *contract.RESULT_LABELS)
"""The labels a smoke test decides; ``fiar.io/gpus`` and ``fiar.io/clique`` are read from NVML."""


@dataclass(frozen=True)
class PreviousVerdict:
    """The labels of an earlier report of the same driver, GPUs and host policy, or of the same host
    policy when the GPUs cannot be read now (``report.previous_verdict``)."""

    labels: Mapping[str, str]
    probe_time: str
    hardware: Mapping[str, str] = field(default_factory=dict)
    """``fiar.io/gpus`` and ``fiar.io/clique`` of that report: kept too when the GPUs cannot be read."""


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


def judge_bench(outcome: SmokeOutcome, margin: float) -> BenchJudgement | None:
    """Compare a passing backend with NCCL over its benchmark points (None: not benchmarked)."""
    points = [p for p in outcome.bench if p.nccl_us > 0 and p.backend_us > 0]
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


def multicast_state(inv: Inventory | None, policy: HostPolicy, mnnvl: SmokeOutcome) -> tuple[contract.Multicast, str]:
    if policy.multicast_forbidden:
        return "disabled", f"multicast disabled by host policy ({', '.join(policy.sources)})"
    if inv is None:
        return "unknown", "multicast unknown: the GPUs could not be read"
    if not inv.gpus:
        return "unknown", "multicast unknown: no GPUs"
    attrs = [g.cuda.multicast_supported if g.cuda else None for g in inv.gpus]
    if any(a == 0 for a in attrs):
        zero = [g.index for g, a in zip(inv.gpus, attrs, strict=True) if a == 0]
        return "unsupported", f"multicast unsupported: CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED is 0 on GPU {zero}"
    if inv.multicast_create_exported is False:
        return "unsupported", "multicast unsupported: libcuda does not export cuMulticastCreate (driver < 535)"
    if mnnvl.result == "pass":
        return "supported", "multicast supported: the mnnvl workspace had a multicast pointer and its allreduce passed"
    if mnnvl.kind == KIND_NULL_MC_PTR:
        return (
            "unsupported",
            "multicast unsupported: the device attribute reads 1 but the workspace got no multicast pointer",
        )
    if any(a is None for a in attrs):
        return "unknown", "multicast unknown: the device attribute could not be read"
    return (
        "unknown",
        "multicast unknown: the device attribute reads 1 (necessary, not sufficient) and no mnnvl test proved it",
    )


def decide(
    inv: Inventory | None,
    policy: HostPolicy,
    tests: Mapping[contract.Backend, SmokeOutcome],
    *,
    margin: float = DEFAULT_BENCH_MARGIN,
    inventory_error: str | None = None,
    previous: PreviousVerdict | None = None,
) -> Verdict:
    reasons: list[str] = []
    if inventory_error:
        reasons.append(inventory_error)
    multicast, why = multicast_state(inv, policy, tests[backends.MULTICAST_PROOF])
    reasons.append(why)

    judgements: dict[str, BenchJudgement] = {}
    backend: contract.Verdict = "none"
    for name in backends.NAMES:  # in order of preference
        outcome = tests[name]
        if outcome.result != "pass":
            reasons.append(f"{name} {outcome.result}: {outcome.reason or outcome.kind}")
            continue
        judgement = judge_bench(outcome, margin)
        where = f"{len(outcome.devices)} GPUs" if outcome.devices else "the GPUs"
        passed = f"{name} passed eagerly and under CUDA-graph replay on {where}"
        if outcome.reused_from:
            passed += f" (result kept from the probe at {outcome.reused_from})"
        if judgement is not None:
            judgements[name] = judgement
            ratio = f"{judgement.geomean_ratio:.2f}x NCCL's latency (geometric mean of {judgement.points} sizes)"
            if not judgement.recommended:
                reasons.append(f"{passed}, but is not recommended: {ratio} exceeds 1 + {margin:.2f}")
                continue
            passed += f"; {ratio}"
        else:
            passed += "; not benchmarked against NCCL"
        reasons.append(passed)
        if backend == "none":
            backend = name
    gpus = len(inv.gpus) if inv is not None else 0
    degraded = inv is None or any(t.degraded for t in tests.values())
    # ``none`` needs every backend that could run here to have been tried: a test this probe could
    # not run (kernels not built, torch missing, GPUs busy, cancelled) might have passed.
    untested = [name for name, t in tests.items() if t.result == "skipped" and t.degraded]
    inconclusive = backend == "none" and (inv is None or bool(untested))
    if backend == "none" and not inconclusive:
        if inv is not None and gpus < 2:
            reasons.append(
                f"backend none: {gpus} GPU{'s' if gpus != 1 else ''}, no allreduce between GPUs on this node"
            )
        else:
            reasons.append("backend none: no backend passed its smoke test and benchmark")

    labels = {
        contract.LABEL_BACKEND: backend,
        contract.LABEL_MULTICAST: multicast,
        **{contract.result_label(name): tests[name].result for name in backends.NAMES},
        contract.LABEL_GPUS: str(gpus),
    }
    if inv is not None:
        value = clique(inv)
        if value is not None:
            labels[contract.LABEL_CLIQUE] = value
    verdict: contract.Verdict | None = backend
    kept_from: str | None = None
    if inconclusive and previous is not None:
        for key in VERDICT_LABELS:
            if key in previous.labels:
                labels[key] = previous.labels[key]
        verdict = _verdict_value(labels[contract.LABEL_BACKEND])
        multicast = next((m for m in contract.MULTICAST_STATES if m == labels[contract.LABEL_MULTICAST]), multicast)
        kept_from = previous.probe_time
        same = "same host policy; the GPUs could not be read" if inv is None else "same driver, GPUs and host policy"
        reasons.append(
            f"no backend passed and {_untested(untested, inv)}; the verdict labels of the probe at "
            f"{previous.probe_time} ({same}) are kept"
        )
        if inv is None:
            labels.update(previous.hardware)
    elif inconclusive:
        del labels[contract.LABEL_BACKEND]
        verdict = None
        reasons.append(
            f"no verdict: no backend passed and {_untested(untested, inv)}, and there is no earlier verdict of "
            f"the same driver, GPUs and host policy to keep; {contract.LABEL_BACKEND} is not written (absent "
            "means not probed)"
        )
    return Verdict(
        labels=labels,
        backend=verdict,
        multicast=multicast,
        reasons=tuple(dict.fromkeys(reasons)),
        status="degraded" if degraded else "ok",
        bench=judgements,
        kept_from=kept_from,
    )


def _untested(untested: Sequence[str], inv: Inventory | None) -> str:
    if inv is None:
        return "the GPUs could not be read"
    return f"{' and '.join(untested)} could not be tested"


def _verdict_value(value: str) -> contract.Verdict | None:
    for candidate in contract.BACKEND_VERDICTS:
        if value == candidate:
            return candidate
    return None
