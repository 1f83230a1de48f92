"""``fiar-operator run --register-webhooks`` (the local demo's way) registers the webhooks the chart
installs: the same timeouts, failure policy, reinvocation and excluded namespaces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devcluster.binaries import render
from devcluster.cluster import Tier, free_port
from fiar_operator.reconcile import webhookconfig
from fiar_operator.state import kube

pytestmark = pytest.mark.controlplane

CHART = Path(__file__).resolve().parents[3] / "charts" / "fiar"


def test_registered_webhooks_are_the_charts_webhooks(
    private_plane: Any, start_operator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    plane = private_plane(Tier.A)
    monkeypatch.setenv("POD_NAMESPACE", "fiar-system")
    # Only the configuration is compared here: the URL need not be the server's own.
    url = f"https://127.0.0.1:{free_port()}"
    running = start_operator(
        plane,
        "register",
        ("--standalone", "--register-webhooks", url, "--webhook-ca", str(plane.ca_file), "--exclude-namespace", "ml"),
    )
    registered = running.kube.call("GET", f"{kube.MUTATING_CONFIGS}/{webhookconfig.NAME}")
    values = {"operator.webhook.excludeNamespaces[0]": "ml"}
    chart = next(
        d for d in render(CHART, values, namespace="fiar-system") if d["kind"] == "MutatingWebhookConfiguration"
    )
    hooks = {h["name"]: h for h in registered["webhooks"]}
    for expected in chart["webhooks"]:
        got = hooks[expected["name"]]
        assert {k: got[k] for k in expected if k != "clientConfig"} == {
            k: v for k, v in expected.items() if k != "clientConfig"
        }
        assert got["timeoutSeconds"] == webhookconfig.TIMEOUT_SECONDS == 1
    policies = running.kube.call("GET", f"{kube.VALIDATING_CONFIGS}/{webhookconfig.NAME}")
    chart_policies = next(
        d for d in render(CHART, values, namespace="fiar-system") if d["kind"] == "ValidatingWebhookConfiguration"
    )
    (got,) = policies["webhooks"]
    (expected,) = chart_policies["webhooks"]
    assert {k: got[k] for k in expected if k != "clientConfig"} == {
        k: v for k, v in expected.items() if k != "clientConfig"
    }
