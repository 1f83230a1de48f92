"""Each new connection of the urllib3 pool makes its own TLS context.

urllib3 handed one context reloads the client certificate files into it (``load_cert_chain``) and sets
its ``verify_mode`` on every connection, while other threads handshake with it; OpenSSL does not allow
that, and the operator died by SIGSEGV at start when its watches opened connections together (a CI
run of 2026-12-06). A context of its own per connection is also what makes a rotated client
certificate the one the next connection presents.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fiar_kube as kube
from devcluster.pki import CertificateAuthority

from .conftest import Answer, Loopback, ServiceAccount

ROOT = Path(__file__).resolve().parents[2]


def _kubeconfig(path: Path, server: str, ca: Path, crt: Path, key: Path) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "u", "user": {"client-certificate": str(crt), "client-key": str(key)}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(json.dumps(doc))
    return path


def _closing(_: Any) -> Answer:
    return Answer(200, {"kind": "NodeList", "items": []}, close=True)


def test_threads_opening_connections_together_with_certificate_files_never_crash_the_process(
    serve: Callable[..., Loopback], service_account: ServiceAccount, tmp_path: Path
) -> None:
    """16 threads, each opening 100 connections (the server closes each) with a client certificate
    in files: the process ends its requests and exits 0 (before, 4 runs of 6 died by SIGSEGV or
    SIGABRT inside urllib3's ``load_cert_chain`` or the handshake beside it)."""
    clients = CertificateAuthority("client-ca")
    (tmp_path / "client-ca.crt").write_bytes(clients.cert_pem)
    crt, key = clients.issue("operator", client=True).write(tmp_path, "client")
    server = serve(_closing, tls=service_account.serving, client_ca=tmp_path / "client-ca.crt")
    config = _kubeconfig(tmp_path / "config", server.url, service_account.ca, crt, key)
    script = textwrap.dedent(
        """
        import sys, threading, fiar_kube as kube
        api = kube.Client(kube.load_config(sys.argv[1]), user_agent="t", environ={}, lane=False, maxsize=16)
        failures = []
        def work():
            for _ in range(100):
                try:
                    api.request("GET", "/api/v1/nodes")
                except Exception as exc:
                    failures.append(repr(exc))
        threads = [threading.Thread(target=work) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(len(failures), failures[:3])
        """
    )
    child = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", script, str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.strip() == "0 []"
    assert len(server.seen) == 1600
    assert {seen.client for seen in server.seen} == {"operator"}


def test_a_rotated_client_certificate_is_presented_on_the_next_connection(
    serve: Callable[..., Loopback], service_account: ServiceAccount, tmp_path: Path
) -> None:
    clients = CertificateAuthority("client-ca")
    (tmp_path / "client-ca.crt").write_bytes(clients.cert_pem)
    crt, key = clients.issue("before", client=True).write(tmp_path, "client")
    server = serve(_closing, tls=service_account.serving, client_ca=tmp_path / "client-ca.crt")
    cfg = kube.load_config(str(_kubeconfig(tmp_path / "config", server.url, service_account.ca, crt, key)))
    for lane in (True, False):
        clients.issue("before", client=True).write(tmp_path, "client")
        api = kube.Client(cfg, user_agent="t", environ={}, lane=lane)
        api.request("GET", "/api/v1/nodes")
        clients.issue("after", client=True).write(tmp_path, "client")  # the same files, rewritten
        api.request("GET", "/api/v1/nodes")
    assert [seen.client for seen in server.seen] == ["before", "after", "before", "after"]
