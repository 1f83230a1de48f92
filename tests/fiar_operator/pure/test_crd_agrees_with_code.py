"""The CRD (one YAML file) and the code read policies the same way; the CLI prints that file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

import fiar_contract as contract
from fiar_operator import crd
from fiar_operator.core.policy import (
    DEFAULT_BACKENDS,
    DEFAULT_IMEX_CLAIMS,
    FUSION_CONTROLS,
    IMEX_CHANNELS,
    LWS_GROUP_KEY,
    MODES,
    MULTI_NODE,
    PLACEMENTS,
    parse_policy,
)


def spec_schema() -> dict[str, Any]:
    version = crd.definition()["spec"]["versions"][0]
    props: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    return props


def test_names_come_from_the_contract() -> None:
    doc = crd.definition()
    assert doc["metadata"]["name"] == f"{contract.PLURAL}.{contract.GROUP}"
    assert doc["spec"]["group"] == contract.GROUP and doc["spec"]["scope"] == "Cluster"
    names = doc["spec"]["names"]
    assert (names["plural"], names["kind"], names["shortNames"]) == (
        contract.PLURAL,
        contract.KIND,
        [contract.SHORT_NAME],
    )
    version = doc["spec"]["versions"][0]
    assert version["name"] == contract.VERSION and version["subresources"] == {"status": {}}


def test_enums_match_the_code() -> None:
    props = spec_schema()
    assert tuple(props["backends"]["items"]["enum"]) == contract.BACKENDS
    assert tuple(props["fallbackBackend"]["enum"]) == contract.ENV_VALUES
    assert tuple(props["placement"]["enum"]) == PLACEMENTS
    assert tuple(props["mode"]["enum"]) == MODES
    assert tuple(props["multiNode"]["enum"]) == MULTI_NODE
    assert tuple(props["fusionControl"]["enum"]) == FUSION_CONTROLS
    assert tuple(props["imexChannel"]["enum"]) == IMEX_CHANNELS


def test_schema_defaults_read_like_code_defaults() -> None:
    props = spec_schema()
    defaulted = {key: value["default"] for key, value in props.items() if "default" in value}
    from_schema = parse_policy({"metadata": {"name": "p"}, "spec": {"podSelector": {}, **defaulted}})
    from_code = parse_policy({"metadata": {"name": "p"}, "spec": {"podSelector": {}}})
    assert from_schema == from_code
    assert tuple(props["backends"]["default"]) == DEFAULT_BACKENDS
    assert props["groupKeyLabel"]["default"] == LWS_GROUP_KEY
    assert tuple(props["imexChannelClaims"]["default"]) == DEFAULT_IMEX_CLAIMS
    assert props["fusionControl"]["default"] == "Enabled" and props["respectExplicitFusion"]["default"] is True


def test_printer_columns_show_mode_backends_node_verdicts_and_pod_outcomes() -> None:
    columns = {c["name"]: c["jsonPath"] for c in crd.definition()["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Mode"] == ".spec.mode" and columns["Backends"] == ".spec.backends"
    verdicts = {f".status.nodes.{v}" for v in contract.BACKEND_VERDICTS}
    assert {columns[v] for v in ("MNNVL", "TRTLLM", "None")} == verdicts
    assert {columns[v] for v in ("Decided", "Fallback", "Stale")} == {
        ".status.pods.decided",
        ".status.pods.fallback",
        ".status.pods.stale",
    }
    assert columns["Fusion-Off"] == ".status.pods.fusionOff"
    assert columns["Fusion-Uncontrolled"] == ".status.pods.fusionUncontrolled"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_cli_prints_the_crd_file() -> None:
    exe = Path(sys.executable).parent / "fiar-operator"
    out = subprocess.run([str(exe), "crd"], capture_output=True, text=True, check=True).stdout
    assert yaml.safe_load(out) == crd.definition()
