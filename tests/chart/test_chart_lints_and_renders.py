"""The chart lints strictly, its schema rejects bad values, and it renders what admins expect."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

import fiar_contract as contract
from devcluster.binaries import helm, kubernetes_version, render, set_args

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fiar"

# Values that switch on every optional part and move settings off their defaults.
CUSTOM_VALUES: dict[str, Any] = {
    "fullnameOverride": "gpu-fiar",
    "operator.replicas": 3,
    "operator.webhook.timeoutSeconds": 2,
    "operator.webhook.excludeNamespaces[0]": "batch",
    "operator.verbose": True,
    "operator.podDisruptionBudget.minAvailable": 2,
    "operator.networkPolicy.webhookFrom[0].ipBlock.cidr": "10.0.0.0/24",
    "agent.runtimeClassName": "nvidia",
    "agent.probe.forbidMulticast": True,
    "agent.probe.benchmark": False,
    "agent.probe.requirePrebuilt": True,
    "agent.probe.intervalSeconds": 3600,
    "agent.env[0].name": "NCCL_NVLS_ENABLE",
    "agent.env[0].value": "0",
    "agent.kernelCacheHostPath": "/var/cache/fiar/flashinfer",
    "defaultPolicy.enabled": True,
    "grafanaDashboard.enabled": True,
    "crds.keep": False,
    "crds.manage": False,
}


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


@pytest.mark.parametrize("values", [{}, CUSTOM_VALUES], ids=["default", "custom"])
def test_chart_lints_strictly(controlplane_binaries: Any, values: dict[str, Any]) -> None:
    proc = helm("lint", "--strict", str(CHART), "--kube-version", kubernetes_version(), *set_args(values))
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"agent.bogus": 1}, "additional properties 'bogus' not allowed"),
        ({"operator.webhook.timeoutSeconds": 5}, "timeoutSeconds"),
        ({"operator.image.pullPolicy": "Sometimes"}, "pullPolicy"),
        ({"defaultPolicy.spec.fallbackBackend": "NCCL"}, "fallbackBackend"),
        ({"operator.readTimeoutSeconds": 0}, "readTimeoutSeconds"),
        ({"agent.simulate": "h200x2-host --force"}, "simulate"),
    ],
    ids=[
        "unknown-key",
        "webhook-timeout-too-long",
        "bad-pull-policy",
        "bad-fallback",
        "zero-read-timeout",
        "simulate-with-flags",
    ],
)
def test_values_schema_rejects_bad_values_with_a_readable_message(
    controlplane_binaries: Any, values: dict[str, Any], message: str
) -> None:
    proc = helm("template", "fiar", str(CHART), "--kube-version", kubernetes_version(), *set_args(values), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_every_value_is_documented() -> None:
    """Each key has a ``# --`` comment, or sits inside a documented key (e.g. resources.requests)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    documented_at: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    undocumented = []
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)(?:- )?([A-Za-z][\w./-]*):(.*)$", line)
        if not match:
            continue
        indent = len(match.group(1))
        while documented_at and documented_at[-1][0] >= indent:
            documented_at.pop()
        block = []
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            block.append(lines[j].strip())
            j -= 1
        documented = any(c.startswith("# --") for c in block) or any(d for _, d in documented_at)
        if match.group(3).strip() and not documented:
            undocumented.append(f"line {i + 1}: {line.strip()}")
        documented_at.append((indent, documented))
    assert undocumented == []


def test_defaults_render_the_operator_the_agent_and_their_security(controlplane_binaries: Any) -> None:
    kinds = by_kind(render(CHART, {}, namespace="fiar-system"))
    # The FiAllreducePolicy CRD is in crds/, never a release object; kopf's peering CRD is kept.
    (peering,) = kinds["CustomResourceDefinition"]
    assert peering["metadata"]["name"] == "clusterkopfpeerings.kopf.dev"
    assert peering["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

    deployment = kinds["Deployment"][0]
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "--install-crd" in pod["containers"][0]["args"]
    crd_rule = {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                "resourceNames": [f"{contract.PLURAL}.{contract.GROUP}"], "verbs": ["patch"]}
    operator_role = next(r for r in kinds["ClusterRole"] if r["metadata"]["name"] == "fiar-operator")
    assert crd_rule in operator_role["rules"]
    sec = pod["containers"][0]["securityContext"]
    assert sec["readOnlyRootFilesystem"] is True and sec["allowPrivilegeEscalation"] is False
    assert sec["capabilities"] == {"drop": ["ALL"]}
    assert kinds["PodDisruptionBudget"][0]["spec"]["minAvailable"] == 1
    policies = {p["metadata"]["name"] for p in kinds["ValidatingAdmissionPolicy"]}
    assert policies == {"fiar-agent-own-node", "fiar-agent-own-node-condition", "fiar-operator-fiar-keys-only",
                        "fiar-operator-webhook-conditions-only", "fiar-operator-crd-schema-only",
                        "fiar-pod-annotation-values"}
    bindings = {b["spec"]["policyName"] for b in kinds["ValidatingAdmissionPolicyBinding"]}
    assert bindings == policies, "every policy is bound"
    ingress = kinds["NetworkPolicy"][0]["spec"]["ingress"]
    assert [rule["ports"][0]["port"] for rule in ingress] == [9443, 8080]  # nothing else reaches the pods

    webhooks = kinds["MutatingWebhookConfiguration"][0]["webhooks"]
    assert {w["name"] for w in webhooks} == {"pods.fiar.io", "binding.fiar.io"}
    for hook in webhooks:
        assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
        assert hook["timeoutSeconds"] <= 2
        exprs = {e["key"]: e for e in hook["namespaceSelector"]["matchExpressions"]}
        assert set(exprs["kubernetes.io/metadata.name"]["values"]) == {"kube-system", "fiar-system"}
        assert exprs[contract.NAMESPACE_IGNORE_LABEL]["operator"] == "DoesNotExist"
    resources = {w["name"]: w["rules"][0]["resources"] for w in webhooks}
    assert resources == {"pods.fiar.io": ["pods"], "binding.fiar.io": ["pods/binding"]}

    # The chart-made CA in the webhook configuration signed the serving certificate in the Secret.
    secret = kinds["Secret"][0]
    assert base64.b64decode(webhooks[0]["clientConfig"]["caBundle"]) == base64.b64decode(secret["data"]["ca.crt"])
    served = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    sans = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    sans = sans.get_values_for_type(x509.DNSName)
    assert "fiar-operator.fiar-system.svc" in sans

    daemonset = kinds["DaemonSet"][0]
    agent_pod = daemonset["spec"]["template"]
    assert agent_pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    env = {e["name"]: e for e in agent_pod["spec"]["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert re.fullmatch(r"[0-9a-f]{64}", agent_pod["metadata"]["annotations"]["checksum/config"])


def _rules(role: dict[str, Any]) -> dict[str, set[str]]:
    return {f"{g or 'core'}/{r}": set(rule["verbs"]) for rule in role["rules"]
            for g in rule["apiGroups"] for r in rule["resources"]}  # fmt: skip


def test_rbac_grants_no_verb_that_nothing_uses(controlplane_binaries: Any) -> None:
    roles = {r["metadata"]["name"]: _rules(r) for r in by_kind(render(CHART))["ClusterRole"]}
    operator = roles["fiar-operator"]
    assert operator[f"{contract.GROUP}/{contract.PLURAL}"] == {"get", "list", "watch"}, "policies are only read"
    assert operator[f"{contract.GROUP}/{contract.PLURAL}/status"] == {"get", "patch"}
    assert roles["fiar-agent"] == {"core/nodes": {"get", "watch", "patch"}, "core/nodes/status": {"patch"}}, (
        "the agent never lists Nodes; it patches its own Node's status for one condition"
    )


def test_the_agent_seeds_its_kernel_cache_by_image_and_needs_no_host_path_by_default(
    controlplane_binaries: Any,
) -> None:
    def agent_pod(values: dict[str, Any]) -> dict[str, Any]:
        return dict(by_kind(render(CHART, values))["DaemonSet"][0]["spec"]["template"]["spec"])

    pod = agent_pod({})
    command = " ".join(pod["containers"][0]["args"])
    assert "--kernel-cache=/var/cache/fiar" in command
    assert "cp -Rn" not in command, "a no-clobber copy keeps an older image's kernels"
    cache = next(v for v in pod["volumes"] if v["name"] == "kernel-cache")
    assert cache == {"name": "kernel-cache", "emptyDir": {"sizeLimit": "4Gi"}}
    assert not any("hostPath" in v for v in pod["volumes"])
    hosted = agent_pod({"agent.kernelCacheHostPath": "/var/cache/fiar/flashinfer"})
    cache = next(v for v in hosted["volumes"] if v["name"] == "kernel-cache")
    assert cache["hostPath"] == {"path": "/var/cache/fiar/flashinfer", "type": "DirectoryOrCreate"}


def test_agent_config_change_rolls_the_daemonset(controlplane_binaries: Any) -> None:
    def checksum(values: dict[str, Any]) -> str:
        ds = by_kind(render(CHART, values))["DaemonSet"][0]
        return str(ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"agent.probe.timeoutSeconds": 600})


def test_custom_values_reach_the_objects(controlplane_binaries: Any) -> None:
    kinds = by_kind(render(CHART, CUSTOM_VALUES, namespace="gpu-ops"))
    assert kinds["Deployment"][0]["metadata"]["name"] == "gpu-fiar-operator"
    assert kinds["Deployment"][0]["spec"]["replicas"] == 3
    webhooks = kinds["MutatingWebhookConfiguration"][0]["webhooks"]
    excluded = set(webhooks[0]["namespaceSelector"]["matchExpressions"][0]["values"])
    assert excluded == {"kube-system", "gpu-ops", "batch"}
    assert all(w["timeoutSeconds"] == 2 for w in webhooks)
    assert "--exclude-namespace=batch" in kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    webhook_rule = kinds["NetworkPolicy"][0]["spec"]["ingress"][0]
    assert webhook_rule["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    operator_policy = next(p for p in kinds["ValidatingAdmissionPolicy"] if "operator" in p["metadata"]["name"])
    assert '["kube-system","gpu-ops","batch"]' in operator_policy["spec"]["variables"][0]["expression"]
    ds = kinds["DaemonSet"][0]["spec"]["template"]["spec"]
    assert ds["runtimeClassName"] == "nvidia"
    config = next(c for c in kinds["ConfigMap"] if c["metadata"]["name"] == "gpu-fiar-agent")["data"]
    assert config["FIAR_FLAGS"].split() == ["--forbid-multicast", "--no-benchmark", "--require-prebuilt"]
    assert config["FIAR_INTERVAL"] == "3600" and config["FIAR_RETRY_INTERVAL"] == "600"
    assert {"name": "NCCL_NVLS_ENABLE", "value": "0"} in ds["containers"][0]["env"]
    assert kinds["FiAllreducePolicy"][0]["metadata"]["name"] == "default"
    assert "fiar.json" in next(c for c in kinds["ConfigMap"] if c["metadata"]["name"].endswith("dashboard"))["data"]
    assert all("annotations" not in c["metadata"] for c in kinds["CustomResourceDefinition"])
    assert "--install-crd" not in kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    operator_role = next(r for r in kinds["ClusterRole"] if r["metadata"]["name"] == "gpu-fiar-operator")
    crd_rules = [r for r in operator_role["rules"] if "customresourcedefinitions" in r["resources"]]
    assert all("patch" not in r["verbs"] for r in crd_rules)


def test_a_replaced_operator_serves_until_the_api_server_dropped_its_endpoint(controlplane_binaries: Any) -> None:
    (deployment,) = by_kind(render(CHART))["Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["lifecycle"]["preStop"]["sleep"]["seconds"] >= 5


def test_a_simulated_agent_probes_the_named_fixture(controlplane_binaries: Any) -> None:
    kinds = by_kind(render(CHART, {"agent.simulate": "h200x2-host"}))
    config = next(c for c in kinds["ConfigMap"] if c["metadata"]["name"] == "fiar-agent")["data"]
    assert config["FIAR_FLAGS"].split() == ["--simulate=h200x2-host"]
    default = by_kind(render(CHART))["ConfigMap"]
    assert "--simulate" not in next(c for c in default if c["metadata"]["name"] == "fiar-agent")["data"]["FIAR_FLAGS"]


def test_a_single_replica_gets_no_disruption_budget_that_would_block_drains(controlplane_binaries: Any) -> None:
    assert "PodDisruptionBudget" not in by_kind(render(CHART, {"operator.replicas": 1}))
    assert "PodDisruptionBudget" in by_kind(render(CHART, {"operator.replicas": 2}))


def test_cert_manager_mode_issues_the_certificate_and_injects_its_ca(controlplane_binaries: Any) -> None:
    kinds = by_kind(render(CHART, {"tls.certManager.enabled": True}))
    assert "Secret" not in kinds
    cert = kinds["Certificate"][0]
    assert cert["spec"]["issuerRef"]["kind"] == "Issuer" and kinds["Issuer"][0]["spec"] == {"selfSigned": {}}
    config = kinds["MutatingWebhookConfiguration"][0]
    inject = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert inject == f"fiar-system/{cert['metadata']['name']}"
    assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"])


def test_the_crd_is_the_operator_packages_crd(controlplane_binaries: Any) -> None:
    packaged = yaml.safe_load((ROOT / "operator" / "fiar_operator" / "crds" / "fiallreducepolicies.yaml").read_text())
    shipped = [d for d in yaml.safe_load_all(helm("show", "crds", str(CHART)).stdout) if d]
    assert shipped == [packaged]
