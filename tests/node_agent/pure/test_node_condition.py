"""The verdict as the node condition FiarAllreduceVerified: one status per verdict, in step with the labels."""

from __future__ import annotations

import json

import pytest

import fiar_contract as contract
from node_agent.condition import condition

NOW = 1_800_000_000.0


def report(*reasons: str, kept_from: str | None = None) -> str:
    doc: dict[str, object] = {"reasons": list(reasons)}
    if kept_from:
        doc["labels_kept_from"] = kept_from
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("verdict", "status", "reason", "message"),
    [
        ("mnnvl", "True", "BackendVerified", "mnnvl verified: mnnvl passed eagerly on 8 GPUs"),
        ("trtllm", "True", "BackendVerified", "trtllm verified: trtllm passed eagerly on 8 GPUs"),
        ("none", "False", "NoBackendVerified", "backend none: 1 GPU, no allreduce between GPUs on this node"),
        (None, "Unknown", "NotConcluded", "no verdict: backend none: 1 GPU, no allreduce between GPUs on this node"),
        ("bogus", "Unknown", "NotConcluded", "no verdict: backend none: 1 GPU, no allreduce between GPUs on this node"),
    ],
)
def test_each_verdict_has_its_condition(verdict: str | None, status: str, reason: str, message: str) -> None:
    labels = {} if verdict is None else {contract.LABEL_BACKEND: verdict}
    text = report(
        "multicast supported",
        "mnnvl passed eagerly on 8 GPUs",
        "trtllm passed eagerly on 8 GPUs",
        "backend none: 1 GPU, no allreduce between GPUs on this node",
    )
    got = condition(labels, text, NOW)
    assert (got["type"], got["status"], got["reason"], got["message"]) == (
        contract.CONDITION_VERIFIED,
        status,
        reason,
        message,
    )
    assert got["lastHeartbeatTime"] == got["lastTransitionTime"] == "2027-01-15T08:00:00Z"


def test_the_transition_time_moves_only_when_the_status_does() -> None:
    previous = {"status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    same = condition({contract.LABEL_BACKEND: "trtllm"}, report(), NOW, previous)
    assert same["lastTransitionTime"] == "2026-01-01T00:00:00Z" and same["lastHeartbeatTime"] == "2027-01-15T08:00:00Z"
    changed = condition({contract.LABEL_BACKEND: "none"}, report(), NOW, previous)
    assert changed["lastTransitionTime"] == "2027-01-15T08:00:00Z"


def test_the_message_is_one_bounded_line_whatever_the_report() -> None:
    long = condition({contract.LABEL_BACKEND: "none"}, report("backend none: " + "x\n\x1b" * 5000), NOW)
    assert len(long["message"]) <= 300 and "\n" not in long["message"] and "\x1b" not in long["message"]
    for text in ("", "{", "[]", json.dumps({"reasons": "no"})):
        assert condition({}, text, NOW)["message"] == "no verdict: the probe could not conclude"


def test_a_kept_verdict_says_the_last_probe_could_not_conclude() -> None:
    got = condition({contract.LABEL_BACKEND: "trtllm"}, report("trtllm timeout", kept_from="2026-12-01T00:00:00Z"), NOW)
    assert got["status"] == "True"
    assert got["message"].endswith(
        "(verdict kept from the probe of 2026-12-01T00:00:00Z; the last probe could not conclude)"
    )
