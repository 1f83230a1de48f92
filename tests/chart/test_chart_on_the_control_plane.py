"""The chart against a real API server: server-side validation, install, upgrade, uninstall, and the
agent's own-node admission policy and the operator's RBAC enforced by the API server itself."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

import fiar_contract as contract
from devcluster.binaries import helm, kubectl, render, set_args
from devcluster.cluster import ControlPlane, Tier
from devcluster.waiting import wait_for
from node_agent import report

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fiar"
NAMESPACE = "fiar-system"
# Kinds whose CRDs belong to other projects (cert-manager, Prometheus Operator): not in this plane.
FOREIGN_KINDS = {"Certificate", "Issuer", "ServiceMonitor"}


@pytest.fixture(scope="module")
def chart_plane(controlplane_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A plane of its own: the chart installs cluster-scoped objects (CRDs, webhook configuration)."""
    plane = ControlPlane(tmp_path_factory.mktemp("chart-plane"), Tier.C)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def _crd_established(api: Any, name: str) -> bool:
    crd = client.ApiextensionsV1Api(api).read_custom_resource_definition(name)
    return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))


@pytest.mark.parametrize("values", [{}, {"defaultPolicy.enabled": True, "fullnameOverride": "gpu-fiar",
                                         "tls.certManager.enabled": False, "agent.runtimeClassName": "nvidia",
                                         "operator.replicas": 3, "grafanaDashboard.enabled": True}],
                         ids=["default", "custom"])
def test_rendered_manifests_pass_strict_server_side_validation(
    chart_plane: ControlPlane, values: dict[str, Any], tmp_path: Path, unique: str
) -> None:
    ns = chart_plane.create_namespace(f"render-{unique}")
    docs = [d for d in render(CHART, values, namespace=ns, release=f"r{unique}", include_crds=True)
            if d["kind"] not in FOREIGN_KINDS]
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    # CRDs are created for real first so that custom resources in the release validate against them.
    kubectl(chart_plane.kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", "-",
            stdin=yaml.safe_dump_all(crds))
    with chart_plane.api_client() as api:
        for crd in crds:
            wait_for(lambda name=crd["metadata"]["name"]: _crd_established(api, name), what="CRD Established")
    try:
        proc = kubectl(chart_plane.kubeconfig, "apply", "--dry-run=server", "--validate=strict", "-f", "-",
                       stdin=yaml.safe_dump_all(rest))
    finally:
        # Leave the CRDs to the chart install that comes next (Helm adopts nothing it did not create).
        kubectl(chart_plane.kubeconfig, "delete", "--wait", "-f", "-", stdin=yaml.safe_dump_all(crds))
    applied = [line for line in proc.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == len(rest), proc.stdout


def _install(plane: ControlPlane, *extra: str) -> None:
    helm("upgrade", "--install", "fiar", str(CHART), "--namespace", NAMESPACE, "--create-namespace",
         *extra, kubeconfig=plane.kubeconfig)


def test_install_upgrade_and_uninstall(chart_plane: ControlPlane) -> None:
    _install(chart_plane)
    with chart_plane.api_client() as api:
        apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
        assert apps.read_namespaced_deployment("fiar-operator", NAMESPACE).spec.replicas == 2
        assert apps.read_namespaced_daemon_set("fiar-agent", NAMESPACE)
        admission = client.AdmissionregistrationV1Api(api)
        hooks = admission.read_mutating_webhook_configuration("fiar").webhooks
        assert {h.name for h in hooks} == {"pods.fiar.io", "binding.fiar.io"}
        assert admission.read_validating_admission_policy("fiar-agent-own-node")
        crd_name = f"{contract.PLURAL}.{contract.GROUP}"
        wait_for(lambda: _crd_established(api, crd_name), what="CRD Established")
        objs = client.CustomObjectsApi(api)
        assert objs.list_cluster_custom_object(contract.GROUP, contract.VERSION, contract.PLURAL)["items"] == []
        secret = core.read_namespaced_secret("fiar-webhook-tls", NAMESPACE).data
        ca_bundle = hooks[0].client_config.ca_bundle

        # Upgrade with other values: the webhook certificate and CA stay the same.
        _install(chart_plane, *set_args({"operator.replicas": 3, "agent.probe.timeoutSeconds": 600}))
        assert apps.read_namespaced_deployment("fiar-operator", NAMESPACE).spec.replicas == 3
        assert core.read_namespaced_secret("fiar-webhook-tls", NAMESPACE).data == secret
        hooks = admission.read_mutating_webhook_configuration("fiar").webhooks
        assert all(h.client_config.ca_bundle == ca_bundle for h in hooks)
        assert base64.b64decode(ca_bundle) == base64.b64decode(secret["ca.crt"])

        # A policy exists when the chart is removed: the CRD (and so the policy) is kept.
        objs.create_cluster_custom_object(contract.GROUP, contract.VERSION, contract.PLURAL, {
            "apiVersion": f"{contract.GROUP}/{contract.VERSION}", "kind": contract.KIND,
            "metadata": {"name": "keep-me"}, "spec": {"podSelector": {"matchLabels": {"app": "vllm"}}}})
        helm("uninstall", "fiar", "--namespace", NAMESPACE, "--wait", kubeconfig=chart_plane.kubeconfig)
        with pytest.raises(ApiException) as gone:
            apps.read_namespaced_deployment("fiar-operator", NAMESPACE)
        assert gone.value.status == 404
        with pytest.raises(ApiException):
            admission.read_mutating_webhook_configuration("fiar")
        assert _crd_established(api, crd_name)
        assert objs.get_cluster_custom_object(contract.GROUP, contract.VERSION, contract.PLURAL, "keep-me")
        objs.delete_cluster_custom_object(contract.GROUP, contract.VERSION, contract.PLURAL, "keep-me")


# -- identities from the chart --------------------------------------------------------------------
def token_for(plane: ControlPlane, service_account: str, pod: client.V1Pod | None = None) -> str:
    return plane.service_account_token(NAMESPACE, service_account, pod)


def identity_client(plane: ControlPlane, tmp_path: Path, name: str, token: str) -> Any:
    kubeconfig = plane.write_kubeconfig(tmp_path / f"{name}.kubeconfig", name, token=token)
    from kubernetes import config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return client.ApiClient(cfg)


@pytest.fixture(scope="module")
def installed(chart_plane: ControlPlane) -> ControlPlane:
    _install(chart_plane)
    return chart_plane


def _agent_pod_on(plane: ControlPlane, node: str) -> client.V1Pod:
    with plane.api_client() as api:
        core = client.CoreV1Api(api)

        def pod() -> Any:
            pods = core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=agent",
                                            field_selector=f"spec.nodeName={node}").items
            return pods[0] if pods else None

        return wait_for(pod, 60, f"the DaemonSet's agent pod on {node}")


def _patch_labels(api: Any, node: str, labels: dict[str, str | None], dry_run: bool = False) -> None:
    client.CoreV1Api(api).patch_node(
        node, {"metadata": {"labels": labels}}, dry_run="All" if dry_run else None, field_manager=AGENT_MANAGER
    )


def test_agent_token_may_label_only_its_own_node_and_only_fiar_keys(
    installed: ControlPlane, tmp_path: Path, unique: str
) -> None:
    node_a, node_b = f"gpu-a-{unique}", f"gpu-b-{unique}"
    for node in (node_a, node_b):
        installed.add_node(node, labels={"nvidia.com/gpu.present": "true"})
    agent_pod = _agent_pod_on(installed, node_a)
    token = token_for(installed, "fiar-agent", agent_pod)
    with identity_client(installed, tmp_path, "agent", token) as agent:
        # The policy binding takes effect moments after install: probe with dry runs (nothing is
        # written) until node B is refused, then check every case for real.
        def refused_on_b(dry_run: bool = True) -> bool:
            try:
                _patch_labels(agent, node_b, {contract.LABEL_BACKEND: "trtllm"}, dry_run=dry_run)
            except ApiException as exc:
                return exc.status == 403 and "may only change the Node its pod runs on" in exc.body
            return False

        wait_for(refused_on_b, 30, "the own-node admission policy")
        assert refused_on_b(dry_run=False)
        _patch_labels(agent, node_a, {contract.LABEL_BACKEND: "trtllm", contract.LABEL_GPUS: "8"})
        with pytest.raises(ApiException) as other_key:
            _patch_labels(agent, node_a, {"example.com/owned-by-someone-else": "x"})
        assert other_key.value.status == 403
        assert "only add, change or remove its own fiar.io/ labels" in other_key.value.body
        with pytest.raises(ApiException) as other_annotation:
            client.CoreV1Api(agent).patch_node(node_a, {"metadata": {"annotations": {"example.com/x": "y"}}})
        assert other_annotation.value.status == 403
        with pytest.raises(ApiException) as taint:
            client.CoreV1Api(agent).patch_node(node_a, {"spec": {"unschedulable": True}})
        assert taint.value.status == 403
        with pytest.raises(ApiException) as delete:
            client.CoreV1Api(agent).delete_node(node_a)
        assert delete.value.status == 403
    with installed.api_client() as api:
        labels = client.CoreV1Api(api).read_node(node_a).metadata.labels
        assert labels[contract.LABEL_BACKEND] == "trtllm" and labels[contract.LABEL_GPUS] == "8"
        assert contract.LABEL_BACKEND not in client.CoreV1Api(api).read_node(node_b).metadata.labels


def test_an_agent_token_not_bound_to_a_pod_changes_no_node(
    installed: ControlPlane, tmp_path: Path, unique: str
) -> None:
    node = f"gpu-c-{unique}"
    installed.add_node(node)
    with identity_client(installed, tmp_path, "agent-unbound", token_for(installed, "fiar-agent")) as agent:
        def refused() -> bool:
            try:
                _patch_labels(agent, node, {contract.LABEL_BACKEND: "none"}, dry_run=True)
            except ApiException as exc:
                return exc.status == 403 and "not bound to a pod on a node" in exc.body
            return False

        wait_for(refused, 30, "the own-node admission policy")


NODE_METADATA_EXEMPT = {"labels", "annotations", "resourceVersion", "managedFields"}
"""ObjectMeta fields the agent's policy does not hold equal: labels and annotations have their own
fiar.io/ rules, resourceVersion is the agent's precondition, managedFields the API server's bookkeeping."""


def _refused(call: Any, message: str) -> None:
    with pytest.raises(ApiException) as denied:
        call()
    assert denied.value.status == 403 and message in denied.value.body, denied.value.body


def test_agent_token_may_change_no_other_metadata_of_its_own_node(
    installed: ControlPlane, tmp_path: Path, unique: str
) -> None:
    node = f"gpu-m-{unique}"
    installed.add_node(node, labels={"nvidia.com/gpu.present": "true"})
    token = token_for(installed, "fiar-agent", _agent_pod_on(installed, node))
    with installed.api_client() as admin_api:
        admin = client.CoreV1Api(admin_api)
        uid = admin.read_node(node).metadata.uid
        # an admin's finalizer and owner are already there: the agent's fiar.io/ writes leave them be
        admin.patch_node(node, {"metadata": {"finalizers": ["example.com/admin-hold"]}})
        with identity_client(installed, tmp_path, "agent-meta", token) as agent_api:
            agent = client.CoreV1Api(agent_api)

            def refused_owner(dry_run: bool = True) -> bool:
                owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "missing",
                         "uid": "00000000-0000-0000-0000-000000000001"}
                try:
                    agent.patch_node(node, {"metadata": {"ownerReferences": [owner]}},
                                     dry_run="All" if dry_run else None)
                except ApiException as exc:
                    return exc.status == 403 and "ownerReferences" in exc.body
                return False

            wait_for(refused_owner, 30, "the own-node admission policy")
            assert refused_owner(dry_run=False)
            _refused(lambda: agent.patch_node(node, {"metadata": {"finalizers": ["example.com/stuck"]}}),
                     "may not change a Node's finalizers")
            _refused(lambda: agent.patch_node(node, {"metadata": {"$deleteFromPrimitiveList/finalizers":
                                                                  ["example.com/admin-hold"]}}),
                     "may not change a Node's finalizers")
            _refused(lambda: agent.patch_node(node, {"metadata": {"generateName": "evil-"}}),
                     "may change nothing in a Node's metadata but fiar.io/")
            # what the agent does write is still allowed: its fiar.io/ labels and report, and clearing
            # an admin's reprobe request with a resourceVersion precondition
            admin.patch_node(node, {"metadata": {"annotations": {contract.ANNOTATION_REPROBE: "now"}}})
            agent.patch_node(node, {"metadata": {"labels": {contract.LABEL_BACKEND: "trtllm"},
                                                 "annotations": {contract.ANNOTATION_PROBE_REPORT: "{}"}}},
                             field_manager=AGENT_MANAGER)
            rv = agent.read_node(node).metadata.resource_version
            agent.patch_node(node, {"metadata": {"resourceVersion": rv,
                                                 "annotations": {contract.ANNOTATION_REPROBE: None}}},
                             field_manager=AGENT_MANAGER)
        after = admin.read_node(node)
        assert after.metadata.uid == uid
        assert after.metadata.finalizers == ["example.com/admin-hold"] and not after.metadata.owner_references
        assert after.metadata.labels[contract.LABEL_BACKEND] == "trtllm"
        assert contract.ANNOTATION_REPROBE not in (after.metadata.annotations or {})
        admin.patch_node(node, {"metadata": {"finalizers": None}})


def test_the_agent_policy_holds_every_other_field_of_node_metadata_equal(installed: ControlPlane) -> None:
    spec = json.loads(kubectl(installed.kubeconfig, "get", "--raw", "/openapi/v3/api/v1").stdout)
    with installed.api_client() as api:
        policy = client.AdmissionregistrationV1Api(api).read_validating_admission_policy("fiar-agent-own-node")
    fields = set(spec["components"]["schemas"]["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]["properties"])
    expressions = " ".join(v.expression for v in policy.spec.validations)
    held = {f for f in fields if f"object.metadata.?{f} == oldObject.metadata.?{f}" in expressions}
    assert fields - held == NODE_METADATA_EXEMPT, f"not compared: {sorted(fields - held - NODE_METADATA_EXEMPT)}"


def _pod_of(kind: str, values: dict[str, Any]) -> dict[str, Any]:
    """The pod a workload of the rendered chart would create (its ServiceAccount left to the namespace's)."""
    docs = [d for d in render(CHART, values) if d["kind"] == kind]
    spec = dict(docs[0]["spec"]["template"]["spec"])
    spec.pop("serviceAccountName", None)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": kind.lower()}, "spec": spec}


@pytest.mark.parametrize(
    ("kind", "values", "admitted", "refused"),
    [
        ("Deployment", {}, "restricted", None),
        ("DaemonSet", {}, "baseline", "restricted"),
        ("DaemonSet", {"agent.kernelCacheHostPath": "/var/cache/fiar/flashinfer"}, "privileged", "baseline"),
    ],
    ids=["operator", "agent", "agent-with-host-cache"],
)
def test_components_meet_the_documented_pod_security_level(
    installed: ControlPlane, unique: str, kind: str, values: dict[str, Any], admitted: str, refused: str | None
) -> None:
    pod = _pod_of(kind, values)
    with installed.api_client() as api:
        core = client.CoreV1Api(api)

        def create(level: str) -> None:
            ns = f"pss-{level}-{unique}"
            installed.create_namespace(ns, labels={"pod-security.kubernetes.io/enforce": level})
            wait_for(lambda: core.list_namespaced_service_account(ns).items, 30, "the default ServiceAccount")
            core.create_namespaced_pod(ns, pod, dry_run="All")

        create(admitted)
        if refused is not None:
            with pytest.raises(ApiException) as denied:
                create(refused)
            assert denied.value.status == 403 and "violates PodSecurity" in denied.value.body


def test_operator_account_reads_pods_but_no_secret(installed: ControlPlane, tmp_path: Path) -> None:
    with identity_client(installed, tmp_path, "operator", token_for(installed, "fiar-operator")) as operator:
        core = client.CoreV1Api(operator)
        assert core.list_pod_for_all_namespaces(limit=1) is not None
        for call in (lambda: core.read_namespaced_secret("fiar-webhook-tls", NAMESPACE),
                     lambda: core.list_secret_for_all_namespaces(limit=1)):
            with pytest.raises(ApiException) as denied:
                call()
            assert denied.value.status == 403
        with pytest.raises(ApiException) as nodes:
            core.patch_node("any", {"metadata": {"labels": {contract.LABEL_BACKEND: "mnnvl"}}})
        assert nodes.value.status == 403
        review = client.AuthorizationV1Api(operator).create_self_subject_rules_review(
            {"spec": {"namespace": NAMESPACE}})
        rules = json.dumps(review.status.to_dict()["resource_rules"])
        assert "secrets" not in rules and "eviction" not in rules


def test_fresh_install_with_a_default_policy_beside_another_tools_peering_crd(private_plane: Any) -> None:
    """The default policy is created once its CRD is served, and kopf's peering CRD, when another
    tool installed it already, is left to that tool instead of failing the install."""
    plane = private_plane(Tier.A)
    peering = next(d for d in render(CHART) if d["kind"] == "CustomResourceDefinition")
    assert peering["metadata"]["name"] == "clusterkopfpeerings.kopf.dev"
    peering["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "another-operator"}
    kubectl(plane.kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(peering))
    helm("install", "fiar", str(CHART), "--namespace", NAMESPACE, "--create-namespace",
         "--set", "defaultPolicy.enabled=true", kubeconfig=plane.kubeconfig)
    with plane.api_client() as api:
        policy = client.CustomObjectsApi(api).get_cluster_custom_object(
            contract.GROUP, contract.VERSION, contract.PLURAL, "default")
        assert policy["spec"]["backends"] == ["mnnvl", "trtllm"]
        crd = client.ApiextensionsV1Api(api).read_custom_resource_definition("clusterkopfpeerings.kopf.dev")
        assert crd.metadata.labels == {"app.kubernetes.io/managed-by": "another-operator"}


# -- the verdict as a node condition ----------------------------------------------------------------------
NODE_STATUS_EXEMPT = {"conditions"}
"""NodeStatus fields the agent's condition policy does not hold equal: only the conditions, whose own
rule keeps every condition but FiarAllreduceVerified as it was."""


AGENT_MANAGER = "fiar-agent"
"""The agent's field manager: the API server takes it from the agent's User-Agent, fiar-agent/VERSION."""


def _fiar_condition(status: str = "True", reason: str = "BackendVerified", message: str = "trtllm verified") -> Any:
    return {"type": contract.CONDITION_VERIFIED, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": "2026-12-02T07:00:00Z", "lastTransitionTime": "2026-12-02T07:00:00Z"}


def test_agent_token_may_set_only_the_fiar_condition_of_its_own_nodes_status(
    installed: ControlPlane, tmp_path: Path, unique: str
) -> None:
    node, other = f"gpu-s-{unique}", f"gpu-t-{unique}"
    for name in (node, other):
        installed.add_node(name, labels={"nvidia.com/gpu.present": "true"})
    token = token_for(installed, "fiar-agent", _agent_pod_on(installed, node))
    with installed.api_client() as admin_api:
        admin = client.CoreV1Api(admin_api)
        wait_for(lambda: admin.read_node(node).status.conditions, 30, "kwok's conditions on the node")
        before = admin.read_node(node)
        with identity_client(installed, tmp_path, "agent-status", token) as agent_api:
            agent = client.CoreV1Api(agent_api)

            def refused_on_other(dry_run: bool = True) -> bool:
                try:
                    agent.patch_node_status(other, {"status": {"conditions": [_fiar_condition()]}},
                                            dry_run="All" if dry_run else None)
                except ApiException as exc:
                    return exc.status == 403 and "status of the Node its pod runs on" in exc.body
                return False

            wait_for(refused_on_other, 30, "the own-node condition policy")
            assert refused_on_other(dry_run=False)
            agent.patch_node_status(node, {"status": {"conditions": [_fiar_condition()]}}, field_manager=AGENT_MANAGER)
            agent.patch_node_status(node, {"status": {"conditions": [_fiar_condition("False", "NoBackendVerified")]}},
                                    field_manager=AGENT_MANAGER)
            other_type = {**_fiar_condition(), "type": "GpuNvlinkWatch"}
            ready = next(c for c in before.status.conditions if c.type == "Ready")
            cases = [
                ({"conditions": [other_type]}, "no node condition but FiarAllreduceVerified"),
                ({"conditions": [{"type": "Ready", "status": "False", "reason": "Evil", "message": "x",
                                  "lastHeartbeatTime": ready.last_heartbeat_time.isoformat(),
                                  "lastTransitionTime": ready.last_transition_time.isoformat()}]},
                 "no node condition but FiarAllreduceVerified"),
                ({"conditions": [{"type": "Ready", "$patch": "delete"}]},
                 "no node condition but FiarAllreduceVerified"),
                ({"conditions": [_fiar_condition(status="Maybe")]}, "needs status True, False or Unknown"),
                ({"conditions": [_fiar_condition(reason="Whatever")]}, "needs status True, False or Unknown"),
                ({"conditions": [_fiar_condition(message="x" * 1025)]}, "needs status True, False or Unknown"),
                ({"capacity": {"nvidia.com/gpu": "64"}}, "nothing in a Node's status but"),
                ({"allocatable": {"cpu": "1"}}, "nothing in a Node's status but"),
                ({"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}]}, "nothing in a Node's status but"),
                ({"nodeInfo": {"kubeletVersion": "v0.0.0-evil"}}, "nothing in a Node's status but"),
            ]
            for status, message in cases:
                _refused(lambda s=status: agent.patch_node_status(node, {"status": s}), message)
            _refused(lambda: agent.patch_node_status(node, {"metadata": {"labels": {"example.com/x": "y"}},
                                                             "status": {"conditions": [_fiar_condition()]}}),
                     "no metadata and no spec through a Node's status")
        after = admin.read_node(node)
        kinds = {c.type: c for c in after.status.conditions}
        assert kinds[contract.CONDITION_VERIFIED].status == "False"
        assert "GpuNvlinkWatch" not in kinds and kinds["Ready"].status == ready.status
        assert after.status.capacity == before.status.capacity and after.status.addresses == before.status.addresses
        assert "example.com/x" not in (after.metadata.labels or {})
        assert contract.CONDITION_VERIFIED not in {c.type for c in admin.read_node(other).status.conditions or []}


def test_the_condition_policy_holds_every_other_field_of_node_status_equal(installed: ControlPlane) -> None:
    spec = json.loads(kubectl(installed.kubeconfig, "get", "--raw", "/openapi/v3/api/v1").stdout)
    with installed.api_client() as api:
        policy = client.AdmissionregistrationV1Api(api).read_validating_admission_policy(
            "fiar-agent-own-node-condition")
    fields = set(spec["components"]["schemas"]["io.k8s.api.core.v1.NodeStatus"]["properties"])
    expressions = " ".join(v.expression for v in policy.spec.validations)
    held = {f for f in fields if f"object.status.?{f} == oldObject.status.?{f}" in expressions}
    assert fields - held == NODE_STATUS_EXEMPT, f"not compared: {sorted(fields - held - NODE_STATUS_EXEMPT)}"


def test_agent_token_cannot_bloat_its_node_or_rewrite_its_managed_fields(
    installed: ControlPlane, tmp_path: Path, unique: str
) -> None:
    """A stolen agent token filled its Node to 1.1-1.65 MB (8,000 fiar.io/ labels, 240 KB of annotations,
    600 duplicate conditions), which every Node watcher receives on each write, and replaced managedFields
    through nodes/status. Only the contract's labels and annotations, bounded, and one condition."""
    node = f"gpu-x-{unique}"
    installed.add_node(node, labels={"nvidia.com/gpu.present": "true"})
    token = token_for(installed, "fiar-agent", _agent_pod_on(installed, node))
    with installed.api_client() as admin_api:
        admin = client.CoreV1Api(admin_api)
        wait_for(lambda: admin.read_node(node).status.conditions, 30, "kwok's conditions on the node")
        with identity_client(installed, tmp_path, "agent-bloat", token) as agent_api:
            agent = client.CoreV1Api(agent_api)

            def refused_extra_label(dry_run: bool = True) -> bool:
                try:
                    _patch_labels(agent_api, node, {"fiar.io/extra-0": "x"}, dry_run=dry_run)
                except ApiException as exc:
                    return exc.status == 403 and "its own fiar.io/ labels" in exc.body
                return False

            wait_for(refused_extra_label, 30, "the own-node admission policy")
            assert refused_extra_label(dry_run=False)
            labels = {f"fiar.io/extra-{i}": "x" * 63 for i in range(500)}
            _refused(lambda: _patch_labels(agent_api, node, labels), "its own fiar.io/ labels")
            every = {key: "pass" for key in contract.AGENT_LABELS}
            _patch_labels(agent_api, node, every)  # each label of the contract, written
            _patch_labels(agent_api, node, dict.fromkeys(contract.AGENT_LABELS))  # and removed
            annotations: list[dict[str, str | None]] = [
                {contract.ANNOTATION_PROBE_REPORT: "x" * (report.MAX_BYTES + 1)},
                {contract.ANNOTATION_PROBE_REPORT: "é" * (report.MAX_BYTES // 2 + 1)},
                {"fiar.io/padding": "x" * 200_000},
                {contract.ANNOTATION_REPROBE: "now"},
            ]
            for body in annotations:
                _refused(lambda b=body: agent.patch_node(node, {"metadata": {"annotations": b}}),
                         "may only write fiar.io/probe-report")
            agent.patch_node(node, {"metadata": {"annotations": {contract.ANNOTATION_PROBE_REPORT:
                                                                 "x" * report.MAX_BYTES}}},
                             field_manager=AGENT_MANAGER)

            # managedFields sent through nodes are taken as they are: no other entry renamed, added, dropped
            fields = admin_api.sanitize_for_serialization(admin.read_node(node).metadata.managed_fields)
            others = [m for m in fields if m["manager"] != AGENT_MANAGER]
            forged = {
                "a reset": [{}],
                "every entry renamed": [dict(m, manager="evil-" + m["manager"]) for m in fields],
                "an entry added": [*fields, {**others[0], "manager": "evil"}],
                "an entry backdated": [dict(m, time="2020-01-01T00:00:00Z") for m in fields],
            }
            def entries() -> set[tuple[str, str, str | None, str]]:
                stored = admin_api.sanitize_for_serialization(admin.read_node(node).metadata.managed_fields)
                return {(m["manager"], m["operation"], m.get("subresource"), m["apiVersion"])
                        for m in stored if m["manager"] != AGENT_MANAGER}

            for name, value in forged.items():
                before_write = entries()
                try:
                    agent.patch_node(node, {"metadata": {"managedFields": value}}, field_manager=AGENT_MANAGER)
                except ApiException as exc:
                    assert exc.status == 403, (name, exc.body)
                    assert "another field manager's managedFields entry" in exc.body, (name, exc.body)
                    continue
                # admitted only where the API server kept the stored entries (the request's were not taken)
                stored = admin_api.sanitize_for_serialization(admin.read_node(node).metadata.managed_fields)
                assert entries() >= before_write, name
                assert not any(str(m.get("time", "")).startswith("2020") for m in stored), name

            # through nodes/status: one condition, and no other manager's managedFields entry
            agent.patch_node_status(node, {"status": {"conditions": [_fiar_condition()]}},
                                    field_manager=AGENT_MANAGER)
            extra = [{"op": "add", "path": "/status/conditions/-", "value": _fiar_condition("False",
                                                                                             "NoBackendVerified")}]
            _refused(lambda: agent.patch_node_status(node, extra * 3, field_manager=AGENT_MANAGER),
                     "exactly one FiarAllreduceVerified condition")
            # through nodes/status the API server (1.36) keeps managedFields whatever the request sends
            before = admin.read_node(node).metadata.managed_fields
            agent.patch_node_status(node, {"metadata": {"managedFields": [{}]}}, field_manager=AGENT_MANAGER)
            agent.patch_node_status(node, {"status": {"conditions": [_fiar_condition("Unknown", "NotConcluded")]}},
                                    field_manager=AGENT_MANAGER)
        after = admin.read_node(node)
        assert not any(k.startswith("fiar.io/extra") for k in after.metadata.labels)
        assert len(after.metadata.annotations[contract.ANNOTATION_PROBE_REPORT]) == report.MAX_BYTES
        assert [c.status for c in after.status.conditions if c.type == contract.CONDITION_VERIFIED] == ["Unknown"]
        kept = {(m.manager, m.operation, m.subresource) for m in before if m.manager != AGENT_MANAGER}
        assert kept <= {(m.manager, m.operation, m.subresource) for m in after.metadata.managed_fields}


def test_the_agent_policy_names_the_contracts_labels_and_the_reports_bound(controlplane_binaries: Any) -> None:
    policy = next(
        d for d in render(CHART)
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == "fiar-agent-own-node"
    )
    expressions = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert f"k in {json.dumps(list(contract.AGENT_LABELS), separators=(',', ':'))}" in expressions
    assert f"size(bytes(variables.newAnnotations[k])) <= {report.MAX_BYTES}" in expressions
    assert f"k == '{contract.ANNOTATION_PROBE_REPORT}'" in expressions
    assert f"['{contract.ANNOTATION_PROBE_REPORT}', '{contract.ANNOTATION_REPROBE}']" in expressions
