"""The chart renders the webhooks that ``fiar-operator webhook-config`` prints (the pod and binding
webhooks, and the policy webhook): timeouts, failure policy, side effects, reinvocation and excluded
namespaces come from one module (webhookconfig.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.binaries import render

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fiar"
EXE = str(Path(sys.executable).parent / "fiar-operator")


def without_ca(hooks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for hook in hooks:
        client = {k: v for k, v in hook["clientConfig"].items() if k != "caBundle"}
        out.append({**hook, "clientConfig": client})
    return out


@pytest.mark.parametrize(
    ("values", "cli_args"),
    [
        ({}, []),
        (
            {
                "fullnameOverride": "gpu-fiar",
                "operator.webhook.timeoutSeconds": 1,
                "operator.webhook.excludeNamespaces[0]": "batch",
            },
            ["--timeout-seconds", "1", "--exclude-namespace", "batch"],
        ),
    ],
    ids=["default", "custom"],
)
def test_chart_webhooks_are_the_command_lines_webhooks(
    controlplane_binaries: Any, tmp_path: Path, values: dict[str, Any], cli_args: list[str]
) -> None:
    name = f"{values.get('fullnameOverride', 'fiar')}-operator"
    rendered = render(CHART, values, namespace="gpu-ops")
    kinds = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    chart = {d["kind"]: d for d in rendered if d["kind"] in kinds}
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    proc = subprocess.run(
        [EXE, "webhook-config", "--service", f"gpu-ops/{name}:443", "--ca-file", str(ca), *cli_args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    printed = {d["kind"]: d for d in yaml.safe_load_all(proc.stdout)}
    assert set(printed) == set(kinds)
    for kind in kinds:
        assert without_ca(chart[kind]["webhooks"]) == without_ca(printed[kind]["webhooks"])
