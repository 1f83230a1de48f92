"""The HTTPS webhook server: routes, readiness, and certificate rotation from files."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import pki
from fiar_operator.admission.review import Admission
from fiar_operator.admission.server import Server
from fiar_operator.core.metrics import Metrics
from fiar_operator.core.settings import Settings
from fiar_operator.state import kinds
from fiar_operator.state.store import Store


@pytest.fixture
def ca() -> pki.CertificateAuthority:
    return pki.CertificateAuthority()


@pytest.fixture
def served(ca: pki.CertificateAuthority, tmp_path: Path) -> Iterator[tuple[Server, Store, Path]]:
    crt, key = ca.issue("first", hosts=("127.0.0.1",)).write(tmp_path, "serving")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    store = Store()
    metrics = Metrics(store.sizes)
    settings = Settings(
        webhook_host="127.0.0.1", webhook_port=0, tls_cert=crt, tls_key=key, metrics_host="127.0.0.1", metrics_port=0
    )
    server = Server(Admission(store, metrics), metrics, settings, None, lambda: store.synced)
    server.start()
    yield server, store, tmp_path
    server.stop()


def peer_common_name(port: int, cafile: Path) -> str:
    ctx = ssl.create_default_context(cafile=str(cafile))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        cert = tls.getpeercert()
    assert cert is not None
    subject = dict(pair[0] for pair in cert["subject"])  # type: ignore[misc]
    return str(subject["commonName"])


def test_rotated_certificate_is_served_to_new_connections(
    served: tuple[Server, Store, Path], ca: pki.CertificateAuthority
) -> None:
    server, _, workdir = served
    assert peer_common_name(server.port, workdir / "ca.crt") == "first"
    assert server.tls is not None and not server.tls.reload_if_changed()
    time.sleep(0.01)
    ca.issue("second", hosts=("127.0.0.1",)).write(workdir, "serving")
    os.utime(workdir / "serving.crt", (time.time() + 5, time.time() + 5))
    assert server.tls.reload_if_changed()
    assert peer_common_name(server.port, workdir / "ca.crt") == "second"


def test_half_written_certificate_keeps_the_old_one(served: tuple[Server, Store, Path]) -> None:
    server, _, workdir = served
    (workdir / "serving.crt").write_text("-----BEGIN CERTIFICATE-----\ntruncated")
    os.utime(workdir / "serving.crt", (time.time() + 5, time.time() + 5))
    assert server.tls is not None and not server.tls.reload_if_changed()
    assert peer_common_name(server.port, workdir / "ca.crt") == "first"


def test_readiness_waits_for_every_index_and_metrics_are_exposed(served: tuple[Server, Store, Path]) -> None:
    server, store, _ = served
    plain = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=5)
    plain.request("GET", "/readyz")
    response = plain.getresponse()
    assert response.status == 503 and b"nodes" in response.read()
    for kind in kinds.WATCHED:
        store.replace_all(kind, [])
    plain.request("GET", "/readyz")
    response = plain.getresponse()
    assert response.status == 200 and response.read() == b"ok\n"
    plain.request("GET", "/metrics")
    body = plain.getresponse().read().decode()
    assert 'fiar_index_objects{index="pods"} 0.0' in body


def test_webhook_answers_and_counts_requests(served: tuple[Server, Store, Path]) -> None:
    server, _, workdir = served
    ctx = ssl.create_default_context(cafile=str(workdir / "ca.crt"))
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=ctx, timeout=5)
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "x", "operation": "CREATE", "namespace": "ml", "object": {"metadata": {}}},
    }
    conn.request("POST", "/mutate/pods?timeout=5s", json.dumps(review))
    response = conn.getresponse()
    assert response.status == 200
    assert json.loads(response.read())["response"] == {"uid": "x", "allowed": True}
    conn.request("POST", "/mutate/binding", b"{")
    response = conn.getresponse()
    assert response.status == 400 and "not JSON" in json.loads(response.read())["error"]
    conn.request("GET", "/mutate/pods")
    assert conn.getresponse().status == 405
    exposition = server.metrics.exposition().decode()
    assert 'fiar_webhook_duration_seconds_count{webhook="pods"} 1.0' in exposition
    assert 'fiar_admission_requests_total{result="bad_request",webhook="binding"} 1.0' in exposition


def test_pod_whose_namespace_labels_are_unknown_is_not_taken_by_an_excluding_policy(
    served: tuple[Server, Store, Path],
) -> None:
    server, store, workdir = served
    store.put_policy(
        {
            "metadata": {"name": "all-but-secret"},
            "spec": {
                "podSelector": {},
                "namespaceSelector": {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
            },
        }
    )
    ctx = ssl.create_default_context(cafile=str(workdir / "ca.crt"))
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=ctx, timeout=5)
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "vllm"}]}}
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "x", "operation": "CREATE", "namespace": "vault", "object": pod},
    }
    conn.request("POST", "/mutate/pods", json.dumps(review))
    answer = json.loads(conn.getresponse().read())["response"]
    assert answer["allowed"] is True and "patch" not in answer
    assert any("vault unknown" in w for w in answer["warnings"])
    exposition = server.metrics.exposition().decode()
    assert 'fiar_admission_requests_total{result="namespace_unknown",webhook="pods"} 1.0' in exposition
