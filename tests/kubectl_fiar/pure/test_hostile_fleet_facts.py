"""What kubectl fiar shows for hostile or broken objects: readable lines, never a traceback or an
escape sequence that reaches the admin's terminal (pure core; the same objects on the real control
plane are in test_plugin_on_the_control_plane.py)."""

from __future__ import annotations

import json
import sys
import unicodedata
from typing import Any

import pytest

import fiar_contract as contract
from kubectl_fiar import model, page, render

NOW = 1_800_000_000.0
STYLE = render.Style()


def node(name: str, labels: dict[str, Any] | None = None, report: Any = None) -> dict[str, Any]:
    annotations = {} if report is None else {contract.ANNOTATION_PROBE_REPORT: report}
    return {
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.present": "true", **(labels or {})},
            "annotations": annotations,
        }
    }


def report(**fields: Any) -> str:
    doc = {"schema": "fiar.io/probe-report", "version": 1, "probe_time": "2027-01-15T08:00:00Z", "status": "ok"}
    doc.update(fields)
    return json.dumps(doc)


HOSTILE_REPORTS = {
    "not JSON": "{not json",
    "deep nesting": "[" * 100_000,
    "over the read limit": "x" * (contract.PROBE_REPORT_MAX_READ_CHARS + 1),
    "a list": "[1, 2]",
    "other version": json.dumps({"schema": "fiar.io/probe-report", "version": 99}),
    "labels a string": report(labels="fiar.io/backend=mnnvl"),
    "huge fields": report(
        reasons=["\x1b[2J\x1b[31mrm -rf /\x07" * 500] * 5000,
        tests={"mnnvl": {"result": ["pass"], "ranks": 1e999, "duration_s": "fast", "reason": {"a": 1}}},
        inventory={"gpus": True, "models": [{"x": 1}] * 1000, "fabric": {"cliques": "abc"}, "multicast_attribute": 7},
        versions=[1, 2],
        policy={"multicast_forbidden": True, "sources": "env"},
        benchmark={"mnnvl": {"geomean_ratio_vs_nccl": float("inf")}},
    ),
}


@pytest.mark.parametrize("what", HOSTILE_REPORTS)
def test_a_broken_probe_report_reads_as_a_reason_and_renders_everywhere(what: str) -> None:
    labels = {contract.LABEL_BACKEND: "trtllm", contract.LABEL_TRTLLM: "pass"}
    view = model.node_record(node("n1", labels, HOSTILE_REPORTS[what]), keep_report=True)
    assert view is not None and view.verdict == "trtllm"
    f = model.fleet([view], [], [], now=NOW)
    texts = [
        render.status_text(f, STYLE, "all namespaces"),
        render.status_text(f, render.Style(wide=True), "all namespaces"),
        render.why_node_text(view, [], NOW, STYLE),
        json.dumps(render.status_json(f, "all")),
        json.dumps(render.why_node_json(view, [], NOW)),
        page.html(f, "all namespaces"),
    ]
    for text in texts:
        assert "\x1b" not in text and "\x07" not in text
        assert len(text) < 200_000
    if what != "huge fields":
        assert view.report_problem is not None
        assert any(a.subject == "n1" and a.kind == "report" for a in f.attention)


def test_label_values_that_are_not_the_contracts_read_as_invalid_never_as_a_verdict() -> None:
    labels = {contract.LABEL_BACKEND: "mnnvl\x1b[0m", contract.LABEL_MULTICAST: "yes", contract.LABEL_GPUS: "9" * 40}
    view = model.node_record(node("forged", labels))
    assert view is not None
    assert (view.verdict, view.multicast, view.gpus, view.results["mnnvl"]) == ("invalid", "invalid", "invalid", "-")
    f = model.fleet([view], [], [], now=NOW)
    assert [a.kind for a in f.attention] == ["invalid", "report"]
    assert "INVALID: invalid verdict label (1)" in render.status_text(f, STYLE, "all namespaces")


def test_a_node_without_labels_or_report_is_unprobed_and_a_plain_node_is_not_shown() -> None:
    assert model.node_record({"metadata": {"name": "cpu-0", "labels": {"kubernetes.io/os": "linux"}}}) is None
    assert model.node_record({}) is None
    assert model.node_record({"metadata": "garbage"}) is None
    view = model.node_record(node("gpu-0"))
    assert view is not None and view.verdict == "unprobed"
    assert view.reason == "no verdict yet: no fiar agent has probed this node"
    assert [a.kind for a in model.fleet([view], [], [], now=NOW).attention] == ["unprobed"]


def test_labels_that_differ_from_the_report_are_pointed_out() -> None:
    rep = report(labels={contract.LABEL_BACKEND: "none", contract.LABEL_TRTLLM: "fail"}, reasons=["backend none: x"])
    view = model.node_record(node("n", {contract.LABEL_BACKEND: "trtllm", contract.LABEL_TRTLLM: "pass"}, rep))
    assert view is not None and view.labels_differ == (contract.LABEL_BACKEND, contract.LABEL_TRTLLM)


def test_an_old_or_degraded_probe_needs_attention() -> None:
    rep = report(
        status="degraded", reasons=["trtllm timeout: the GPUs were busy"], labels={contract.LABEL_BACKEND: "trtllm"}
    )
    view = model.node_record(node("n", {contract.LABEL_BACKEND: "trtllm"}, rep))
    assert view is not None
    f = model.fleet([view], [], [], now=model.parse_time("2027-01-15T16:00:00Z") or 0)
    assert [(a.kind, a.message) for a in f.attention] == [
        ("probe-degraded", "the last probe could not conclude: trtllm timeout: the GPUs were busy"),
        ("probe-old", "last probe 8h ago: is the agent running?"),
    ]


def pod(annotations: dict[str, Any], *, started: str = "2027-01-15T08:00:00Z", env: Any = None) -> dict[str, Any]:
    ref = {"valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{contract.ANNOTATION_POD_BACKEND}']"}}}
    return {
        "metadata": {
            "namespace": "ns",
            "name": "p",
            "labels": {contract.LABEL_POD_POLICY: "vllm"},
            "annotations": annotations,
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "vllm", "env": env if env is not None else [{"name": contract.ENV_VAR, **ref}]}],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "vllm", "state": {"running": {"startedAt": started}}}],
        },
    }


FORGED_DECISIONS = {
    "escape sequences": '{"reason":"\\u001b[2J\\u001b]0;pwned\\u0007","node":"n1","trigger":"binding"}',
    "not JSON": "{{{",
    "deep": "[" * 4000,
    "too long": json.dumps({"reason": "x" * 10_000}),
    "a list": "[]",
    "other node": json.dumps({"node": "elsewhere", "reason": "Verified"}),
}


@pytest.mark.parametrize("what", FORGED_DECISIONS)
def test_forged_pod_annotations_render_as_text(what: str) -> None:
    annotations = {
        contract.ANNOTATION_POD_DECISION: FORGED_DECISIONS[what],
        contract.ANNOTATION_POD_BACKEND: "$(rm -rf /)\x1b[31m",
        contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS: "maybe",
    }
    view = model.pod_record(pod(annotations))
    assert view.backend.startswith("invalid") and view.fusion.startswith("invalid")
    text = render.why_pod_text(view, None, None, NOW, STYLE)
    assert "\x1b" not in text and "\x07" not in text and len(text) < 5000
    f = model.fleet([], [view], [], now=NOW)
    if what != "escape sequences":
        assert [a.kind for a in f.attention] == ["decision"]
    json.dumps(render.why_pod_json(view, None, None, NOW))


def test_a_pod_whose_container_started_before_its_backend_changed_is_stale() -> None:
    decision = {
        "backend": "auto",
        "previous": "trtllm",
        "fusion": "off",
        "previousFusion": "on",
        "trigger": "reconcile",
        "time": "2027-01-15T09:00:00Z",
        "node": "n1",
        "nodeVerdict": "none",
        "reason": "NotVerified",
        "policy": "vllm",
    }
    annotations = {contract.ANNOTATION_POD_DECISION: json.dumps(decision), contract.ANNOTATION_POD_BACKEND: "auto"}
    view = model.pod_record(pod(annotations))
    assert view.stale
    text = render.why_pod_text(view, None, None, NOW, STYLE)
    assert "before its backend changed from trtllm to auto at 2027-01-15T09:00:00Z: still runs with trtllm" in text
    assert not model.pod_record(pod(annotations, started="2027-01-15T09:00:01Z")).stale
    assert model.fleet([], [view], [], now=NOW).stale_pods == ("ns/p",)


@pytest.mark.parametrize(
    ("env", "says"),
    [([], "does not read VLLM_FLASHINFER_ALLREDUCE_BACKEND"), ([{"name": contract.ENV_VAR, "value": "mnnvl"}], "sets")],
)
def test_how_each_container_reads_the_backend_is_said(env: Any, says: str) -> None:
    view = model.pod_record(pod({}, env=env))
    assert _container_line(view).startswith(says)


def _container_line(view: model.PodView) -> str:
    return render.why_pod_text(view, None, None, NOW, STYLE).split("Containers\n")[1].split("  ", 2)[2]


def test_policy_status_of_any_shape_renders() -> None:
    for status in (
        {},
        {"pods": "many"},
        {"pods": {"decided": True, "guarded": 3, "x" * 100: 1}},
        {"conditions": [1, None]},
    ):
        view = model.policy_record({"metadata": {"name": "p"}, "spec": {"backends": "mnnvl"}, "status": status})
        assert "decided" not in view.pods
        render.status_text(model.fleet([], [], [view], now=NOW), STYLE, "all namespaces")
    assert model.policy_record({"status": {"pods": {"guarded": 3}}}).pods == {"guarded": 3}


def test_ages_read_as_kubectl_writes_them() -> None:
    assert [model.age(s) for s in (None, -5, 59, 60, 119 * 60, 2 * 3600, 47 * 3600, 2 * 86400)] == [
        "-",
        "0s",
        "59s",
        "1m",
        "119m",
        "2h",
        "47h",
        "2d",
    ]


def test_a_condition_that_disagrees_with_the_verdict_label_needs_attention() -> None:
    def with_condition(status: str) -> dict[str, Any]:
        doc = node("n", {contract.LABEL_BACKEND: "trtllm"}, report(labels={contract.LABEL_BACKEND: "trtllm"}))
        doc["status"] = {"conditions": [{"type": contract.CONDITION_VERIFIED, "status": status, "reason": "R"}]}
        return doc

    agrees, differs = model.node_record(with_condition("True")), model.node_record(with_condition("False"))
    assert agrees is not None and differs is not None
    assert (agrees.condition, agrees.condition_differs, differs.condition_differs) == ("True (R)", False, True)
    assert [a.kind for a in model.fleet([agrees], [], [], now=NOW).attention] == []
    assert [a.message for a in model.fleet([differs], [], [], now=NOW).attention] == [
        f"condition {contract.CONDITION_VERIFIED} False (R) disagrees with verdict trtllm"
    ]


def test_no_control_format_or_bidi_character_survives_cleaning() -> None:
    """Every code point of categories Cc, Cf (bidi marks, embeddings, overrides, isolates, zero-width),
    Zl and Zp becomes a space: a forged value cannot reorder or hide the text around it."""
    hidden = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) in ("Cc", "Cf", "Zl", "Zp")]
    assert "\u200f" in hidden and "\u061c" in hidden and "\u202e" in hidden and "\u2067" in hidden
    for char in hidden:
        assert model.clean(f"a{char}b") == "a b", hex(ord(char))
    assert model.clean("trtllm\u200f\u061c\u200b\ufeffok") == "trtllm ok"
    assert model.clean("наш 節點 ñ") == "наш 節點 ñ"


def test_a_forged_node_name_is_shown_cleaned_where_the_decision_names_another() -> None:
    forged = "n1\u202e\u200f\x1b[2Jevil\u061c"
    annotations = {contract.ANNOTATION_POD_DECISION: json.dumps({"node": "n2", "reason": "Verified"})}
    raw = pod(annotations)
    raw["spec"]["nodeName"] = forged
    view = model.pod_record(raw)
    shown = json.dumps(render.why_pod_json(view, None, None, NOW), ensure_ascii=False)
    shown += render.why_pod_text(view, None, None, NOW, STYLE)
    assert "n1 evil" in shown
    assert not any(unicodedata.category(c) in ("Cc", "Cf") for c in shown.replace("\n", ""))
