"""A kubeconfig is read as client-go reads it: a flag only as a YAML boolean, a CA never together with
insecure-skip-tls-verify, a token file before the token, impersonation handed on; inline PEM data never
left in a file (not even after SIGTERM); the document parsed by libyaml and bounded.

The API server is a real TLS server on loopback (conftest), with certificates of a real CA."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fiar_kube as kube
from devcluster.pki import CertificateAuthority

from .conftest import Answer, Loopback, ServiceAccount

ROOT = Path(__file__).resolve().parents[2]


def answered(seen: Any) -> Answer:
    return Answer(200, {"kind": "NodeList", "items": []})


def write(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    """A kubeconfig of one context; YAML written as given (the flags' quoting is the point)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(json.dumps(doc))  # JSON is YAML: a quoted "false" stays a string
    return path


@pytest.mark.parametrize("flag", ["false", "no", "true", "0", ""])
def test_insecure_skip_tls_verify_as_a_string_is_refused(tmp_path: Path, flag: str) -> None:
    """client-go decodes the field into a Go bool: a string there is a decode error, never "off"."""
    path = write(tmp_path / "config", {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": flag}, {})
    with pytest.raises(kube.ConfigError, match=r"insecure-skip-tls-verify.*not a YAML boolean"):
        kube.load_config(str(path))


def test_a_string_flag_never_sends_the_token_to_a_server_of_another_ca(
    serve: Callable[..., Loopback], service_account: ServiceAccount, tmp_path: Path
) -> None:
    """The attack of the review: the kubeconfig names our CA and ``insecure-skip-tls-verify: 'false'``;
    a server whose certificate another CA signed must not see the token."""
    stranger = CertificateAuthority("another-ca").issue("impostor", hosts=("127.0.0.1",)).write(tmp_path, "impostor")
    server = serve(answered, tls=stranger)
    (tmp_path / "config").write_text(
        textwrap.dedent(f"""\
        apiVersion: v1
        kind: Config
        clusters:
        - name: c
          cluster:
            server: {server.url}
            certificate-authority: {service_account.ca}
            insecure-skip-tls-verify: 'false'
        users:
        - name: u
          user:
            token: secret-token
        contexts:
        - name: x
          context: {{cluster: c, user: u}}
        current-context: x
        """)
    )
    with pytest.raises(kube.ConfigError, match="not a YAML boolean"):
        kube.Client(kube.load_config(str(tmp_path / "config")), user_agent="t", environ={}).request("GET", "/a")
    assert not server.seen


def test_yaml_booleans_are_read_as_booleans(tmp_path: Path) -> None:
    (tmp_path / "config").write_text(
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: no}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    assert kube.load_config(str(tmp_path / "config")).verify_ssl is True
    path = write(tmp_path / "insecure", {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}, {})
    assert kube.load_config(str(path)).verify_ssl is False


@pytest.mark.parametrize("ca", ["certificate-authority", "certificate-authority-data"])
def test_insecure_together_with_a_ca_is_refused_as_client_go_refuses_it(
    tmp_path: Path, service_account: ServiceAccount, ca: str
) -> None:
    value = str(service_account.ca) if ca == "certificate-authority" else base64.b64encode(b"pem").decode()
    path = write(
        tmp_path / "config", {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True, ca: value}, {}
    )
    with pytest.raises(kube.ConfigError, match="a certificate authority together with insecure-skip-tls-verify"):
        kube.load_config(str(path))


def cluster_of(server: Loopback, account: ServiceAccount) -> dict[str, Any]:
    return {"server": server.url, "certificate-authority": str(account.ca)}


def test_a_token_file_wins_over_the_token_as_in_client_go(
    serve: Callable[..., Loopback], service_account: ServiceAccount, tmp_path: Path
) -> None:
    """client-go reads ``tokenFile`` on each request when both are set; ``token`` only while the file
    cannot be read."""
    server = serve(answered, tls=service_account.serving)
    token_file = tmp_path / "token"
    token_file.write_text("from-the-file\n")
    user = {"token": "inline", "tokenFile": str(token_file)}
    api = kube.Client(
        kube.load_config(str(write(tmp_path / "config", cluster_of(server, service_account), user))),
        user_agent="t",
        environ={},
    )
    api.request("GET", "/a")
    token_file.write_text("rotated")
    api.request("GET", "/a")
    assert [s.headers["Authorization"] for s in server.seen] == ["Bearer from-the-file", "Bearer rotated"]

    token_file.unlink()
    fresh = kube.Client(kube.load_config(str(tmp_path / "config")), user_agent="t", environ={})
    fresh.request("GET", "/a")
    assert server.seen[-1].headers["Authorization"] == "Bearer inline"


def test_an_unreadable_token_file_without_a_token_is_a_configuration_error(tmp_path: Path) -> None:
    path = write(tmp_path / "config", {"server": "https://127.0.0.1:1"}, {"tokenFile": str(tmp_path / "missing")})
    with pytest.raises(kube.ConfigError, match="tokenFile"):
        kube.load_config(str(path))


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "urllib3"])
def test_impersonation_is_handed_on_with_every_group(
    serve: Callable[..., Loopback], service_account: ServiceAccount, tmp_path: Path, lane: bool
) -> None:
    server = serve(answered, tls=service_account.serving)
    user = {
        "token": "t",
        "as": "jane",
        "as-uid": "42",
        "as-groups": ["developers", "system:authenticated"],
        "as-user-extra": {"scopes.example.com/team": ["a", "b"]},
    }
    cfg = kube.load_config(str(write(tmp_path / "config", cluster_of(server, service_account), user)))
    kube.Client(cfg, user_agent="t", environ={}, lane=lane).request("GET", "/a")
    fields = [(k.lower(), v) for k, v in server.seen[0].fields if k.lower().startswith("impersonate-")]
    assert sorted(fields) == [
        ("impersonate-extra-scopes.example.com%2fteam", "a"),
        ("impersonate-extra-scopes.example.com%2fteam", "b"),
        ("impersonate-group", "developers"),
        ("impersonate-group", "system:authenticated"),
        ("impersonate-uid", "42"),
        ("impersonate-user", "jane"),
    ]


def test_groups_to_impersonate_without_a_user_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "config", {"server": "https://127.0.0.1:1"}, {"token": "t", "as-groups": ["admins"]})
    with pytest.raises(kube.ConfigError, match="as-groups without as"):
        kube.load_config(str(path))


def pem_user(authority: CertificateAuthority, tmp_path: Path) -> dict[str, str]:
    crt, key = authority.issue("agent", client=True).write(tmp_path, "client")
    user = {
        "client-certificate-data": base64.b64encode(crt.read_bytes()).decode(),
        "client-key-data": base64.b64encode(key.read_bytes()).decode(),
    }
    crt.unlink()
    key.unlink()
    return user


def test_inline_pem_data_reaches_the_server_and_no_file_holds_it(
    serve: Callable[..., Loopback], service_account: ServiceAccount, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that requires a client certificate: the lane, the urllib3 pool and a watch stream each
    present the inline certificate, loaded from memory; the temporary folder stays empty."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    clients = CertificateAuthority("client-ca")
    (tmp_path / "client-ca.crt").write_bytes(clients.cert_pem)
    server = serve(
        lambda seen: (
            Answer(200, chunks=[b'{"type":"ADDED","object":{}}\n']) if "watch" in seen.path else answered(seen)
        ),
        tls=service_account.serving,
        client_ca=tmp_path / "client-ca.crt",
    )
    cluster = {
        "server": server.url,
        "certificate-authority-data": base64.b64encode(service_account.ca.read_bytes()).decode(),
    }
    cfg = kube.load_config(str(write(tmp_path / "config", cluster, pem_user(clients, tmp_path))))
    for lane in (True, False):
        api = kube.Client(cfg, user_agent="t", environ={}, lane=lane)
        assert api.request("GET", "/api/v1/nodes") == {"kind": "NodeList", "items": []}
        assert [e["type"] for e in api.stream("/api/v1/nodes", {"watch": "true"}, read_timeout_s=5)] == ["ADDED"]
    assert len(server.seen) == 4
    assert list(temporary.iterdir()) == []


def test_no_file_of_inline_pem_data_outlives_a_sigterm(
    serve: Callable[..., Loopback], service_account: ServiceAccount, tmp_path: Path
) -> None:
    server = serve(answered, tls=service_account.serving)
    cluster = {"server": server.url, "certificate-authority": str(service_account.ca)}
    path = write(tmp_path / "config", cluster, pem_user(CertificateAuthority("client-ca"), tmp_path))
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    script = (
        "import os, signal, sys, fiar_kube as kube\n"
        "api = kube.Client(kube.load_config(sys.argv[1]), user_agent='t', environ={})\n"
        "api.request('GET', '/api/v1/nodes')\n"
        "print('asked', flush=True)\n"
        "signal.pause()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(path)],
        env={**os.environ, "TMPDIR": str(temporary)},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "asked\n"
        child.send_signal(signal.SIGTERM)
        assert child.wait(10) == -signal.SIGTERM
    finally:
        child.kill()
    assert list(temporary.iterdir()) == []


def test_a_kubeconfig_of_countless_small_nodes_is_refused_in_bounded_time(tmp_path: Path) -> None:
    """The review's 4 MiB document cost 146 s and 1.3 GiB in the pure-Python loader (44 s and 500 MiB
    through libyaml, most of it building Python objects): its YAML events are counted first."""
    path = tmp_path / "config"
    item = b"- {a: b, c: [1, 2]}\n"
    path.write_bytes(b"clusters:\n" + item * ((kube.KUBECONFIG_MAX - 16) // len(item)))
    started = time.monotonic()
    with pytest.raises(kube.ConfigError, match=f"over {kube.KUBECONFIG_EVENTS} YAML events"):
        kube.load_config(str(path))
    assert time.monotonic() - started < 10
    path.write_bytes(b"clusters: " + b"[" * (kube.KUBECONFIG_MAX // 2) + b"]")
    with pytest.raises(kube.ConfigError):
        kube.load_config(str(path))
    path.write_bytes(b"a: b\n" + b"#" * kube.KUBECONFIG_MAX)
    with pytest.raises(kube.ConfigError, match="over"):
        kube.load_config(str(path))


def test_kopf_connects_with_the_same_tls_context_and_impersonation(
    serve: Callable[..., Loopback], service_account: ServiceAccount, tmp_path: Path
) -> None:
    """The operator's kopf login hands kopf the seam's TLS context (inline PEM from memory) and its
    Impersonate-* fields: kopf's own aiohttp session is what reaches the server."""
    import asyncio

    import aiohttp

    from fiar_operator.handlers import connection

    clients = CertificateAuthority("client-ca")
    (tmp_path / "client-ca.crt").write_bytes(clients.cert_pem)
    server = serve(answered, tls=service_account.serving, client_ca=tmp_path / "client-ca.crt")
    cluster = {
        "server": server.url,
        "certificate-authority-data": base64.b64encode(service_account.ca.read_bytes()).decode(),
    }
    user = {**pem_user(clients, tmp_path), "as": "jane", "as-groups": ["a", "b"]}
    info = connection(kube.load_config(str(write(tmp_path / "config", cluster, user))))

    async def get() -> int:
        connector = aiohttp.TCPConnector(ssl=info.as_ssl_context())
        async with (
            aiohttp.ClientSession(connector=connector, headers=info.as_http_headers()) as session,
            session.get(f"{server.url}/api/v1/nodes") as answer,
        ):
            return answer.status

    assert asyncio.run(get()) == 200
    groups = [v for k, v in server.seen[0].fields if k.lower() == "impersonate-group"]
    assert groups == ["a", "b"] and server.seen[0].headers["Impersonate-User"] == "jane"


def test_kubectl_fiar_reads_its_kubeconfig_through_the_seam(tmp_path: Path) -> None:
    """``kubectl fiar --context`` picks a context; a string flag there is refused as everywhere else."""
    from kubectl_fiar import cli

    doc = json.loads(write(tmp_path / "config", {"server": "https://127.0.0.1:1"}, {"token": "t"}).read_text())
    doc["clusters"].append({"name": "d", "cluster": {"server": "https://10.0.0.1:6443"}})
    doc["contexts"].append({"name": "other", "context": {"cluster": "d", "user": "u"}})
    (tmp_path / "config").write_text(json.dumps(doc))
    assert cli.load_config(str(tmp_path / "config"), "other").host == "https://10.0.0.1:6443"
    assert cli.load_config(str(tmp_path / "config"), None).host == "https://127.0.0.1:1"
    with pytest.raises(cli.CliError, match="nowhere"):
        cli.load_config(str(tmp_path / "config"), "nowhere")
    doc["clusters"][1]["cluster"]["insecure-skip-tls-verify"] = "false"
    (tmp_path / "config").write_text(json.dumps(doc))
    with pytest.raises(cli.CliError, match="not a YAML boolean"):
        cli.load_config(str(tmp_path / "config"), "other")
