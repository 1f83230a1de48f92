"""The operator's table of vLLM releases (``releases.OFF_BY_FAILING_MNNVL``) says exactly what
``bench/vllm_fi_ar_check.py`` found when it ran each release's own workspace code on CPU with the one
GPU call stood in (its results are in bench/results/vllm-fi-ar-check/results.json)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from fiar_operator.core import releases

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results" / "vllm-fi-ar-check" / "results.json"
CHECKED: dict[str, Any] = json.loads(RESULTS.read_text())["versions"]


def _mnnvl(version: dict[str, Any]) -> dict[str, str]:
    return {r["case"]: r["outcome"] for r in version["rows"] if r["env"] == "mnnvl"}


def test_every_release_line_in_the_table_was_checked_and_every_checked_one_is_in_it() -> None:
    assert {releases.line_of(v) for v in CHECKED} == set(releases.OFF_BY_FAILING_MNNVL)


@pytest.mark.parametrize("version", sorted(CHECKED))
def test_a_row_holds_a_workspace_end_only_where_mnnvl_turned_every_path_off(version: str) -> None:
    found = CHECKED[version]
    outcome = _mnnvl(found)
    line = releases.line_of(version)
    assert line is not None
    row = releases.OFF_BY_FAILING_MNNVL[line]
    # Without multicast the pinned FlashInfer either raises (a) or hands back a null pointer (b).
    assert ("no-multicast" in row) == (outcome["a"] == "off" and outcome["b"] == "off")
    # A failed bind on every rank (b: a null pointer on a device that reads 1, c: an error) must be
    # remembered: a release that retries repeats the collective multicast setup on every call.
    every_rank = outcome["b"] == "off" and outcome["c"] == "off" and found["facts"]["failure_cached"]
    assert ("failed-on-every-rank" in row) == every_rank
    assert "created" not in row and outcome["e"].startswith("on:"), "a working workspace turns nothing off"
    shared = {c["route"].split(" -> ")[-1] for c in found["callers"] if not c["route"].startswith("own multicast")}
    assert shared <= {"get_fi_ar_workspace", "get_fi_ar_quant_workspace"}, "every shared caller reads a workspace"
    if "get_fi_ar_quant_workspace" in shared:  # 0.34 Qwen3.5 asks for the quant workspace first
        quant = {r["case"]: r.get("quant_direct") for r in found["rows"] if r["env"] == "mnnvl"}
        assert all(quant[case] is None for case in ("a", "b", "c") if outcome[case] == "off")
    own = sorted(c["file"] for c in found["callers"] if c["route"].startswith("own multicast"))
    page = (RESULTS.parents[3] / "docs" / "vllm-flashinfer-paths.md").read_text()
    assert all(Path(f).parent.name in page or f in page for f in own), "model files with their own buffers are named"


def test_the_flashinfer_pin_of_every_checked_release_is_in_the_table() -> None:
    assert {releases.line_of(v): CHECKED[v]["flashinfer_pin"] for v in CHECKED} == dict(releases.FLASHINFER_PINS)


def test_a_known_release_outside_the_qualified_lines_gets_the_fusion_off_even_where_a_backend_is_verified() -> None:
    from fiar_operator.core.decide import decide
    from fiar_operator.core.policy import parse_policy

    policy = parse_policy({"metadata": {"name": "p"}, "spec": {"podSelector": {}}})
    labels = {"fiar.io/backend": "mnnvl", "fiar.io/mnnvl": "pass", "fiar.io/trtllm": "pass"}
    for release, qualified in (("0.34.0", True), ("0.35.0", False), ("0.30.1", False), ("1.0.0", False), (None, None)):
        d = decide(policy, "n1", labels, release=release)
        assert d.release_qualified is qualified
        assert (d.backend, d.fusion) == ("mnnvl", "on" if qualified is not False else "off")
        assert ('"releaseQualified":false' in d.to_json()) is (qualified is False)
        disabled = parse_policy({"metadata": {"name": "p"}, "spec": {"podSelector": {}, "fusionControl": "Disabled"}})
        assert decide(disabled, "n1", labels, release=release).fusion == "on"


# -- the FlashInfer a verdict was made with ----------------------------------------------------------------
QUALIFICATION = RESULTS.parents[1] / "engine-release" / "engine-release-vllm-0.34.0.json"
WHEELS = Path(os.environ.get("FIAR_WHEEL_CACHE", Path.home() / ".cache" / "fiar" / "wheels"))


def test_every_pinned_flashinfer_has_its_comm_digest() -> None:
    assert set(releases.FLASHINFER_PINS.values()) <= set(releases.FLASHINFER_COMM)


def test_the_comm_digest_of_the_newest_pin_is_the_one_its_qualification_read() -> None:
    comm = json.loads(QUALIFICATION.read_text())["flashinfer_comm"]
    assert releases.FLASHINFER_COMM[comm["to"]] == comm["functions_sha256"]
    assert releases.FLASHINFER_COMM[releases.FLASHINFER_PINS[(0, 34)]] == comm["functions_sha256"], "read as 0.7.4"


@pytest.mark.parametrize("version", sorted(set(releases.FLASHINFER_COMM) - {"0.7.3"}))
def test_each_comm_digest_is_what_the_qualification_computes_from_the_wheel(version: str) -> None:
    found = sorted(WHEELS.glob(f"flashinfer_python-{version}-*.whl"))
    if not found:
        pytest.skip(f"flashinfer-python {version} is not in the wheel cache {WHEELS}: pip download it there")
    sys.path.insert(0, str(RESULTS.parents[2]))
    try:
        import engine_release
    finally:
        sys.path.pop(0)
    assert engine_release.comm_diff(found[0], found[0])["functions_sha256"] == releases.FLASHINFER_COMM[version]


@pytest.mark.parametrize(
    ("node", "same"),
    [("0.7.2.post1", True), ("0.7.4", True), ("0.7.0.post1", False), ("0.6.13", False), ("0.9.9", None), (None, None)],
)
def test_the_decision_says_whether_the_pods_flashinfer_has_the_comm_code_of_the_nodes_verdict(
    node: str | None, same: bool | None
) -> None:
    from fiar_operator.core.decide import decide
    from fiar_operator.core.policy import parse_policy

    policy = parse_policy({"metadata": {"name": "p"}, "spec": {"podSelector": {}}})
    labels = {"fiar.io/backend": "trtllm", "fiar.io/trtllm": "pass"}
    if node is not None:
        labels["fiar.io/flashinfer"] = node
    doc = json.loads(decide(policy, "n1", labels, release="0.34.0").to_json())
    assert doc.get("nodeFlashinfer") == node and doc["podFlashinfer"] == "0.7.3"
    assert doc.get("sameFlashinferComm") is same
    assert "podFlashinfer" not in json.loads(decide(policy, "n1", labels, release="0.99.0").to_json())


@pytest.mark.parametrize("raw", ["0.7.2.post1 ", "0.7.2+cu130", "v0.7.2", "simulated", "7", "0." + "1" * 80])
def test_a_flashinfer_label_not_a_plain_release_number_is_not_read(raw: str) -> None:
    from fiar_operator.core.nodefacts import node_facts

    assert node_facts("n", {"fiar.io/flashinfer": raw}).flashinfer is None
