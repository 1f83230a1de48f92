"""The whole decision table: every host fixture's labels x every group shape -> backend, fusion, and the
standalone FlashInfer allreduce (docs/operator.md, "The decision table")."""

from __future__ import annotations

import json
from typing import Any

import pytest

import fiar_contract as contract
from fiar_operator.admission.mutation import injected_entry
from fiar_operator.core.decide import Decision, decide, node_facts, pending
from fiar_operator.core.pods import PodRecord, group_plan, pod_record
from fiar_operator.core.policy import LWS_GROUP_KEY, LWS_SIZE, Policy, parse_policy
from fiar_operator.reconcile.rules import policy_status, review_pod

from .builders import shape_plan

B, MN, T, C = contract.LABEL_BACKEND, contract.LABEL_MNNVL, contract.LABEL_TRTLLM, contract.LABEL_CLIQUE
CLIQUE = "6f1c2b8e-4d3a-4f0e-9b7c-5a1d2e3f4a5b.32766"

# The labels the agent writes for each shipped host fixture (tests/node_agent/pure/test_verdict_over_fixtures.py
# proves them by probing the fixture), plus a node never probed.
FIXTURE_LABELS: dict[str, dict[str, str]] = {
    "h200x2-host": {B: "trtllm", MN: "skipped", T: "pass"},
    "h100x8-nvswitch-healthy": {B: "mnnvl", MN: "pass", T: "pass"},
    "h200nvl-bridge-null-multicast": {B: "none", MN: "fail", T: "pass"},
    "h100x4-pcie-no-nvlink": {B: "none", MN: "fail", T: "fail"},
    "gb200-nvl72-clique": {B: "mnnvl", MN: "pass", T: "pass", C: CLIQUE},
    "h200x2-device": {B: "trtllm", MN: "skipped", T: "pass"},
    "h200x1-device": {B: "none", MN: "skipped", T: "skipped"},
    "unprobed": {},
}

SHAPES = ("single", "group-pinned-imex", "group-pinned-no-imex", "group-unpinned-imex")

# (backend, reason, fusion) per fixture and shape under the default policy (mnnvl, trtllm; fallback auto).
EXPECTED: dict[str, dict[str, tuple[str, str, str]]] = {
    "h200x2-host": {
        "single": ("trtllm", "Verified", "on"),
        "group": ("auto", "MultiNodeNoSharedClique", "off"),
    },
    "h100x8-nvswitch-healthy": {
        "single": ("mnnvl", "Verified", "on"),
        "group": ("auto", "MultiNodeNoSharedClique", "off"),
    },
    # The row: trtllm passed but is slower than NCCL -> fusion off, env trtllm (never auto).
    "h200nvl-bridge-null-multicast": {
        "single": ("trtllm", "NotVerified", "off"),
        "group": ("auto", "MultiNodeNoSharedClique", "off"),
    },
    "h100x4-pcie-no-nvlink": {
        "single": ("auto", "NotVerified", "off"),
        "group": ("auto", "MultiNodeNoSharedClique", "off"),
    },
    "gb200-nvl72-clique": {
        "single": ("mnnvl", "Verified", "on"),
        "group-pinned-imex": ("mnnvl", "Verified", "on"),
        "group-pinned-no-imex": ("auto", "MultiNodeNoImexChannel", "off"),
        "group-unpinned-imex": ("mnnvl", "Verified", "on"),
    },
    "h200x2-device": {
        "single": ("trtllm", "Verified", "on"),
        "group": ("auto", "MultiNodeNoSharedClique", "off"),
    },
    "h200x1-device": {
        "single": ("auto", "NotVerified", "off"),
        "group": ("auto", "MultiNodeNoSharedClique", "off"),
    },
    "unprobed": {"single": ("auto", "NotProbed", "off"), "group": ("auto", "NotProbed", "off")},
}


def policy(**spec: Any) -> Policy:
    return parse_policy({"metadata": {"name": "p"}, "spec": {"podSelector": {}, **spec}})


def expected(fixture: str, shape: str) -> tuple[str, str, str]:
    rows = EXPECTED[fixture]
    return rows.get(shape) or rows["group" if shape.startswith("group") else "single"]


def decided(fixture: str, shape: str, chosen: Policy | None = None) -> Decision:
    labels = FIXTURE_LABELS[fixture]
    # An unpinned group is judged on every node its placement admits: here, the fixture's node alone.
    return decide(chosen or policy(), fixture, labels, shape_plan(shape), {fixture: labels})


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fixture", sorted(FIXTURE_LABELS))
def test_each_fixture_and_group_shape_gets_its_row_of_the_table(fixture: str, shape: str) -> None:
    decision = decided(fixture, shape)
    assert (decision.backend, decision.reason, decision.fusion) == expected(fixture, shape)
    assert decision.flashinfer_allreduce == (decision.fusion == "on")
    notes = decision.annotations()
    assert notes[contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS] == {"on": "null", "off": "false"}[decision.fusion]
    assert notes[contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER] == {"on": "1", "off": "0"}[decision.fusion]
    assert notes[contract.ANNOTATION_POD_BACKEND] in contract.ENV_VALUES, "never an empty or unknown value"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fixture", sorted(FIXTURE_LABELS))
def test_fusion_control_disabled_leaves_the_fusion_on_and_the_backend_as_decided(fixture: str, shape: str) -> None:
    decision = decided(fixture, shape, policy(fusionControl="Disabled"))
    assert (decision.backend, decision.reason) == expected(fixture, shape)[:2]
    assert decision.fusion == "on" and decision.flashinfer_allreduce


def test_the_fusion_runs_exactly_where_the_node_verifies_an_allowed_backend() -> None:
    for fixture in FIXTURE_LABELS:
        for shape in SHAPES:
            decision = decided(fixture, shape)
            assert (decision.fusion == "on") == decision.verified, (fixture, shape)


def test_a_group_never_gets_trtllm_even_where_trtllm_runs() -> None:
    for fixture in FIXTURE_LABELS:
        for shape in SHAPES[1:]:
            assert decided(fixture, shape, policy(fallbackBackend="auto")).backend != "trtllm"


def test_a_policy_that_allows_only_mnnvl_still_hands_trtllm_where_trtllm_ran() -> None:
    decision = decided("h200x2-host", "single", policy(backends=["mnnvl"]))
    assert (decision.backend, decision.reason, decision.fusion) == ("trtllm", "NotVerified", "off")


def test_fallback_trtllm_policy_gets_trtllm_where_nothing_ran() -> None:
    decision = decided("h100x4-pcie-no-nvlink", "single", policy(fallbackBackend="trtllm"))
    assert (decision.backend, decision.fusion) == ("trtllm", "off")


def test_a_pod_not_bound_yet_runs_with_the_fallback_and_the_fusion_off() -> None:
    decision = pending(policy())
    assert (decision.backend, decision.reason, decision.fusion) == ("auto", "Pending", "off")
    assert decision.annotations()[contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER] == "0"
    assert pending(policy(fusionControl="Disabled")).fusion == "on"


def test_gfd_clique_label_counts_and_a_disagreement_counts_as_no_clique() -> None:
    gfd = {B: "mnnvl", T: "pass", contract.LABEL_GFD_CLIQUE: CLIQUE}
    assert node_facts("n", gfd).clique == CLIQUE
    assert node_facts("n", {**gfd, C: CLIQUE}).clique == CLIQUE
    assert node_facts("n", {**gfd, C: "other.1"}).clique is None
    decision = decide(policy(), "n", gfd, shape_plan("group-pinned-imex"), {"n": gfd})
    assert (decision.backend, decision.reason) == ("mnnvl", "Verified")


def lws_pod(claims: list[dict[str, Any]], used: list[str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "w-0",
            "namespace": "ml",
            "labels": {LWS_GROUP_KEY: "abc", contract.LABEL_POD_POLICY: "p"},
            "annotations": {LWS_SIZE: "2"},
        },
        "spec": {
            "resourceClaims": claims,
            "containers": [{"name": "vllm", "resources": {"claims": [{"name": n} for n in used]}}],
        },
    }


@pytest.mark.parametrize(
    ("claims", "used", "spec", "imex"),
    [
        (
            [{"name": "compute-domain-channel", "resourceClaimTemplateName": "cd-1"}],
            ["compute-domain-channel"],
            {},
            True,
        ),
        ([{"name": "mnnvl-claim", "resourceClaimTemplateName": "pcs-0-g"}], ["mnnvl-claim"], {}, True),
        ([{"name": "ch", "resourceClaimTemplateName": "llm-d-imex-channel-0"}], ["ch"], {}, True),
        ([{"name": "gpus", "resourceClaimTemplateName": "h100-gpus"}], ["gpus"], {}, False),
        ([{"name": "imex", "resourceClaimTemplateName": "imex"}], [], {}, False),
        ([], [], {}, False),
        ([], [], {"imexChannel": "Provided"}, True),
        ([{"name": "fabric", "resourceClaimTemplateName": "x"}], ["fabric"], {"imexChannelClaims": ["fab*"]}, True),
    ],
    ids=[
        "dra-guide-name",
        "grove-auto-mnnvl",
        "llm-d-template-name",
        "a-gpu-claim-is-not-a-channel",
        "claim-no-container-uses",
        "no-claim",
        "channel-provided-by-device-plugin",
        "policy-names-the-claim",
    ],
)
def test_a_group_has_an_imex_channel_when_a_container_uses_a_claim_the_policy_names(
    claims: list[dict[str, Any]], used: list[str], spec: dict[str, Any], imex: bool
) -> None:
    plan = group_plan(pod_record(lws_pod(claims, used)), policy(**spec))
    assert plan.multi and plan.imex == bool(imex)


# -- drift of the fusion (reconcile.review_pod) --------------------------------------------------------
def running(annotations: dict[str, str], reads_fusion: bool) -> PodRecord:
    env = [injected_entry(contract.ENV_VAR)]
    if reads_fusion:
        env += [injected_entry(contract.ENV_FUSE_ALLREDUCE_RMS), injected_entry(contract.ENV_ALLREDUCE_USE_FLASHINFER)]
    binding = {"backend": annotations[contract.ANNOTATION_POD_BACKEND], "trigger": "binding", "reason": "Verified"}
    return pod_record(
        {
            "metadata": {
                "name": "p",
                "namespace": "ml",
                "uid": "u",
                "labels": {contract.LABEL_POD_POLICY: "p"},
                "annotations": {**annotations, contract.ANNOTATION_POD_DECISION: json.dumps(binding)},
            },
            "spec": {"nodeName": "n", "containers": [{"name": "vllm", "env": env}]},
            "status": {"phase": "Running"},
        }
    )


def test_a_node_that_now_verifies_trtllm_turns_the_fusion_back_on_with_the_same_backend() -> None:
    record = running(pending(policy()).annotations() | {contract.ANNOTATION_POD_BACKEND: "trtllm"}, True)
    action = review_pod(record, policy(), {"n": {B: "trtllm", T: "pass"}})
    assert action is not None and action.event_reason == "NodeVerdictChanged"
    assert (action.decision.backend, action.decision.fusion, action.decision.previous_fusion) == ("trtllm", "on", "off")
    assert "fusion off -> on" in action.message


def test_a_pod_admitted_before_fiar_controlled_the_fusion_is_not_reannotated_for_it() -> None:
    record = running({contract.ANNOTATION_POD_BACKEND: "trtllm"}, False)
    assert review_pod(record, policy(), {"n": {B: "trtllm", T: "pass"}}) is None


def test_a_missing_fusion_annotation_is_written_again() -> None:
    record = running({contract.ANNOTATION_POD_BACKEND: "trtllm"}, True)
    action = review_pod(record, policy(), {"n": {B: "trtllm", T: "pass"}})
    assert action is not None
    assert action.decision.annotations()[contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS] == "null"


def test_status_counts_pods_with_the_fusion_off_and_pods_whose_command_fiar_cannot_change() -> None:
    off = running(pending(policy()).annotations(), True)
    on = running(decided("h200x2-host", "single").annotations(), True)
    shell = pod_record(
        {
            "metadata": {"name": "s", "namespace": "ml", "labels": {contract.LABEL_POD_POLICY: "p"}},
            "spec": {
                "containers": [{"name": "vllm", "image": "vllm/vllm-openai", "command": ["sh", "-c", "vllm serve"]}]
            },
        }
    )
    status = policy_status(policy(), {}, [off, on, shell], None, "2026-12-01T00:00:00Z")
    assert (status["pods"]["fusionOff"], status["pods"]["fusionUncontrolled"]) == (1, 1)
    disabled = policy_status(policy(fusionControl="Disabled"), {}, [shell], None, "2026-12-01T00:00:00Z")
    assert disabled["pods"]["fusionUncontrolled"] == 0


def test_a_group_pod_answered_from_the_admission_memo_keeps_its_imex_channel_claim() -> None:
    from fiar_operator.state.store import memo_record

    pod = lws_pod([{"name": "mnnvl-claim", "resourceClaimTemplateName": "cd-0"}], ["mnnvl-claim"])
    record = pod_record(pod)
    p = policy()
    assert group_plan(record, p).imex
    assert group_plan(memo_record(record, p.group_key_label), p) == group_plan(record, p)
