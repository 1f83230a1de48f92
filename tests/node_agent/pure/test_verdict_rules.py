"""The pure verdict: label rules for multicast, backend choice, the NCCL benchmark margin, cliques."""

from __future__ import annotations

import dataclasses

import pytest

import fiar_contract as contract
from node_agent import inventory
from node_agent.policy import HostPolicy
from node_agent.smoke.outcome import BenchPoint, Measurements, SmokeOutcome
from node_agent.verdict import (
    BackendJudgement,
    PreviousVerdict,
    Settled,
    choose_backend,
    claim_nothing,
    clique,
    conclude,
    decide,
    hardware_labels,
    judge_backend,
    judge_bench,
    keep_previous,
    multicast_state,
    verdict_flashinfer,
)

NO_POLICY = HostPolicy(False)
FORBID = HostPolicy(True, ("env NCCL_NVLS_ENABLE=0",))


def gpu(index: int, mc: int | None = 1, fabric: inventory.Fabric | None = None) -> inventory.Gpu:
    return inventory.Gpu(
        index=index,
        name="NVIDIA H200",
        uuid=f"GPU-{index}",
        cc=(9, 0),
        fabric=fabric,
        cuda=inventory.CudaAttributes(multicast_supported=mc),
    )


def inv(*gpus: inventory.Gpu, exported: bool | None = True) -> inventory.Inventory:
    return inventory.Inventory("580.159.04", 13000, gpus, multicast_create_exported=exported)


def passed(backend: contract.Backend, *ratios: float) -> SmokeOutcome:
    bench = tuple(BenchPoint(4096, 2**i, 100.0, 100.0 * r) for i, r in enumerate(ratios))
    return SmokeOutcome(backend, "pass", "ok", devices=(0, 1), measured=Measurements(bench=bench))


def failed(backend: contract.Backend, kind: str = "error") -> SmokeOutcome:
    return SmokeOutcome(backend, "fail", kind, reason="x")


def skipped(backend: contract.Backend, kind: str = "policy", degraded: bool = False) -> SmokeOutcome:
    return SmokeOutcome.skipped(backend, kind, "not run", degraded)


TWO = inv(gpu(0), gpu(1))
ZERO_ATTR = inv(gpu(0), gpu(1, mc=0))
NOT_EXPORTED = inv(gpu(0), gpu(1), exported=False)
ONE = inv(gpu(0))
NONE = inv()
MN_PASS, MN_NULL, MN_ERR, MN_POLICY = passed("mnnvl"), failed("mnnvl", "null_mc_ptr"), failed("mnnvl"), skipped("mnnvl")
MN_HANG = SmokeOutcome("mnnvl", "timeout", "hang", degraded=True)
MN_NA, TR_NA = skipped("mnnvl", "not_applicable"), skipped("trtllm", "not_applicable")
MN_BUSY, TR_BUSY = skipped("mnnvl", "busy", True), skipped("trtllm", "busy", True)
TR_PASS, TR_ERR = passed("trtllm"), failed("trtllm")


@pytest.mark.parametrize(
    ("host", "policy", "mnnvl", "trtllm", "backend", "multicast", "status", "usable", "workspace"),
    [
        (TWO, NO_POLICY, MN_PASS, TR_PASS, "mnnvl", "supported", "ok", "verified", "created"),
        (TWO, NO_POLICY, MN_NULL, TR_PASS, "trtllm", "unsupported", "ok", "broken", None),
        (TWO, NO_POLICY, MN_ERR, TR_PASS, "trtllm", "unknown", "ok", "broken", None),
        (TWO, FORBID, MN_POLICY, TR_PASS, "trtllm", "disabled", "ok", "forbidden", None),
        (TWO, FORBID, MN_POLICY, TR_ERR, "none", "disabled", "ok", "forbidden", None),
        (ZERO_ATTR, NO_POLICY, MN_NULL, TR_PASS, "trtllm", "unsupported", "ok", "absent", None),
        (NOT_EXPORTED, NO_POLICY, MN_ERR, TR_PASS, "trtllm", "unsupported", "ok", "absent", None),
        (TWO, NO_POLICY, MN_HANG, TR_PASS, "trtllm", "unknown", "degraded", "unknown", None),
        (ONE, NO_POLICY, MN_NA, TR_NA, "none", "unknown", "ok", "unknown", None),
        (NONE, NO_POLICY, MN_NA, TR_NA, "none", "unknown", "ok", "unknown", None),
        (
            TWO,
            NO_POLICY,
            MN_BUSY,
            TR_BUSY,
            None,
            "unknown",
            "degraded",
            "unknown",
            None,
        ),  # nothing conclusive: no backend label
        (
            TWO,
            NO_POLICY,
            MN_HANG,
            TR_BUSY,
            None,
            "unknown",
            "degraded",
            "unknown",
            None,
        ),  # trtllm untested: maybe it works
        (TWO, NO_POLICY, MN_HANG, TR_ERR, "none", "unknown", "degraded", "unknown", None),  # a timeout is a finding
    ],
)
def test_labels_follow_the_rules(
    host: inventory.Inventory,
    policy: HostPolicy,
    mnnvl: SmokeOutcome,
    trtllm: SmokeOutcome,
    backend: str | None,
    multicast: str,
    status: str,
    usable: str,
    workspace: str | None,
) -> None:
    verdict = decide(host, policy, {"mnnvl": mnnvl, "trtllm": trtllm})
    expected = {
        contract.LABEL_BACKEND: backend,
        contract.LABEL_MULTICAST: multicast,
        contract.LABEL_MULTICAST_USABLE: usable,
        contract.LABEL_MNNVL_WORKSPACE: workspace,
        contract.LABEL_MNNVL: mnnvl.result,
        contract.LABEL_TRTLLM: trtllm.result,
        contract.LABEL_GPUS: str(len(host.gpus)),
        contract.LABEL_COMPUTE_CAPABILITY: "9.0" if host.gpus else None,
    }
    assert verdict.labels == {k: v for k, v in expected.items() if v is not None}
    assert verdict.backend == backend
    assert verdict.status == status
    assert verdict.reasons, "every verdict says why"


def test_no_inventory_gives_zero_gpus_unknown_multicast_and_degraded() -> None:
    tests = {"mnnvl": skipped("mnnvl", "no_inventory", True), "trtllm": skipped("trtllm", "no_inventory", True)}
    verdict = decide(None, NO_POLICY, tests, inventory_error="inventory unavailable: nvml: not found")
    assert verdict.labels[contract.LABEL_GPUS] == "0"
    assert verdict.labels[contract.LABEL_MULTICAST] == "unknown"
    assert contract.LABEL_BACKEND not in verdict.labels, "unreadable GPUs are not a verified none"
    assert verdict.status == "degraded"
    assert verdict.reasons[0] == "inventory unavailable: nvml: not found"


def test_no_inventory_keeps_the_previous_verdict_with_its_gpu_count() -> None:
    tests = {"mnnvl": skipped("mnnvl", "no_inventory", True), "trtllm": skipped("trtllm", "no_inventory", True)}
    previous = PreviousVerdict(PREVIOUS.labels, PREVIOUS.probe_time, {contract.LABEL_GPUS: "8"})
    verdict = decide(
        None, NO_POLICY, tests, inventory_error="inventory unavailable: nvml: not found", previous=previous
    )
    assert verdict.labels == {**PREVIOUS.labels, contract.LABEL_GPUS: "8"}
    assert verdict.status == "degraded" and verdict.kept_from == PREVIOUS.probe_time
    assert any("the GPUs could not be read" in r and "are kept" in r for r in verdict.reasons)


PREVIOUS = PreviousVerdict(
    {
        contract.LABEL_BACKEND: "trtllm",
        contract.LABEL_MULTICAST: "disabled",
        contract.LABEL_MULTICAST_USABLE: "forbidden",
        contract.LABEL_MNNVL: "skipped",
        contract.LABEL_TRTLLM: "pass",
    },
    "2026-01-02T03:04:05Z",
)
TR_MISSING = skipped("trtllm", "unavailable", True)
TR_JIT = SmokeOutcome.skipped("trtllm", "jit", "kernels could not be built", degraded=True)


@pytest.mark.parametrize("trtllm", [TR_BUSY, TR_MISSING, TR_JIT])
def test_an_inconclusive_probe_claims_no_backend(trtllm: SmokeOutcome) -> None:
    verdict = decide(TWO, FORBID, {"mnnvl": MN_POLICY, "trtllm": trtllm})
    assert contract.LABEL_BACKEND not in verdict.labels
    assert verdict.backend is None
    assert verdict.labels[contract.LABEL_TRTLLM] == "skipped"
    assert verdict.status == "degraded"
    assert verdict.kept_from is None
    assert any(r.startswith("no verdict: no backend passed and trtllm could not be tested") for r in verdict.reasons)
    assert not any(r.startswith("backend none") for r in verdict.reasons)


@pytest.mark.parametrize("trtllm", [TR_BUSY, TR_MISSING, TR_JIT])
@pytest.mark.parametrize("mnnvl", [MN_NULL, MN_ERR, MN_HANG])
def test_a_failed_mnnvl_with_an_untested_trtllm_is_no_verified_none(mnnvl: SmokeOutcome, trtllm: SmokeOutcome) -> None:
    """mnnvl broken, trtllm not runnable this time (say, an image whose kernels do not build): claiming
    none would hand such nodes the fallback, vLLM's auto, which picks the broken mnnvl."""
    fresh = decide(TWO, NO_POLICY, {"mnnvl": mnnvl, "trtllm": trtllm})
    assert contract.LABEL_BACKEND not in fresh.labels and fresh.status == "degraded"
    kept = decide(TWO, NO_POLICY, {"mnnvl": mnnvl, "trtllm": trtllm}, previous=PREVIOUS)
    assert kept.labels[contract.LABEL_BACKEND] == "trtllm" and kept.kept_from == PREVIOUS.probe_time


@pytest.mark.parametrize("trtllm", [TR_BUSY, TR_MISSING, TR_JIT])
def test_an_inconclusive_probe_keeps_the_previous_verdict(trtllm: SmokeOutcome) -> None:
    verdict = decide(TWO, FORBID, {"mnnvl": MN_POLICY, "trtllm": trtllm}, previous=PREVIOUS)
    assert verdict.labels == {**PREVIOUS.labels, contract.LABEL_GPUS: "2", contract.LABEL_COMPUTE_CAPABILITY: "9.0"}
    assert verdict.backend == "trtllm"
    assert verdict.status == "degraded"
    assert verdict.kept_from == PREVIOUS.probe_time
    assert any(PREVIOUS.probe_time in r and "kept" in r for r in verdict.reasons)


@pytest.mark.parametrize(
    ("host", "policy", "mnnvl", "trtllm"),
    [
        (TWO, FORBID, MN_POLICY, TR_ERR),  # the test ran and failed
        (TWO, NO_POLICY, MN_HANG, TR_ERR),  # a timeout is a finding
        (ONE, NO_POLICY, MN_NA, TR_NA),  # one GPU
    ],
)
def test_a_conclusive_none_replaces_the_previous_verdict(
    host: inventory.Inventory, policy: HostPolicy, mnnvl: SmokeOutcome, trtllm: SmokeOutcome
) -> None:
    verdict = decide(host, policy, {"mnnvl": mnnvl, "trtllm": trtllm}, previous=PREVIOUS)
    assert verdict.labels[contract.LABEL_BACKEND] == "none"
    assert verdict.kept_from is None


def test_a_slow_backend_is_a_conclusive_none() -> None:
    verdict = decide(TWO, FORBID, {"mnnvl": MN_POLICY, "trtllm": passed("trtllm", 3.0)}, previous=PREVIOUS)
    assert verdict.labels[contract.LABEL_BACKEND] == "none"
    assert verdict.status == "ok"


def test_policy_wins_over_a_passing_mnnvl_claim() -> None:
    verdict = decide(TWO, FORBID, {"mnnvl": passed("mnnvl"), "trtllm": passed("trtllm")})
    assert verdict.labels[contract.LABEL_MULTICAST] == "disabled"


@pytest.mark.parametrize(
    ("ratios", "geomean", "recommended"),
    [
        ((0.5, 0.8, 1.2), 0.783, True),
        ((1.10, 1.10), 1.10, True),  # exactly at the margin
        ((1.2, 1.2, 0.9), 1.090, True),  # slower at some sizes, within the margin overall
        ((1.3, 1.3, 0.9), 1.150, False),
        ((10.0, 10.0), 10.0, False),
    ],
)
def test_benchmark_margin(ratios: tuple[float, ...], geomean: float, recommended: bool) -> None:
    judgement = judge_bench(passed("trtllm", *ratios), 0.10)
    assert judgement is not None
    assert judgement.geomean_ratio == pytest.approx(geomean, abs=1e-3)
    assert judgement.recommended is recommended
    assert judgement.points == len(ratios)


def test_slow_mnnvl_falls_back_to_a_fast_trtllm() -> None:
    verdict = decide(TWO, NO_POLICY, {"mnnvl": passed("mnnvl", 3.0, 3.0), "trtllm": passed("trtllm", 0.8)})
    assert verdict.backend == "trtllm"
    assert verdict.labels[contract.LABEL_MNNVL] == "pass", "the test result stays what the test showed"
    assert verdict.bench["mnnvl"].recommended is False


def test_unbenchmarked_backend_is_recommended_and_says_so() -> None:
    verdict = decide(TWO, NO_POLICY, {"mnnvl": failed("mnnvl"), "trtllm": passed("trtllm")})
    assert verdict.backend == "trtllm"
    assert any("not benchmarked" in r for r in verdict.reasons)


CLUSTER = "6f1c2b8e4d3a4f0e9b7c5a1d2e3f4a5b"


@pytest.mark.parametrize(
    ("fabrics", "expected"),
    [
        ([inventory.Fabric(3, 0, 7, CLUSTER)] * 2, "6f1c2b8e-4d3a-4f0e-9b7c-5a1d2e3f4a5b.7"),
        ([inventory.Fabric(3, 0, 0, "0" * 32)] * 2, None),  # single-node fabric: all-zero cluster
        ([inventory.Fabric(3, 0, 7, CLUSTER), inventory.Fabric(3, 0, 8, CLUSTER)], None),  # two cliques
        ([inventory.Fabric(2, 0, 7, CLUSTER)] * 2, None),  # still in progress
        ([inventory.Fabric(3, 0, 7, CLUSTER), None], None),
    ],
)
def test_clique_label(fabrics: list[inventory.Fabric | None], expected: str | None) -> None:
    host = inv(*(dataclasses.replace(gpu(i), fabric=f) for i, f in enumerate(fabrics)))
    assert clique(host) == expected
    verdict = decide(host, NO_POLICY, {"mnnvl": passed("mnnvl"), "trtllm": passed("trtllm")})
    assert verdict.labels.get(contract.LABEL_CLIQUE) == expected
    if expected is not None:
        assert len(expected) <= 63, "a label value is at most 63 characters"


# -- each rule on its own --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "policy", "mnnvl", "state", "says"),
    [
        (TWO, FORBID, MN_PASS, "disabled", "host policy (env NCCL_NVLS_ENABLE=0)"),
        (None, NO_POLICY, MN_PASS, "unknown", "could not be read"),
        (NONE, NO_POLICY, MN_NA, "unknown", "no GPUs"),
        (ZERO_ATTR, NO_POLICY, MN_PASS, "unsupported", "is 0 on GPU [1]"),
        (NOT_EXPORTED, NO_POLICY, MN_PASS, "unsupported", "cuMulticastCreate"),
        (TWO, NO_POLICY, MN_PASS, "supported", "allreduce passed"),
        (TWO, NO_POLICY, MN_NULL, "unsupported", "no multicast pointer"),
        (inv(gpu(0), gpu(1, mc=None)), NO_POLICY, MN_ERR, "unknown", "attribute could not be read"),
        (TWO, NO_POLICY, MN_ERR, "unknown", "necessary, not sufficient"),
    ],
)
def test_multicast_state_rule(
    host: inventory.Inventory | None, policy: HostPolicy, mnnvl: SmokeOutcome, state: str, says: str
) -> None:
    finding = multicast_state(host, policy, mnnvl)
    assert finding.state == state
    assert says in finding.reason


def test_a_failed_backend_is_not_recommended_and_says_how_it_ended() -> None:
    judged = judge_backend(SmokeOutcome("trtllm", "fail", "numerics", reason="max error 3.2"), 0.1)
    assert judged == BackendJudgement(False, "trtllm fail: max error 3.2")
    assert judge_backend(SmokeOutcome("trtllm", "timeout", "hang"), 0.1).reason == "trtllm timeout: hang"


def test_a_passed_backend_slower_than_nccl_beyond_the_margin_is_not_recommended() -> None:
    judged = judge_backend(passed("trtllm", 2.0, 2.0), 0.1)
    assert not judged.recommended
    assert judged.bench is not None and judged.bench.geomean_ratio == pytest.approx(2.0)
    assert "not recommended: 2.00x NCCL's latency" in judged.reason


def test_a_kept_result_says_from_which_probe() -> None:
    outcome = dataclasses.replace(passed("trtllm", 0.5), reused_from="2026-01-02T03:04:05Z")
    judged = judge_backend(outcome, 0.1)
    assert judged.recommended
    assert "(result kept from the probe at 2026-01-02T03:04:05Z)" in judged.reason


def test_the_first_recommended_backend_is_chosen_and_every_backend_is_judged() -> None:
    choice = choose_backend({"mnnvl": passed("mnnvl", 0.5), "trtllm": passed("trtllm", 0.4)}, 0.1)
    assert choice.backend == "mnnvl"
    assert set(choice.bench) == {"mnnvl", "trtllm"}
    assert len(choice.reasons) == 2


def test_no_recommended_backend_is_none_before_the_conclusion() -> None:
    assert choose_backend({"mnnvl": MN_BUSY, "trtllm": TR_ERR}, 0.1).backend == "none"


@pytest.mark.parametrize(
    ("host", "tests", "backend", "conclusive", "untested"),
    [
        (TWO, {"mnnvl": MN_BUSY, "trtllm": TR_PASS}, "trtllm", True, ("mnnvl",)),  # a pass is a pass
        (TWO, {"mnnvl": MN_ERR, "trtllm": TR_ERR}, "none", True, ()),
        (TWO, {"mnnvl": MN_HANG, "trtllm": TR_ERR}, "none", True, ()),  # a timeout is a finding
        (TWO, {"mnnvl": MN_ERR, "trtllm": TR_BUSY}, "none", False, ("trtllm",)),
        (None, {"mnnvl": MN_ERR, "trtllm": TR_ERR}, "none", False, ()),  # unreadable GPUs say nothing
        (ONE, {"mnnvl": MN_NA, "trtllm": TR_NA}, "none", True, ()),
    ],
)
def test_none_is_only_concluded_when_every_backend_was_tried(
    host: inventory.Inventory | None,
    tests: dict[contract.Backend, SmokeOutcome],
    backend: contract.Verdict,
    conclusive: bool,
    untested: tuple[str, ...],
) -> None:
    conclusion = conclude(host, tests, backend)
    assert conclusion.conclusive is conclusive
    assert conclusion.untested == untested
    assert (conclusion.reason is not None) is (conclusive and backend == "none")


def test_one_gpu_concludes_none_for_want_of_a_peer() -> None:
    assert conclude(ONE, {"mnnvl": MN_NA, "trtllm": TR_NA}, "none").reason == (
        "backend none: 1 GPU, no allreduce between GPUs on this node"
    )


def test_hardware_labels_count_gpus_and_name_the_clique() -> None:
    fabric = inventory.Fabric(3, 0, 7, CLUSTER)
    host = inv(dataclasses.replace(gpu(0), fabric=fabric), dataclasses.replace(gpu(1), fabric=fabric))
    assert hardware_labels(host) == {
        contract.LABEL_GPUS: "2",
        contract.LABEL_CLIQUE: "6f1c2b8e-4d3a-4f0e-9b7c-5a1d2e3f4a5b.7",
        contract.LABEL_COMPUTE_CAPABILITY: "9.0",
    }
    assert hardware_labels(TWO) == {contract.LABEL_GPUS: "2", contract.LABEL_COMPUTE_CAPABILITY: "9.0"}
    assert hardware_labels(None) == {contract.LABEL_GPUS: "0"}


@pytest.mark.parametrize(
    ("ccs", "label"),
    [
        (((10, 0), (10, 0)), "10.0"),
        (((10, 3),), "10.3"),
        (((9, 0), (10, 0)), None),  # GPUs of two generations: which one a pod gets is not known
        (((9, 0), None), None),  # one GPU's could not be read
        ((), None),
    ],
)
def test_the_compute_capability_is_labelled_only_where_every_gpu_shares_one(
    ccs: tuple[tuple[int, int] | None, ...], label: str | None
) -> None:
    host = inv(*(dataclasses.replace(gpu(i), cc=cc) for i, cc in enumerate(ccs)))
    assert hardware_labels(host).get(contract.LABEL_COMPUTE_CAPABILITY) == label
    assert label is None or contract.compute_capability_value(label) == ccs[0]


FOUND = Settled(
    {
        contract.LABEL_BACKEND: "none",
        contract.LABEL_MULTICAST: "unknown",
        contract.LABEL_MNNVL: "fail",
        contract.LABEL_TRTLLM: "skipped",
        contract.LABEL_GPUS: "0",
    },
    "none",
    "unknown",
)


def test_keeping_a_previous_verdict_takes_its_verdict_labels_only() -> None:
    previous = PreviousVerdict(PREVIOUS.labels, PREVIOUS.probe_time, {contract.LABEL_GPUS: "8"})
    kept = keep_previous(FOUND, TWO, ("trtllm",), previous)
    assert kept.labels == {**PREVIOUS.labels, contract.LABEL_GPUS: "0"}, "the GPUs were read: their count stays"
    assert (kept.backend, kept.multicast, kept.kept_from) == ("trtllm", "disabled", PREVIOUS.probe_time)
    assert kept.reason is not None and kept.reason.startswith("no backend passed and trtllm could not be tested")


def test_keeping_a_previous_verdict_without_gpus_takes_its_hardware_labels_too() -> None:
    previous = PreviousVerdict(
        PREVIOUS.labels, PREVIOUS.probe_time, {contract.LABEL_GPUS: "8", contract.LABEL_CLIQUE: "c.1"}
    )
    kept = keep_previous(FOUND, None, (), previous)
    assert kept.labels[contract.LABEL_GPUS] == "8" and kept.labels[contract.LABEL_CLIQUE] == "c.1"
    assert kept.reason is not None and "(same host policy; the GPUs could not be read)" in kept.reason


def test_a_kept_label_that_is_no_verdict_value_is_no_backend() -> None:
    kept = keep_previous(FOUND, TWO, ("trtllm",), PreviousVerdict({contract.LABEL_BACKEND: "bogus"}, "t"))
    assert kept.backend is None
    assert kept.multicast == "unknown"


def test_claiming_nothing_leaves_the_backend_label_out() -> None:
    settled = claim_nothing(FOUND, TWO, ("mnnvl", "trtllm"))
    assert contract.LABEL_BACKEND not in settled.labels
    assert settled.backend is None and settled.kept_from is None
    assert settled.reason is not None and "mnnvl and trtllm could not be tested" in settled.reason


INCOMPLETE = inventory.Fabric(state=1, status=0, clique_id=0, cluster_uuid="0" * 32)
COMPLETE = inventory.Fabric(state=inventory.FABRIC_STATE_COMPLETED, status=0, clique_id=0, cluster_uuid="0" * 32)
MN_BIND_EVERY_RANK = SmokeOutcome(
    "mnnvl", "fail", "error", reason="rank 0, step workspace: CUDA error 401", failed_step="workspace",
    failed_on_every_rank=True,
)  # fmt: skip
MN_NULL_EVERY_RANK = dataclasses.replace(MN_BIND_EVERY_RANK, kind="null_mc_ptr")
MN_BIND_SOME_RANKS = dataclasses.replace(MN_BIND_EVERY_RANK, failed_on_every_rank=False)
FM_DOWN = inv(gpu(0, fabric=INCOMPLETE), gpu(1, fabric=COMPLETE))
MN_GRAPH_CRASH = SmokeOutcome(
    "mnnvl", "fail", "crash", measured=Measurements(steps={"workspace": 0.1, "eager": 0.1}), failed_step="graph"
)


@pytest.mark.parametrize(
    ("host", "policy", "mnnvl", "usable", "workspace"),
    [
        (inv(gpu(0, fabric=COMPLETE), gpu(1, fabric=COMPLETE)), NO_POLICY, MN_PASS, "verified", "created"),
        # the fabric manager is down: the attribute still reads 1
        (FM_DOWN, NO_POLICY, MN_BIND_EVERY_RANK, "broken", "failed-on-every-rank"),
        (inv(gpu(0, fabric=INCOMPLETE), gpu(1, fabric=INCOMPLETE)), NO_POLICY, MN_PASS, "broken", "created"),
        (TWO, NO_POLICY, MN_NULL_EVERY_RANK, "broken", "failed-on-every-rank"),
        (TWO, NO_POLICY, MN_BIND_SOME_RANKS, "broken", None),  # the other ranks may wait in a barrier
        (TWO, NO_POLICY, MN_GRAPH_CRASH, "broken", "created"),  # the workspace worked; a later step crashed
        (inv(gpu(0, mc=0), gpu(1, mc=0)), NO_POLICY, MN_ERR, "absent", "no-multicast"),
        (ZERO_ATTR, NO_POLICY, MN_ERR, "absent", None),  # one GPU without multicast: not every rank refuses
        (inv(gpu(0, mc=0), gpu(1, mc=0)), FORBID, MN_POLICY, "forbidden", "no-multicast"),
        (TWO, NO_POLICY, MN_HANG, "unknown", None),
    ],
)  # fmt: skip
def test_multicast_usability_and_the_mnnvl_workspace_end_follow_the_rules(
    host: inventory.Inventory, policy: HostPolicy, mnnvl: SmokeOutcome, usable: str, workspace: str | None
) -> None:
    verdict = decide(host, policy, {"mnnvl": mnnvl, "trtllm": TR_PASS})
    assert verdict.labels[contract.LABEL_MULTICAST_USABLE] == usable
    assert verdict.labels.get(contract.LABEL_MNNVL_WORKSPACE) == workspace
    assert any(r.startswith((f"multicast {usable}", "multicast usability")) for r in verdict.reasons)


def test_an_inconclusive_probe_keeps_the_previous_multicast_usability() -> None:
    verdict = decide(TWO, NO_POLICY, {"mnnvl": MN_HANG, "trtllm": TR_BUSY}, previous=PREVIOUS)
    assert verdict.labels[contract.LABEL_MULTICAST_USABLE] == "forbidden"


def _imported(version: str | None) -> SmokeOutcome:
    measured = Measurements(versions={"flashinfer": version} if version else {})
    return SmokeOutcome("trtllm", "pass", "ok", devices=(0, 1), measured=measured)


@pytest.mark.parametrize(
    ("imported", "installed", "label"),
    [
        ("0.7.2.post1", "0.6.13", "0.7.2.post1"),  # what the test ran beats package metadata
        (None, "0.7.2.post1", "0.7.2.post1"),
        (None, "simulated", None),
        ("0.7.2+cu130", None, None),  # not a label value: not known
        (None, None, None),
    ],
)
def test_the_flashinfer_label_names_the_kernels_the_tests_ran(
    imported: str | None, installed: str | None, label: str | None
) -> None:
    tests = {"mnnvl": MN_POLICY, "trtllm": _imported(imported)}
    assert verdict_flashinfer(tests, installed) == label
    assert decide(TWO, FORBID, tests, flashinfer=installed).labels.get(contract.LABEL_FLASHINFER) == label


def test_a_kept_verdict_keeps_the_flashinfer_it_was_made_with_and_no_other() -> None:
    found = Settled({**FOUND.labels, contract.LABEL_FLASHINFER: "0.7.4"}, "none", "unknown")
    assert contract.LABEL_FLASHINFER not in keep_previous(found, TWO, ("trtllm",), PREVIOUS).labels
    made = PreviousVerdict({**PREVIOUS.labels, contract.LABEL_FLASHINFER: "0.7.2.post1"}, PREVIOUS.probe_time)
    assert keep_previous(found, TWO, ("trtllm",), made).labels[contract.LABEL_FLASHINFER] == "0.7.2.post1"
