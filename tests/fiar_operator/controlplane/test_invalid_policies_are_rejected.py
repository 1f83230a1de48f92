"""The API server itself rejects bad FiAllreducePolicy objects, with messages a user can act on."""

from __future__ import annotations

from typing import Any

import pytest

from fiar_operator.core.errors import ApiError
from fiar_operator.state import kube

pytestmark = pytest.mark.controlplane

SELECTOR = {"matchLabels": {"app": "vllm"}}

INVALID = [
    ({"podSelector": SELECTOR, "backends": ["mnnvl", "mnnvl"]}, "lists a backend more than once"),
    ({"podSelector": SELECTOR, "backends": []}, "spec.backends: Invalid value"),
    ({"podSelector": SELECTOR, "backends": ["nccl"]}, 'Unsupported value: "nccl"'),
    ({"podSelector": SELECTOR, "fallbackBackend": "mnnvl"}, "mnnvl is not a fallback"),
    ({"podSelector": SELECTOR, "fallbackBackend": "TRTLLM"}, 'spec.fallbackBackend: Unsupported value: "TRTLLM"'),
    ({"backends": ["trtllm"]}, "spec.podSelector: Required value"),
    ({"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}, "operators In and NotIn need values"),
    (
        {"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}},
        "Exists and DoesNotExist take none",
    ),
    ({"podSelector": {"matchExpressions": [{"key": "app", "operator": "Near"}]}}, 'Unsupported value: "Near"'),
    ({"podSelector": {"matchLabels": {"bad key!": "x"}}}, "matchLabels keys must be label keys"),
    ({"podSelector": {"matchLabels": {"app": "-bad-"}}}, "matchLabels values must be label values"),
    (
        {"podSelector": SELECTOR, "namespaceSelector": {"matchLabels": {"team/": "x"}}},
        "matchLabels keys must be label keys",
    ),
    ({"podSelector": SELECTOR, "mode": "Dry"}, 'spec.mode: Unsupported value: "Dry"'),
    ({"podSelector": SELECTOR, "placement": "Somewhere"}, "spec.placement: Unsupported value"),
    ({"podSelector": SELECTOR, "priority": 5000}, "spec.priority: Invalid value"),
    ({"podSelector": SELECTOR, "containers": ["VLLM"]}, "spec.containers[0]"),
    ({"podSelector": SELECTOR, "containers": []}, "spec.containers"),
    (
        {"podSelector": SELECTOR, "multiNode": "Always", "placement": "VerifiedNodesOnly", "backends": ["trtllm"]},
        "needs mnnvl in spec.backends",
    ),
    ({"podSelector": SELECTOR, "groupKeyLabel": "not a label"}, "groupKeyLabel must be a label key"),
    ({"podSelector": SELECTOR, "fusionControl": "Off"}, 'spec.fusionControl: Unsupported value: "Off"'),
    ({"podSelector": SELECTOR, "imexChannelClaims": []}, "must name at least one claim"),
    ({"podSelector": SELECTOR, "imexChannel": "Maybe"}, 'spec.imexChannel: Unsupported value: "Maybe"'),
]


def _create(client: kube.Kube, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    body = {"apiVersion": "fiar.io/v1alpha1", "kind": "FiAllreducePolicy", "metadata": {"name": name}, "spec": spec}
    created: dict[str, Any] = client.call("POST", kube.POLICIES, body=body)
    return created


@pytest.mark.parametrize(("spec", "message"), INVALID, ids=[m for _, m in INVALID])
def test_invalid_policy_is_rejected_with_a_readable_message(
    crd_c: Any, unique: str, spec: dict[str, Any], message: str
) -> None:
    client = kube.Kube(crd_c.api_client())
    with pytest.raises(ApiError) as err:
        _create(client, f"bad-{unique}", spec)
    assert err.value.status == 422
    assert message in str(err.value)


def test_long_names_are_rejected_because_they_become_label_values(crd_c: Any) -> None:
    client = kube.Kube(crd_c.api_client())
    with pytest.raises(ApiError) as err:
        _create(client, "p" * 64, {"podSelector": SELECTOR})
    assert err.value.status == 422 and "metadata.name" in str(err.value)


def test_valid_policy_is_stored_with_defaults(crd_c: Any, unique: str) -> None:
    client = kube.Kube(crd_c.api_client())
    created = _create(client, f"good-{unique}", {"podSelector": SELECTOR})
    try:
        assert created["spec"] == {
            "podSelector": SELECTOR,
            "namespaceSelector": {},
            "containers": ["*"],
            "backends": ["mnnvl", "trtllm"],
            "fallbackBackend": "auto",
            "placement": "Anywhere",
            "respectExplicitEnv": True,
            "mode": "Enforce",
            "priority": 0,
            "multiNode": "Auto",
            "groupKeyLabel": "leaderworkerset.sigs.k8s.io/group-key",
            "fusionControl": "Enabled",
            "respectExplicitFusion": True,
            "multicastGuard": "Enabled",
            "imexChannel": "Claim",
            "imexChannelClaims": ["mnnvl-claim", "*imex*", "*channel*", "*compute-domain*"],
        }
        by_short_name = client.call("GET", kube.POLICIES)
        assert any(p["metadata"]["name"] == f"good-{unique}" for p in by_short_name["items"])
    finally:
        client.delete(kube.POLICIES, f"good-{unique}")
