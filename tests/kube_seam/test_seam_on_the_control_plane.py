"""The seam against a real kube-apiserver: its answers get the types the components decide by, and a
service-account token rotated in its file is what the server sees next. (The watch cache answers a
watch from an old resourceVersion here instead of 410 Gone even after an etcd compaction, so Gone is
checked on a loopback server, in test_backoff_and_watch_lines.py.)"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
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


def kubeconfig_of(plane: ControlPlane, path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": cluster or {"server": plane.server, "certificate-authority": str(plane.ca_file)}}
        ],
        "users": [{"name": "u", "user": user}],
        "contexts": [
            {"name": "other", "context": {"cluster": "missing", "user": "u"}},
            {"name": "x", "context": {"cluster": "c", "user": "u"}},
        ],
        "current-context": "x",
    }
    path.write_text(json.dumps(doc))
    return path


def test_kubeconfig_credentials_of_every_plain_kind_reach_the_api_server(plane_a: ControlPlane, tmp_path: Path) -> None:
    """Client certificates as files (relative to the kubeconfig's folder) or inline data, a CA as data,
    a token, a token file re-read when it changes: each is read without the kubernetes package."""
    assert plane_a.ca is not None
    crt, key = plane_a.ca.issue("admin-data", organizations=("system:masters",), client=True).write(tmp_path, "admin")
    inline = {
        "client-certificate-data": base64.b64encode(crt.read_bytes()).decode(),
        "client-key-data": base64.b64encode(key.read_bytes()).decode(),
    }
    ca_data = {
        "server": plane_a.server + "/",
        "certificate-authority-data": base64.b64encode(plane_a.ca_file.read_bytes()).decode(),
    }
    namespace = plane_a.create_namespace(f"seam-{uuid.uuid4().hex[:8]}")
    with plane_a.api_client() as api:
        client.CoreV1Api(api).create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    token = plane_a.service_account_token(namespace, "reader")
    (tmp_path / "token").write_text(token)
    cases = {
        "relative files": kubeconfig_of(
            plane_a, tmp_path / "files", {"client-certificate": crt.name, "client-key": key.name}
        ),
        "inline data, CA data": kubeconfig_of(plane_a, tmp_path / "inline", inline, ca_data),
        "token": kubeconfig_of(plane_a, tmp_path / "tok", {"token": token}),
        "token file": kubeconfig_of(plane_a, tmp_path / "tokfile", {"tokenFile": "token"}),
    }
    for case, path in cases.items():
        cfg = kube.load_config(str(path))
        assert isinstance(cfg, kube.Credentials), case
        api = kube.Client(cfg, user_agent="t")
        if case.startswith("token"):
            with pytest.raises(kube.Forbidden, match=f"system:serviceaccount:{namespace}:reader"):
                api.request("GET", "/api/v1/nodes")
        else:
            assert api.request("GET", "/api/v1/nodes")["kind"] == "NodeList", case
    api = kube.Client(kube.load_config(str(cases["token file"])), user_agent="t")
    (tmp_path / "token").write_text("revoked")
    with pytest.raises(kube.Unauthorized):
        api.request("GET", "/api/v1/nodes")


def test_loading_credentials_leaves_the_kubernetes_package_unimported(plane_a: ControlPlane, tmp_path: Path) -> None:
    """The operator keeps kopf from importing the kubernetes client (17.7 MiB) once its own credentials are
    loaded; a kubeconfig user of another kind (an exec plugin) is handed to the kubernetes package."""
    plugin = tmp_path / "plugin.py"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": "from-exec"},
    }
    plugin.write_text(f"print({json.dumps(json.dumps(credential))})\n")
    execs = kubeconfig_of(
        plane_a,
        tmp_path / "exec",
        {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": sys.executable,
                "args": [str(plugin)],
                "interactiveMode": "Never",
            }
        },
    )
    script = """
import sys
import fiar_kube
from fiar_operator import cli
cfg = fiar_kube.load_config(sys.argv[1])
kept_out = cli.leave_out_generated_client()
import kopf
fiar_kube.Client(cfg, user_agent="t").request("GET", "/api/v1/nodes")
print(type(cfg).__name__, kept_out, "kubernetes.client" in sys.modules)
"""
    plain = subprocess.run(
        [sys.executable, "-c", script, str(plane_a.kubeconfig)], capture_output=True, text=True, timeout=60
    )
    assert plain.stdout.split() == ["Credentials", "True", "False"], plain.stderr[-2000:]
    delegated = subprocess.run([sys.executable, "-c", script, str(execs)], capture_output=True, text=True, timeout=60)
    assert "Unauthorized" in delegated.stderr or "401" in delegated.stderr, delegated.stderr[-2000:]
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, fiar_kube; c = fiar_kube.load_config(sys.argv[1]);"
            " print(type(c).__name__, fiar_kube.authorization(c))",
            str(execs),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert loaded.stdout.split() == ["Configuration", "Bearer", "from-exec"], loaded.stderr[-2000:]


def test_a_kubeconfig_that_names_no_usable_context_is_a_configuration_error(tmp_path: Path) -> None:
    path = tmp_path / "bad"
    for text, message in (
        ("- a list", "not a YAML mapping"),
        ("apiVersion: v1\nclusters: []\n", "no current-context"),
        ("current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\n", "cluster 'c' is not in the kubeconfig"),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\nclusters: [{name: c, cluster: {}}]\n",
            "has no server",
        ),
    ):
        path.write_text(text)
        with pytest.raises(kube.ConfigError, match=message):
            kube.load_config(str(path))


def test_the_api_server_acts_as_the_impersonated_user_and_groups(plane_a: ControlPlane, tmp_path: Path) -> None:
    """The admin's kubeconfig with ``as``: the API server answers as that user, with the groups of
    ``as-groups`` (one Impersonate-Group each), on the lane and through urllib3; a user the kubernetes
    package loads (an exec plugin) is impersonated too (that package drops ``as``: before, its requests
    went out as the admin)."""
    assert plane_a.ca is not None
    crt, key = plane_a.ca.issue("admin-as", organizations=("system:masters",), client=True).write(tmp_path, "admin")
    admin = {"client-certificate": str(crt), "client-key": str(key)}
    jane = kubeconfig_of(plane_a, tmp_path / "jane", {**admin, "as": "jane"})
    masters = kubeconfig_of(
        plane_a, tmp_path / "masters", {**admin, "as": "jane", "as-groups": ["x", "system:masters"]}
    )
    for lane in (True, False):
        with pytest.raises(kube.Forbidden, match='User "jane" cannot list'):
            kube.Client(kube.load_config(str(jane)), user_agent="t", lane=lane).request("GET", "/api/v1/nodes")
        api = kube.Client(kube.load_config(str(masters)), user_agent="t", lane=lane)
        assert api.request("GET", "/api/v1/nodes")["kind"] == "NodeList"
        review = api.request(
            "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body={"kind": "SelfSubjectReview"}
        )
        info = review["status"]["userInfo"]
        assert info["username"] == "jane" and {"x", "system:masters"} <= set(info["groups"])

    namespace = plane_a.create_namespace(f"seam-{uuid.uuid4().hex[:8]}")
    with plane_a.api_client() as api_client:
        client.CoreV1Api(api_client).create_namespaced_service_account(namespace, {"metadata": {"name": "plain"}})
    token = plane_a.service_account_token(namespace, "plain")
    plugin = tmp_path / "plugin.py"
    credential = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": {"token": token}}
    plugin.write_text(f"print({json.dumps(json.dumps(credential))})\n")
    command = {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "args": [str(plugin)]}
    execs = kubeconfig_of(plane_a, tmp_path / "exec", {"exec": {**command, "interactiveMode": "Never"}, "as": "jane"})
    with pytest.raises(kube.Forbidden, match="cannot impersonate"):  # the service account may not impersonate
        kube.Client(kube.load_config(str(execs)), user_agent="t").request("GET", "/api/v1/nodes")
