"""Operator and agent, started as local processes with the chart's RBAC identities, work end to end.

Images cannot run on kwok nodes, so the two programs run here, each with a token of the service
account the chart made for it: the agent's token is bound to the agent pod that the chart's DaemonSet
placed on a fake GPU node (so the own-node admission policy applies to it exactly as in a cluster),
the operator's token is a plain one of its account. The chart's own MutatingWebhookConfiguration is
used, with only its clientConfig pointed at the local operator (there is no Service network here).
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import fiar_contract as contract
from devcluster.binaries import helm
from devcluster.cluster import Component, ControlPlane, Tier, free_port
from devcluster.waiting import wait_for

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fiar"
NAMESPACE = "fiar-system"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def plane(controlplane_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("identities-plane"), Tier.C)
    plane.start()
    try:
        helm("install", "fiar", str(CHART), "--namespace", NAMESPACE, "--create-namespace",
             kubeconfig=plane.kubeconfig)
        yield plane
    finally:
        plane.stop()


def test_agent_and_operator_with_chart_identities_give_a_vllm_pod_its_nodes_verified_backend(
    plane: ControlPlane, tmp_path: Path
) -> None:
    node = "h200-node-0"
    plane.add_node(node, labels={"nvidia.com/gpu.present": "true"}, capacity={"nvidia.com/gpu": "2"},
                   taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    with plane.api_client() as api:
        core = client.CoreV1Api(api)

        def agent_pod() -> Any:
            pods = core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=agent",
                                            field_selector=f"spec.nodeName={node}").items
            return pods[0] if pods else None

        pod = wait_for(agent_pod, what="the chart's DaemonSet placing an agent pod on the GPU node")

    agent_kubeconfig = plane.write_kubeconfig(tmp_path / "agent.kubeconfig", "fiar-agent",
                                              token=plane.service_account_token(NAMESPACE, "fiar-agent", pod))
    operator_kubeconfig = plane.write_kubeconfig(tmp_path / "operator.kubeconfig", "fiar-operator",
                                                 token=plane.service_account_token(NAMESPACE, "fiar-operator"))
    assert plane.ca is not None
    cert, key = plane.ca.issue("fiar-operator", hosts=("127.0.0.1",)).write(tmp_path, "serving")
    webhook_port, metrics_port, agent_port = free_port(), free_port(), free_port()

    agent = Component("agent", [str(BIN / "fiar-agent"), "run", "--simulate", "h200x2-host", "--node-name", node,
                                "--kubeconfig", str(agent_kubeconfig), "--metrics-addr", f"127.0.0.1:{agent_port}"],
                      tmp_path / "agent.log", f"http://127.0.0.1:{agent_port}/healthz")
    operator = Component("operator", [str(BIN / "fiar-operator"), "run", "--kubeconfig", str(operator_kubeconfig),
                                      "--webhook-host", "127.0.0.1", "--webhook-port", str(webhook_port),
                                      "--tls-cert", str(cert), "--tls-key", str(key),
                                      "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port)],
                         tmp_path / "operator.log", f"http://127.0.0.1:{metrics_port}/readyz")
    try:
        agent.start()
        operator.start()
        with plane.api_client() as api:
            core = client.CoreV1Api(api)

            # 1. The agent, as the chart's agent account, labels the node its pod runs on.
            def labelled() -> dict[str, str] | None:
                assert agent.alive(), agent.tail()
                labels = core.read_node(node).metadata.labels or {}
                return labels if labels.get(contract.LABEL_BACKEND) else None

            labels = wait_for(labelled, 60, "the agent's labels")
            assert labels[contract.LABEL_BACKEND] == "trtllm"
            assert labels[contract.LABEL_MULTICAST] == "disabled" and labels[contract.LABEL_MNNVL] == "skipped"
            report = json.loads(core.read_node(node).metadata.annotations[contract.ANNOTATION_PROBE_REPORT])
            assert report["labels"] == {k: v for k, v in labels.items() if k.startswith(contract.PREFIX)}

            # The same publish sets the verdict as a node condition, through nodes/status.
            def verified_condition() -> Any:
                conditions = core.read_node(node).status.conditions or []
                return next((c for c in conditions if c.type == contract.CONDITION_VERIFIED), None)

            condition = wait_for(verified_condition, 30, "the agent's node condition")
            assert (condition.status, condition.reason) == ("True", "BackendVerified")
            assert condition.message.startswith("trtllm verified: trtllm passed")
            assert "\n" not in condition.message and len(condition.message) <= 300

            # An admin asks for a new probe; the agent may clear the request (a fiar.io/ annotation).
            core.patch_node(node, {"metadata": {"annotations": {contract.ANNOTATION_REPROBE: "now"}}})
            wait_for(lambda: contract.ANNOTATION_REPROBE not in (core.read_node(node).metadata.annotations or {}),
                     60, "the agent clearing fiar.io/reprobe")
            again = verified_condition()  # republished: same status, so the same transition time
            assert again.status == "True" and again.last_transition_time == condition.last_transition_time
            assert {c.type for c in core.read_node(node).status.conditions} >= {"Ready", contract.CONDITION_VERIFIED}

            # 2. The operator, as the chart's operator account, serves the chart's webhooks.
            operator.wait_ready(60)
            admission = client.AdmissionregistrationV1Api(api)
            config = admission.read_mutating_webhook_configuration("fiar")
            ca_bundle = base64.b64encode(plane.ca.cert_pem).decode()
            for hook in config.webhooks:
                url = f"https://127.0.0.1:{webhook_port}{hook.client_config.service.path}"
                hook.client_config = client.AdmissionregistrationV1WebhookClientConfig(url=url, ca_bundle=ca_bundle)
            admission.replace_mutating_webhook_configuration("fiar", config)

            policies = client.CustomObjectsApi(api)
            policies.create_cluster_custom_object(contract.GROUP, contract.VERSION, contract.PLURAL, {
                "apiVersion": f"{contract.GROUP}/{contract.VERSION}", "kind": contract.KIND,
                "metadata": {"name": "vllm"}, "spec": {"podSelector": {"matchLabels": {"app": "vllm"}}}})
            ns = plane.create_namespace("inference")
            vllm = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vllm-tp2", "labels": {"app": "vllm"}},
                    "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                             "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                             "containers": [{"name": "vllm", "image": "vllm/vllm-openai",
                                             "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}

            def webhook_active() -> bool:
                probe = core.create_namespaced_pod(ns, vllm, dry_run="All")
                return (probe.metadata.labels or {}).get(contract.LABEL_POD_POLICY) == "vllm"

            wait_for(webhook_active, 30, "the chart's webhook calling the operator")
            core.create_namespaced_pod(ns, vllm)

            def running() -> Any:
                p = core.read_namespaced_pod("vllm-tp2", ns)
                return p if p.status.phase == "Running" else None

            bound = wait_for(running, 60, "the vLLM pod Running")
            assert bound.spec.node_name == node
            assert bound.metadata.annotations[contract.ANNOTATION_POD_BACKEND] == "trtllm"
            decision = json.loads(bound.metadata.annotations[contract.ANNOTATION_POD_DECISION])
            assert decision["node"] == node
            env = {e.name: e for e in bound.spec.containers[0].env}
            ref = env[contract.ENV_VAR].value_from.field_ref.field_path
            assert ref == f"metadata.annotations['{contract.ANNOTATION_POD_BACKEND}']"

            # 3. The operator writes the policy status through its account.
            def status() -> Any:
                obj = policies.get_cluster_custom_object(contract.GROUP, contract.VERSION, contract.PLURAL, "vllm")
                return obj.get("status") if (obj.get("status") or {}).get("nodes", {}).get("trtllm") else None

            assert wait_for(status, 60, "policy status")["nodes"]["trtllm"] == 1
    except BaseException:
        print("--- agent log ---\n" + agent.tail() + "\n--- operator log ---\n" + operator.tail())
        raise
    finally:
        agent.stop()
        operator.stop()


def test_the_operator_account_may_change_only_fiar_keys_of_pods_outside_excluded_namespaces(
    plane: ControlPlane, tmp_path: Path
) -> None:
    operator_kubeconfig = plane.write_kubeconfig(tmp_path / "operator.kubeconfig", "fiar-operator",
                                                 token=plane.service_account_token(NAMESPACE, "fiar-operator"))
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "web", "labels": {"app": "web"}, "annotations": {"team": "a"}},
           "spec": {"nodeName": "nowhere", "containers": [{"name": "web", "image": "nginx"}]}}
    apps = plane.create_namespace("apps")
    ignored = plane.create_namespace("ignored", {contract.NAMESPACE_IGNORE_LABEL: ""})
    with plane.api_client() as admin_api:
        admin = client.CoreV1Api(admin_api)
        for namespace in (apps, ignored, NAMESPACE, "kube-system"):
            admin.create_namespaced_pod(namespace, pod)
        from kubernetes import config

        with config.new_client_from_config(str(operator_kubeconfig)) as operator_api:
            as_operator = client.CoreV1Api(operator_api)

            def patch(namespace: str, body: dict[str, Any], dry_run: str | None = None) -> int:
                try:
                    as_operator.patch_namespaced_pod("web", namespace, body, dry_run=dry_run)
                    return 200
                except client.ApiException as exc:
                    return int(exc.status)

            evil_image = {"spec": {"containers": [{"name": "web", "image": "attacker.example/evil"}]}}
            # The API server loads a new admission policy within a few seconds: probe with dry runs.
            wait_for(lambda: patch(apps, evil_image, dry_run="All") == 403, 30, "the operator's admission policy")
            fiar_keys = {"metadata": {"annotations": {contract.ANNOTATION_POD_BACKEND: "trtllm"},
                                      "labels": {contract.LABEL_POD_POLICY: "vllm"}}}
            assert patch(apps, fiar_keys) == 200
            assert patch(apps, {"metadata": {"annotations": {contract.ANNOTATION_POD_BACKEND: None}}}) == 200
            assert patch(apps, evil_image) == 403
            assert patch(apps, {"metadata": {"labels": {"app": "evil"}}}) == 403
            assert patch(apps, {"metadata": {"annotations": {"team": "b"}}}) == 403
            assert patch(apps, {"metadata": {"finalizers": ["example.com/stuck"]}}) == 403
            for excluded in (ignored, NAMESPACE, "kube-system"):
                assert patch(excluded, fiar_keys) == 403, excluded
        current = admin.read_namespaced_pod("web", apps)
        assert current.spec.containers[0].image == "nginx" and current.metadata.labels["app"] == "web"
        assert current.metadata.labels[contract.LABEL_POD_POLICY] == "vllm"
