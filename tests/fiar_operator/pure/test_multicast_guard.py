"""The multicast guard: every selected container of a pod reads NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 unless its node verified NVLink
multicast, decided at binding from the node's ``fiar.io/multicast-usable`` (the agent's own labels of
every shipped fixture), for every command form, kept idempotent, and never overwriting a container's
own value."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import fiar_contract as contract
from devcluster.kubelet import container_process
from devcluster.workloads import pod
from fiar_operator.admission.mutation import plan_pod_create
from fiar_operator.core import patches, releases
from fiar_operator.core.decide import GroupPlan, decide, pending
from fiar_operator.core.pods import pod_record, vllm_release
from fiar_operator.core.selectors import ANYWHERE
from fiar_operator.reconcile.rules import not_turned_off, policy_status, review_pod
from node_agent import hardware
from node_agent.probe import ProbeConfig, probe

from .builders import FORMS, SGLANG_FORMS, mutated, policy

GUARD = contract.MULTICAST_GUARD
OFF = {g.env: g.off for g in GUARD}
OWN = {g.env: g.own for g in GUARD}
NOW = "2026-12-02T12:00:00Z"

GROUPS = {
    "single": GroupPlan(),
    "multi-pinned": GroupPlan(multi=True, key="g1", pinned=True, constraint=ANYWHERE, imex=True),
    "multi-unpinned": GroupPlan(multi=True, key="g1", pinned=False, constraint=ANYWHERE, imex=True),
}


def _fixture_labels() -> dict[str, dict[str, str]]:
    found = {}
    for path in sorted(hardware.FIXTURES.glob("*.json")):
        result = probe(hardware.SimulatedHardware(Path(path.stem)), ProbeConfig(timeout_s=60), environ={})
        found[path.stem] = dict(result.labels)
    return found


FIXTURE_LABELS = _fixture_labels()


def with_usable(labels: dict[str, str], state: str | None) -> dict[str, str]:
    out = dict(labels)
    if state is None:
        out.pop(contract.LABEL_MULTICAST_USABLE, None)
    else:
        out[contract.LABEL_MULTICAST_USABLE] = state
    return out


@pytest.mark.parametrize("group", sorted(GROUPS))
@pytest.mark.parametrize("fixture", sorted(FIXTURE_LABELS))
@pytest.mark.parametrize("state", [*contract.MULTICAST_USABLE_STATES, "as-probed", "garbage"])
def test_the_guard_is_off_only_where_the_node_verified_multicast(fixture: str, group: str, state: str) -> None:
    labels = FIXTURE_LABELS[fixture]
    if state != "as-probed":
        labels = with_usable(labels, state)
    decision = decide(policy(), "n1", labels, GROUPS[group], {"n1": labels})
    usable = labels.get(contract.LABEL_MULTICAST_USABLE)
    assert decision.guard is (usable != "verified")
    annotations = decision.annotations()
    wanted = OFF if decision.guard else OWN
    assert {g.env: annotations[g.annotation] for g in GUARD} == wanted
    assert all(
        contract.pod_annotation_value(k, v) == v for k, v in annotations.items() if k in contract.POD_ANNOTATION_VALUES
    )


def test_the_shipped_fixtures_cover_every_multicast_state_but_unknown() -> None:
    seen = {labels[contract.LABEL_MULTICAST_USABLE] for labels in FIXTURE_LABELS.values()}
    assert seen == {"verified", "broken", "absent", "forbidden"}
    down = FIXTURE_LABELS["h100x8-nvswitch-fabric-manager-down"]
    decision = decide(policy(), "n1", down)
    assert (decision.backend, decision.fusion, decision.guard) == ("trtllm", "on", True), (
        "a verified trtllm node whose multicast is broken keeps its fusion and guards NCCL's NVLS"
    )


def test_a_pod_before_binding_and_on_an_unknown_node_is_guarded() -> None:
    assert pending(policy()).guard
    assert decide(policy(), "ghost", None).guard
    assert decide(policy(), "n1", {}).guard, "a node never probed"


def test_an_agent_that_predates_the_label_is_read_from_its_mnnvl_proof() -> None:
    old = {contract.LABEL_BACKEND: "mnnvl", contract.LABEL_MULTICAST: "supported", contract.LABEL_MNNVL: "pass"}
    assert not decide(policy(), "n1", old).guard
    older = {contract.LABEL_BACKEND: "trtllm", contract.LABEL_MULTICAST: "unknown", contract.LABEL_MNNVL: "fail"}
    assert decide(policy(), "n1", older).guard


def test_a_policy_can_turn_the_guard_off() -> None:
    relaxed = policy(multicastGuard="Disabled")
    assert not pending(relaxed).guard
    assert not decide(relaxed, "n1", FIXTURE_LABELS["h100x8-nvswitch-fabric-manager-down"]).guard
    out, _warnings = mutated(pod(FORMS["production-stack"]), relaxed)
    names = [e["name"] for e in out["spec"]["containers"][0]["env"]]
    assert not set(names) & contract.GUARD_ENV, "no guard variable is injected"


def _bound(out: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    decision = decide(policy(), "n1", labels)
    result = copy.deepcopy(out)
    result["metadata"]["annotations"].update(decision.annotations())
    result["spec"]["nodeName"] = "n1"
    return result


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_command_form_reads_the_guard_after_the_kubelets_resolution(form: str) -> None:
    out, _warnings = mutated(pod(FORMS[form]))
    container = out["spec"]["containers"][0]
    names = [e["name"] for e in container["env"]]
    for g in GUARD:
        assert names.count(g.env) == 1
    again = plan_pod_create(out, policy(), {})
    assert not [op for op in again.ops if "/containers/" in op["path"]], "a second pass changes no container"
    for fixture, wanted in (("h100x8-nvswitch-healthy", OWN), ("h100x8-nvswitch-fabric-manager-down", OFF)):
        _argv, env = container_process(_bound(out, FIXTURE_LABELS[fixture]), container)
        assert {k: env[k] for k in OFF} == wanted


def test_before_binding_the_containers_read_the_guard_on() -> None:
    out, _warnings = mutated(pod(FORMS["production-stack"]))
    _argv, env = container_process(out, out["spec"]["containers"][0])
    assert {k: env[k] for k in OFF} == OFF


@pytest.mark.parametrize("variable", sorted(OFF))
@pytest.mark.parametrize("value", ["0", "1"])
def test_a_containers_own_known_value_is_kept_under_respect_explicit_env(variable: str, value: str) -> None:
    guard = next(g for g in GUARD if g.env == variable)
    value = guard.off if value == "1" else guard.own
    container = {**FORMS["production-stack"], "env": [{"name": variable, "value": value}]}
    out, warnings = mutated(pod(container))
    env = out["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == variable] == [{"name": variable, "value": value}]
    assert any(variable in w and "respectExplicitEnv" in w for w in warnings)
    replaced, warnings = mutated(pod(container), policy(respectExplicitEnv=False))
    (entry,) = [e for e in replaced["spec"]["containers"][0]["env"] if e["name"] == variable]
    assert entry["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.annotations['{guard.annotation}']"
    assert any("replaced" in w for w in warnings)


@pytest.mark.parametrize("variable", sorted(OFF))
@pytest.mark.parametrize(
    "entry",
    [
        {"value": ""},
        {"value": "false"},
        {"value": "2"},
        {"valueFrom": {"configMapKeyRef": {"name": "nccl", "key": "nvls"}}},
    ],
    ids=["empty", "false", "two", "from-a-configmap"],
)
@pytest.mark.parametrize("respect", [True, False])
def test_an_odd_value_a_container_sets_is_kept_and_reported_never_overwritten(
    variable: str, entry: dict[str, Any], respect: bool
) -> None:
    if entry == {"value": ""} and variable == "NCCL_NVLS_ENABLE":
        entry = {"value": "yes"}  # "" is NCCL's own "unset", one of the values fiar writes
    own = {"name": variable, **entry}
    container = {**FORMS["production-stack"], "env": [own, {"name": "X", "value": "1"}, copy.deepcopy(own)]}
    out, warnings = mutated(pod(container), policy(respectExplicitEnv=respect))
    env = out["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == variable] == [own, own], "kept as written, none added or removed"
    assert any(variable in w and "not a value fiar knows" in w for w in warnings)
    again = plan_pod_create(out, policy(respectExplicitEnv=respect), {})
    assert not [op for op in again.ops if "/containers/" in op["path"]]


def test_duplicates_of_fiars_own_entries_collapse_to_one() -> None:
    out, _warnings = mutated(pod(FORMS["production-stack"]))
    container = out["spec"]["containers"][0]
    doubled = copy.deepcopy(out)
    doubled["spec"]["containers"][0]["env"] = container["env"] + [e for e in container["env"] if e["name"] in OFF]
    again, _warnings = mutated(doubled)
    names = [e["name"] for e in again["spec"]["containers"][0]["env"]]
    assert all(names.count(v) == 1 for v in OFF)


def test_drift_flips_the_guard_and_the_status_counts_guarded_pods() -> None:
    out, _warnings = mutated(pod({**FORMS["production-stack"], "image": "vllm/vllm-openai:v0.33.0"}))
    down = FIXTURE_LABELS["h100x8-nvswitch-fabric-manager-down"]
    stored = _bound(out, down)
    stored["metadata"]["name"] = "p1"
    stored["metadata"]["labels"] = {contract.LABEL_POD_POLICY: "vllm"}
    record = pod_record(stored)
    assert record.guarded is True
    status = policy_status(policy(), {"n1": down}, [record], None, NOW)
    assert status["pods"]["multicastGuarded"] == 1
    repaired = with_usable(down, "verified")  # the fabric came back; the verdict is still trtllm
    change = review_pod(record, policy(), {"n1": repaired}, now=NOW)
    assert change is not None and not change.decision.guard
    assert "multicast guard on -> off" in change.message
    assert {g.env: change.decision.annotations()[g.annotation] for g in GUARD} == OWN
    after = pod_record(
        patches.apply(
            copy.deepcopy(stored),
            patches.set_map_entries(stored, ("metadata", "annotations"), change.decision.annotations()),
        )
    )
    assert review_pod(after, policy(), {"n1": repaired}, now=NOW) is None, "one change, then steady"
    doc = json.loads(change.decision.to_json())
    assert (doc["guard"], doc["previousGuard"], doc["backend"], doc["previous"]) == (False, True, "trtllm", "trtllm")
    assert contract.runs_an_older_decision(doc, ["2026-12-02T11:00:00Z"]), (
        "a container started before only the guard changed runs the old value"
    )


# -- FlashInfer allreduce paths the fusion switches do not reach ---------------------------------------


@pytest.mark.parametrize(
    ("image", "release"),
    [
        ("vllm/vllm-openai:v0.33.0", "0.33.0"),
        ("docker.io/vllm/vllm-openai:v0.32.1-cu130", "0.32.1"),
        ("registry.local:5000/mirror/vllm-openai:0.27.1", "0.27.1"),
        ("vllm/vllm-openai:latest", None),
        ("vllm/vllm-openai@sha256:" + "0" * 64, None),
        ("lmcache/vllm-openai-lmcache:v0.33.0", None),
        ("nginx:1.27", None),
        (None, None),
    ],
)
def test_the_release_is_read_from_vllms_image_tag_only(image: str | None, release: str | None) -> None:
    assert releases.image_release(image) == release


def test_the_policy_names_the_release_where_the_image_does_not() -> None:
    record = pod_record(pod({**FORMS["production-stack"], "image": "vllm/vllm-openai:v0.32.0"}))
    assert vllm_release(record, policy()) == "0.32.0"
    assert vllm_release(record, policy(vllmRelease="v0.33.0")) == "0.33.0"
    two = pod(FORMS["production-stack"])
    two["spec"]["containers"] = [
        {"name": "a", "image": "vllm/vllm-openai:v0.32.0"},
        {"name": "b", "image": "vllm/vllm-openai:v0.33.0"},
    ]
    assert vllm_release(pod_record(two), policy()) is None, "two releases: not known"
    assert vllm_release(pod_record(two), policy(containers=["b"])) == "0.33.0"


LINES = sorted(releases.OFF_BY_FAILING_MNNVL)


@pytest.mark.parametrize("line", LINES, ids=[f"{a}.{b}" for a, b in LINES])
@pytest.mark.parametrize("workspace", [*contract.MNNVL_WORKSPACE_STATES, None])
@pytest.mark.parametrize("verdict_labels", ["h200nvl-bridge-null-multicast", "h100x4-pcie-no-nvlink"])
def test_on_a_none_node_the_model_level_paths_are_off_exactly_where_the_release_makes_a_failing_workspace_nccl(
    line: tuple[int, int], workspace: str | None, verdict_labels: str
) -> None:
    labels = dict(FIXTURE_LABELS[verdict_labels])
    labels.pop(contract.LABEL_MNNVL_WORKSPACE, None)
    if workspace is not None:
        labels[contract.LABEL_MNNVL_WORKSPACE] = workspace
    release = f"{line[0]}.{line[1]}.0"
    decision = decide(policy(), "n1", labels, release=release)
    assert decision.fusion == "off" and decision.guard
    if workspace in releases.OFF_BY_FAILING_MNNVL[line]:
        assert (decision.backend, decision.off_by, decision.not_turned_off) == ("mnnvl", "failing-mnnvl-workspace", ())
    else:
        assert decision.backend != "mnnvl" and decision.off_by is None
        assert decision.not_turned_off == releases.model_level_callers(release)
    multi = decide(policy(), "n1", labels, GroupPlan(multi=True, key="g", pinned=True, imex=True), {}, release=release)
    assert multi.backend != "mnnvl" and multi.not_turned_off, "a multi-pod group never gets the failing value"


def test_a_release_fiar_did_not_check_gets_todays_decision_and_says_what_stays_on() -> None:
    labels = FIXTURE_LABELS["h200nvl-bridge-null-multicast"]
    for release in (None, "0.30.0", "1.0.0"):
        decision = decide(policy(), "n1", labels, release=release)
        assert (decision.backend, decision.fusion) == ("trtllm", "off")
        assert decision.not_turned_off == (releases.MODEL_LEVEL_OPS,)
    verified = decide(policy(), "n1", FIXTURE_LABELS["h100x8-nvswitch-healthy"], release=None)
    assert verified.not_turned_off == () and verified.fusion == "on"


def test_paths_left_on_are_counted_and_reported_for_pods_that_read_the_fusion() -> None:
    out, _warnings = mutated(pod(FORMS["production-stack"]))
    labels = FIXTURE_LABELS["h200nvl-bridge-null-multicast"]
    stored = copy.deepcopy(out)
    stored["metadata"].update(name="p1", labels={contract.LABEL_POD_POLICY: "vllm"})
    stored["metadata"]["annotations"].update(decide(policy(), "n1", labels).annotations())
    stored["spec"]["nodeName"] = "n1"
    record = pod_record(stored)
    assert not_turned_off(record) == [releases.MODEL_LEVEL_OPS]
    assert policy_status(policy(), {"n1": labels}, [record], None, NOW)["pods"]["flashinferNotTurnedOff"] == 1


# -- SGLang containers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("form", sorted(SGLANG_FORMS))
def test_an_sglang_container_reads_the_guard_but_keeps_its_own_nccl_nvls_setting(form: str) -> None:
    """SGLang sets NCCL_NVLS_ENABLE=0 itself where it is unset (sglang/srt/entrypoints/engine.py,
    0.5.23): an injected "" (NCCL's unset, its auto) would turn that off into on."""
    out, _warnings = mutated(pod(SGLANG_FORMS[form]))
    container = out["spec"]["containers"][0]
    names = [e["name"] for e in container["env"]]
    assert "NCCL_NVLS_ENABLE" not in names
    assert all(names.count(g.env) == 1 for g in GUARD if g.env != "NCCL_NVLS_ENABLE")
    for fixture, wanted in (("h100x8-nvswitch-healthy", OWN), ("h100x8-nvswitch-fabric-manager-down", OFF)):
        _argv, env = container_process(_bound(out, FIXTURE_LABELS[fixture]), container)
        assert {k: env.get(k) for k in OFF if k != "NCCL_NVLS_ENABLE"} == {
            k: v for k, v in wanted.items() if k != "NCCL_NVLS_ENABLE"
        }


@pytest.mark.parametrize("flag", ["--enable-nccl-nvls", "--enable-symm-mem"])
def test_an_sglang_flag_that_forces_nvls_on_is_reported(flag: str) -> None:
    container = copy.deepcopy(SGLANG_FORMS["sglang-k8s-deployment"])
    key = "args" if container.get("args") else "command"
    container[key] = [*container[key], flag]
    _out, warnings = mutated(pod(container))
    assert any(flag in w and "multicast guard cannot keep it off" in w for w in warnings)


def test_the_paths_left_on_are_named_by_model_family_per_release() -> None:
    labels = dict(FIXTURE_LABELS["h200nvl-bridge-null-multicast"])
    labels.pop(contract.LABEL_MNNVL_WORKSPACE, None)  # no workspace end that turns every path off
    v33 = decide(policy(), "n1", labels, release="0.33.0").not_turned_off
    v34 = decide(policy(), "n1", labels, release="0.34.1").not_turned_off
    assert "DeepSeek-V3.2 and GLM-5.x (deepseek_v32)" in v33 and not any("Qwen3.5" in p for p in v33)
    assert any("Qwen3.5" in p for p in v34) and any("Kimi-K3.1" in p for p in v34)
    assert any("DSpark drafter" in p for p in v34) and not any("Mistral" in p for p in v34)
