"""A GPU node of an architecture fiar ships no image for reads "no agent for arch X", never a bare "unprobed"."""

from __future__ import annotations

from typing import Any

import fiar_contract as contract
from kubectl_fiar import model, render

NOW = 1_800_000_000.0


def gpu_node(name: str, arch: str | None) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.present": "true"}
    if arch is not None:
        labels[contract.LABEL_ARCH] = arch
    return {"metadata": {"name": name, "labels": labels, "annotations": {}}}


def test_a_gpu_node_of_another_arch_is_listed_as_having_no_agent_for_it() -> None:
    views = [model.node_record(gpu_node("power9", "ppc64le")), model.node_record(gpu_node("gb200", "arm64"))]
    f = model.fleet(views, [], [], now=NOW)
    text = render.status_text(f, render.Style(), "cluster")
    power, grace = (v for v in views if v is not None)
    assert power.verdict == grace.verdict == model.UNPROBED
    assert power.reason == "no agent for arch ppc64le: fiar's images exist for amd64, arm64 only"
    assert "no agent for arch ppc64le" in text
    assert grace.reason == "no verdict yet: no fiar agent has probed this node"
    assert [a.subject for a in f.attention if "no agent for arch" in a.message] == ["power9"]


def test_a_hostile_arch_label_is_shown_cleaned_and_bounded() -> None:
    view = model.node_record(gpu_node("odd", "\x1b[31m" + "x" * 500))
    assert view is not None
    assert "\x1b" not in view.reason
    assert len(view.reason) < 120


def test_a_node_without_an_arch_label_is_only_unprobed() -> None:
    view = model.node_record(gpu_node("bare", None))
    assert view is not None and "no agent for arch" not in view.reason
