"""The webhook port under hostile clients: bodies, slow and idle connections, too many connections,
deep JSON, expensive reviews, and a certificate rotation that goes wrong."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import json
import logging
import os
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import pki
from fiar_operator.admission.server import Bounds, Server

from .held_server import start_held_server

SMALL = Bounds(max_body=64 * 1024, read_deadline=0.5, work_deadline=0.5, max_connections=6, idle_timeout=0.6)


@pytest.fixture
def ca() -> pki.CertificateAuthority:
    return pki.CertificateAuthority()


@pytest.fixture
def served(ca: pki.CertificateAuthority, tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    server, admission = start_held_server(ca, tmp_path, SMALL)
    yield server, tmp_path
    admission.release.set()
    server.stop()


def context(workdir: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(workdir / "ca.crt"))


def review(uid: str = "u", **request: Any) -> bytes:
    body = {"uid": uid, "operation": "CREATE", "namespace": "ml", "object": {"metadata": {}, "spec": {}}, **request}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}).encode()


def post(server: Server, workdir: Path, body: bytes, timeout: float = 5) -> tuple[int, Any]:
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context(workdir), timeout=timeout)
    try:
        conn.request("POST", "/mutate/pods", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def tls_socket(server: Server, workdir: Path) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    return context(workdir).wrap_socket(raw, server_hostname="127.0.0.1")


def closed_by_server(sock: ssl.SSLSocket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except (ssl.SSLError, ConnectionError):
        return True


def readyz(server: Server) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=5)
    conn.request("GET", "/readyz")
    response = conn.getresponse()
    return response.status, response.read().decode()


def test_a_body_larger_than_the_api_server_sends_is_refused_unread(served: tuple[Server, Path]) -> None:
    server, workdir = served
    big = review(labels_padding="x" * (SMALL.max_body + 1))
    status, answer = post(server, workdir, big)
    assert status == 413 and "exceeds" in answer["error"]
    assert post(server, workdir, review())[0] == 200


def test_a_slow_body_is_cut_off_and_other_reviews_are_answered(served: tuple[Server, Path]) -> None:
    server, workdir = served
    slow = tls_socket(server, workdir)
    slow.sendall(b"POST /mutate/pods HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
    assert post(server, workdir, review())[0] == 200
    slow.settimeout(5)
    assert slow.recv(100).startswith(b"HTTP/1.1 408")
    slow.close()


def test_slow_headers_and_idle_connections_are_closed(served: tuple[Server, Path]) -> None:
    server, workdir = served
    idle, slow = tls_socket(server, workdir), tls_socket(server, workdir)
    for _ in range(4):  # a header line every 0.2 s never completes the request within the timeout
        slow.sendall(b"X-Slow: 1\r\n" if _ else b"POST /mutate/pods HTTP/1.1\r\n")
        time.sleep(0.2)
    assert closed_by_server(slow, 3) and closed_by_server(idle, 3)


def test_over_the_connection_cap_the_longest_idle_connection_makes_room(served: tuple[Server, Path]) -> None:
    server, workdir = served
    held = [tls_socket(server, workdir) for _ in range(SMALL.max_connections)]
    time.sleep(0.1)
    assert post(server, workdir, review())[0] == 200
    assert closed_by_server(held[0], 0.3)
    assert server.connections.evicted >= 1
    for sock in held:
        sock.close()


def test_over_the_cap_slow_requests_are_closed_and_a_prompt_connection_is_kept(
    ca: pki.CertificateAuthority, tmp_path: Path
) -> None:
    server, admission = start_held_server(ca, tmp_path, Bounds(max_connections=4, read_deadline=10, idle_timeout=10))
    try:
        prompt = http.client.HTTPSConnection("127.0.0.1", server.port, context=context(tmp_path), timeout=5)
        prompt.request("POST", "/mutate/pods", review("first"))
        first = prompt.getresponse()
        assert first.status == 200 and first.read()
        slow = []
        for _ in range(3):
            sock = tls_socket(server, tmp_path)
            sock.sendall(b"POST /mutate/pods HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
            slow.append(sock)
        time.sleep(0.2)
        with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
            post(server, tmp_path, review("too-early"))  # nothing may be closed for it yet
        assert server.connections.refused == 1
        time.sleep(1.1)  # the slow requests are now over SLOW_REQUEST
        assert post(server, tmp_path, review("newcomer"))[0] == 200
        prompt.request("POST", "/mutate/pods", review("again"))
        assert prompt.getresponse().status == 200  # the prompt connection was kept
        assert sum(closed_by_server(sock, 0.5) for sock in slow) >= 1
        for sock in slow:
            sock.close()
        prompt.close()
    finally:
        admission.release.set()
        server.stop()


def test_deeply_nested_json_is_a_400_logged_on_one_line(
    served: tuple[Server, Path], caplog: pytest.LogCaptureFixture
) -> None:
    server, workdir = served
    caplog.set_level(logging.INFO)
    deep = b'{"kind": "AdmissionReview", "request": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    status, answer = post(server, workdir, deep)
    assert status == 400 and "deeply" in answer["error"]
    deep_object = review(object={"metadata": {"labels": {"a": json.loads("[" * 900 + "]" * 900)}}, "spec": {}})
    status, answer = post(server, workdir, deep_object)
    assert status == 200 and answer["response"]["allowed"] is True
    records = [r for r in caplog.records if r.name.startswith("fiar_operator")]
    assert records and all(r.exc_info is None and "\n" not in r.getMessage() for r in records)


def test_a_review_that_takes_long_does_not_hold_up_others(served: tuple[Server, Path]) -> None:
    server, workdir = served
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = pool.submit(post, server, workdir, review("held"))
        time.sleep(0.1)
        assert post(server, workdir, review("quick"), timeout=2)[0] == 200
        status, answer = held.result(5)
    deadline = server.bounds.work_deadline
    assert status == 200
    assert answer["response"] == {
        "uid": "held",
        "allowed": True,
        "warnings": [f"fiar: pod not configured: not answered within {deadline:g} s"],
    }  # the client that created the pod is told why it runs with vLLM's defaults
    assert server.metrics.admissions.labels("pods", "deadline")._value.get() == 1


def test_a_failed_rotation_keeps_serving_the_previous_certificate(
    served: tuple[Server, Path], ca: pki.CertificateAuthority, tmp_path: Path
) -> None:
    server, workdir = served
    other = tmp_path / "other"
    other.mkdir()
    new_crt, _ = ca.issue("second", hosts=("127.0.0.1",)).write(other, "serving")
    (workdir / "serving.crt").write_bytes(new_crt.read_bytes())  # a new certificate beside the old key
    os.utime(workdir / "serving.crt", (time.time() + 5, time.time() + 5))
    assert server.tls is not None and not server.tls.reload_if_changed()
    with tls_socket(server, workdir) as sock:
        assert dict(p[0] for p in sock.getpeercert()["subject"])["commonName"] == "first"  # type: ignore[index,misc]
    status, text = readyz(server)
    assert status == 200 and "previous one is served" in text


def test_readiness_fails_while_tls_cannot_complete_a_handshake(served: tuple[Server, Path]) -> None:
    server, _ = served
    assert readyz(server)[0] == 200
    assert server.tls is not None
    server.tls.current = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # no certificate at all
    status, text = readyz(server)
    assert status == 503 and "handshake" in text


MALFORMED = [
    b"G\x01T / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /mutate/pods HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    b"POST /mutate/pods HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /mutate/pods HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n",
    b"POST /mutate/pods HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /mutate/pods HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
    b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /mutate/pods HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"b" * 20_000 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
]


def test_a_malformed_http_message_is_one_log_line_without_a_traceback(
    served: tuple[Server, Path], caplog: pytest.LogCaptureFixture
) -> None:
    server, workdir = served
    caplog.set_level(logging.DEBUG)
    for message in MALFORMED:
        for connect in (lambda: tls_socket(server, workdir),
                        lambda: socket.create_connection(("127.0.0.1", server.metrics_port), timeout=5)):
            sock = connect()
            try:
                sock.sendall(message)
                sock.settimeout(2)
                with contextlib.suppress(TimeoutError, ssl.SSLError, ConnectionError):
                    sock.recv(4096)
            finally:
                sock.close()
    status, _answer = post(server, workdir, review())
    assert status == 200, "the port still answers"
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING and (r.exc_info or "\n" in r.getMessage())]
    assert not loud, [r.getMessage() for r in loud]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("malformed HTTP request from")]
    assert lines and len(lines) <= 10, lines


def test_an_open_tls_connection_holds_a_small_read_buffer(ca: pki.CertificateAuthority, tmp_path: Path) -> None:
    """asyncio gives each TLS connection a 256 KiB buffer of its own; the webhook port's are
    ``TLS_READ_BUFFER`` (32 KiB), and a review larger than one buffer still arrives whole."""
    import tracemalloc

    from fiar_operator.admission.transport import TLS_READ_BUFFER

    server, admission = start_held_server(ca, tmp_path, Bounds(max_connections=64))
    held: list[ssl.SSLSocket] = []
    try:
        assert post(server, tmp_path, review(labels_padding="x" * (3 * TLS_READ_BUFFER)))[0] == 200
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            request = b"POST /mutate/pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            for i in range(32):
                sock = tls_socket(server, tmp_path)
                body = review(uid=f"u{i}")
                sock.sendall(request + b"Content-Length: %d\r\n\r\n" % len(body) + body)
                assert sock.recv(12) == b"HTTP/1.1 200"
                held.append(sock)
            per_connection = (tracemalloc.get_traced_memory()[0] - before) / len(held)
        finally:
            tracemalloc.stop()
        assert per_connection < 2 * TLS_READ_BUFFER + 16 * 1024, per_connection
    finally:
        for sock in held:
            sock.close()
        admission.release.set()
        server.stop()


API_SERVER_IDLE_CONN_TIMEOUT = 90.0
"""Seconds the API server keeps an idle connection to a webhook: client-go's transport takes Go's
``http.DefaultTransport`` ``IdleConnTimeout`` (k8s.io/apimachinery ``SetOldTransportDefaults``)."""


def test_an_answered_connection_outlives_the_api_servers_own_idle_timeout(
    ca: pki.CertificateAuthority, tmp_path: Path
) -> None:
    """The API server sends a review on any connection it holds idle, and a review sent as the webhook
    closes that connection fails (EOF, not retried): the webhook must keep an answered connection
    longer than the API server does, while a new one that sends nothing is still closed soon."""
    from fiar_operator.admission.transport import IDLE_TIMEOUT, KEEPALIVE_TIMEOUT

    assert KEEPALIVE_TIMEOUT > API_SERVER_IDLE_CONN_TIMEOUT > IDLE_TIMEOUT
    bounds = Bounds(max_connections=8, idle_timeout=0.3, keepalive_timeout=1.5)
    server, admission = start_held_server(ca, tmp_path, bounds)
    try:
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context(tmp_path), timeout=5)
        silent = tls_socket(server, tmp_path)
        for uid in ("first", "after-idle"):
            conn.request("POST", "/mutate/pods", review(uid), {"Content-Type": "application/json"})
            response = conn.getresponse()
            assert response.status == 200 and json.loads(response.read())["response"]["uid"] == uid
            time.sleep(0.9)  # idle three times the new-connection bound: still open
        assert closed_by_server(silent, 0.1)
        sock = conn.sock
        assert sock is not None and closed_by_server(sock, 3)  # past the keep-alive timeout
        conn.close()
    finally:
        admission.release.set()
        server.stop()
