"""The seam against a real kube-apiserver: its answers get the types the components decide by, and a
service-account token rotated in its file is what the server sees next. (The watch cache answers a
watch from an old resourceVersion here instead of 410 Gone even after an etcd compaction, so Gone is
checked on a loopback server, in test_backoff_and_watch_lines.py.)"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import fiar_kube as kube
from devcluster.cluster import ControlPlane

pytestmark = pytest.mark.controlplane


def admin(plane: ControlPlane) -> kube.Client:
    return kube.Client(kube.load_config(str(plane.kubeconfig)), user_agent="fiar-test")


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def test_answers_of_the_api_server_get_their_types(plane_a: ControlPlane, tmp_path: Path) -> None:
    api, name = admin(plane_a), f"seam-{uuid.uuid4().hex[:8]}"
    with pytest.raises(kube.NotFound):
        api.request("GET", f"/api/v1/nodes/{name}")
    api.request("POST", "/api/v1/nodes", body=node(name))
    try:
        with pytest.raises(kube.Conflict, match="already exists"):
            api.request("POST", "/api/v1/nodes", body=node(name))
        stale = {"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}}
        with pytest.raises(kube.Conflict):
            api.request("PATCH", f"/api/v1/nodes/{name}", body=stale, content_type=kube.MERGE_PATCH)
        with pytest.raises(kube.Invalid):
            api.request("POST", "/api/v1/nodes", body=node("Not_A_Name"))
        with pytest.raises(kube.Rejected) as unsupported:
            api.request("PATCH", f"/api/v1/nodes/{name}", body={}, content_type="text/plain")
        assert unsupported.value.status == 415
    finally:
        api.request("DELETE", f"/api/v1/nodes/{name}")
    nobody = kube.Client(kube.load_config(str(plane_a.write_kubeconfig(tmp_path / "nobody", "nobody"))), user_agent="t")
    with pytest.raises(kube.Forbidden):
        nobody.request("GET", "/api/v1/nodes")
    bogus = plane_a.write_kubeconfig(tmp_path / "bogus", "bogus", token="not-a-token")
    with pytest.raises(kube.Unauthorized):
        kube.Client(kube.load_config(str(bogus)), user_agent="t").request("GET", "/api/v1/nodes")


def test_the_api_server_sees_a_rotated_service_account_token_at_once(plane_a: ControlPlane, tmp_path: Path) -> None:
    namespace = plane_a.create_namespace(f"seam-{uuid.uuid4().hex[:8]}")
    with plane_a.api_client() as api:
        client.CoreV1Api(api).create_namespaced_service_account(namespace, {"metadata": {"name": "agent"}})
    folder = tmp_path / "serviceaccount"
    folder.mkdir()
    (folder / "ca.crt").write_bytes(plane_a.ca_file.read_bytes())
    (folder / "token").write_text(plane_a.service_account_token(namespace, "agent"))
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(plane_a.apiserver_port)}
    pod = kube.Client(kube.load_config(None, environ=environ, service_account=str(folder)), user_agent="t")

    with pytest.raises(kube.Forbidden, match="system:serviceaccount:"):  # known, just not allowed
        pod.request("GET", "/api/v1/nodes")
    (folder / "token").write_text("revoked")
    with pytest.raises(kube.Unauthorized):
        pod.request("GET", "/api/v1/nodes")
    (folder / "token").write_text(plane_a.service_account_token(namespace, "agent"))
    with pytest.raises(kube.Forbidden):
        pod.request("GET", "/api/v1/nodes")
