"""Requests on the client's kept connections (``fiar_kube.Lane``): one connection carries request after
request, a connection the server closed is never written to, every framing the API server uses is
read, and an answer that is not HTTP, or never ends, is ``Unavailable`` within the request's time.

The server is a real TCP server on loopback that writes, on each connection it accepts, the bytes a
test scripts for each request it reads."""

from __future__ import annotations

import contextlib
import datetime
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import fiar_kube as kube

Reply = Callable[[bytes], "bytes | Callable[[socket.socket], None] | None"]
"""What to write for one request's head and body: bytes, or a function that writes on the
connection itself (None: close the connection at once)."""


class Scripted:
    """A TCP server on 127.0.0.1: for each request read on a connection, writes ``reply``'s bytes,
    then closes the connection when ``close_after`` says so. Records each connection's port."""

    def __init__(self, reply: Reply, close_after: Callable[[int], bool] = lambda _: False) -> None:
        self.reply, self.close_after = reply, close_after
        self.peers: list[int] = []
        self.requests: list[bytes] = []
        self.closed = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return
            self.peers.append(peer[1])
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._answer(conn)
        except OSError:  # the client went away
            return
        self.closed.set()

    def _answer(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                request, buffer = head + b"\r\n\r\n" + buffer[:length], buffer[length:]
                self.requests.append(request)
                answer = self.reply(request)
                if answer is None:
                    break
                conn.sendall(answer) if isinstance(answer, bytes) else answer(conn)
                if self.close_after(len(self.requests)):
                    break

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    started: list[Scripted] = []

    def start(reply: Reply, close_after: Callable[[int], bool] = lambda _: False) -> Scripted:
        server = Scripted(reply, close_after)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def client(url: str) -> kube.Client:
    cfg = kube.Credentials(url)
    cfg.api_key["BearerToken"] = "Bearer t"
    return kube.Client(cfg, user_agent="t", environ={})


def framed(body: Any, status: str = "200 OK", extra: str = "") -> bytes:
    data = json.dumps(body).encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}\r\n".encode()
        + data
    )


def chunked(body: Any, size: int) -> bytes:
    data = json.dumps(body).encode()
    out = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    for start in range(0, len(data), size):
        piece = data[start : start + size]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + b"0\r\n\r\n"


def test_requests_in_turn_share_one_kept_connection(scripted: Callable[..., Scripted]) -> None:
    server = scripted(lambda _: framed({"kind": "Namespace"}))
    api = client(server.url)
    for _ in range(5):
        assert api.request("GET", "/api/v1/namespaces/a") == {"kind": "Namespace"}
    api.request("POST", "/api/v1/namespaces/a/events", body={"x": 1})
    assert len(server.peers) == 1 and len(server.requests) == 6
    assert server.requests[-1].endswith(b'\r\n\r\n{"x": 1}') and b"Content-Length: 8\r\n" in server.requests[-1]


def test_a_connection_the_server_closed_is_never_written_to(scripted: Callable[..., Scripted]) -> None:
    """The server closes each connection after its answer, without saying so: the next request, a POST
    that must not be sent twice, goes on a new connection and is sent once."""
    server = scripted(lambda _: framed({"kind": "Event"}, "201 Created"), close_after=lambda _: True)
    api = client(server.url)
    api.request("POST", "/api/v1/namespaces/a/events", body={"n": 1})
    assert server.closed.wait(5)
    time.sleep(0.05)  # the end of the connection reaches the client
    api.request("POST", "/api/v1/namespaces/a/events", body={"n": 2})
    assert len(server.peers) == 2 and len(server.requests) == 2


def test_a_connection_the_server_asks_to_close_is_not_kept(scripted: Callable[..., Scripted]) -> None:
    server = scripted(lambda _: framed({}, extra="Connection: close\r\n"))
    api = client(server.url)
    api.request("GET", "/a")
    api.request("GET", "/b")
    assert len(server.peers) == 2


def test_a_get_on_a_kept_connection_closed_as_it_is_sent_is_sent_again(scripted: Callable[..., Scripted]) -> None:
    """The server reads the second request and closes without an answer: a GET goes again on a new
    connection (a POST would be Unavailable: it may have been carried out)."""
    answers = iter([framed({"n": 1}), None, framed({"n": 2})])
    server = scripted(lambda _: next(answers))
    api = client(server.url)
    assert api.request("GET", "/a") == {"n": 1}
    assert api.request("GET", "/b") == {"n": 2}
    assert len(server.peers) == 2 and len(server.requests) == 3


def test_a_post_whose_connection_closes_without_an_answer_is_unavailable(scripted: Callable[..., Scripted]) -> None:
    answers = iter([framed({"n": 1}), None])
    server = scripted(lambda _: next(answers))
    api = client(server.url)
    api.request("GET", "/a")
    with pytest.raises(kube.Unavailable, match="POST /api/v1/namespaces/a/events"):
        api.request("POST", "/api/v1/namespaces/a/events", body={})
    assert len(server.requests) == 2


@pytest.mark.parametrize("size", [1, 7, 4096])
def test_a_chunked_answer_is_read_whole_and_its_connection_kept(scripted: Callable[..., Scripted], size: int) -> None:
    items = [{"metadata": {"name": f"pod-{i}"}} for i in range(300)]
    server = scripted(lambda _: chunked({"kind": "PodList", "items": items}, size))
    api = client(server.url)
    assert api.request("GET", "/api/v1/pods")["items"] == items
    assert api.request("GET", "/api/v1/pods")["items"] == items
    assert len(server.peers) == 1


def test_an_answer_framed_by_the_end_of_its_connection_is_read_whole(scripted: Callable[..., Scripted]) -> None:
    data = json.dumps({"kind": "Node"}).encode()
    server = scripted(lambda _: b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + data, lambda _: True)
    api = client(server.url)
    assert api.request("GET", "/api/v1/nodes/a") == {"kind": "Node"}
    assert api.request("GET", "/api/v1/nodes/a") == {"kind": "Node"}
    assert len(server.peers) == 2


def test_an_interim_answer_is_skipped(scripted: Callable[..., Scripted]) -> None:
    server = scripted(lambda _: b"HTTP/1.1 100 Continue\r\n\r\n" + framed({"kind": "Node"}))
    assert client(server.url).request("GET", "/api/v1/nodes/a") == {"kind": "Node"}


@pytest.mark.parametrize(
    "answer",
    [
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: \u00b2\r\n\r\n".encode("latin-1"),
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * (kube.MAX_HEAD_BYTES + 10),
        b"",
    ],
    ids=[
        "not-http",
        "status",
        "header",
        "length",
        "unicode-digit",
        "short-body",
        "chunk-size",
        "chunk-end",
        "long-head",
        "nothing",
    ],
)
def test_an_answer_that_is_not_http_as_the_api_server_writes_it_is_unavailable(
    scripted: Callable[..., Scripted], answer: bytes
) -> None:
    server = scripted(lambda _: answer, close_after=lambda _: True)
    with pytest.raises(kube.Unavailable, match="GET /api/v1/nodes"):
        client(server.url).request("GET", "/api/v1/nodes", timeout=5.0)


def test_an_error_answer_is_read_up_to_its_bound_and_its_connection_dropped(scripted: Callable[..., Scripted]) -> None:
    body = b'{"kind":"Status","message":"no"}' + b" " * (4 * kube.ERROR_READ)
    server = scripted(
        lambda _: f"HTTP/1.1 500 Internal Server Error\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    )
    api = client(server.url)
    with pytest.raises(kube.Unavailable) as raised:
        api.request("GET", "/api/v1/nodes")
    assert raised.value.status == 500 and len(raised.value.body) <= kube.MAX_ERROR_BODY
    with pytest.raises(kube.Unavailable):
        api.request("GET", "/api/v1/nodes")
    assert len(server.peers) == 2  # the unread rest was never taken for the next answer


def test_an_answer_that_never_ends_is_unavailable_within_the_requests_time(scripted: Callable[..., Scripted]) -> None:
    """Bytes that keep coming, a little at a time, do not extend a total time limit."""

    stop = threading.Event()

    def trickle(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
        while not stop.wait(0.05):
            conn.sendall(b" ")

    server = scripted(lambda _: trickle)
    api = client(server.url)
    started = time.monotonic()
    try:
        with pytest.raises(kube.Unavailable, match="TimeoutError"):
            api.request("GET", "/api/v1/nodes", timeout=0.5)
        assert time.monotonic() - started < 2
    finally:
        stop.set()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_kept_connection_idle_past_its_bound_is_not_used(scripted: Callable[..., Scripted]) -> None:
    """Below the API server's own 90 s, so that no request goes on a connection it is closing."""
    server = scripted(lambda _: framed({}))
    clock = Clock()
    lane = kube.Lane(kube.Credentials(server.url), 4, clock=clock)
    assert lane.request("GET", "/a", {}, None, 5.0, kube.ERROR_READ)[0] == 200
    clock.now += kube.KEPT_IDLE_S - 1
    lane.request("GET", "/b", {}, None, 5.0, kube.ERROR_READ)
    assert len(server.peers) == 1
    clock.now += kube.KEPT_IDLE_S
    lane.request("GET", "/c", {}, None, 5.0, kube.ERROR_READ)
    assert len(server.peers) == 2 and kube.KEPT_IDLE_S < 90


def test_a_transfer_coding_it_cannot_decode_is_read_to_the_end(scripted: Callable[..., Scripted]) -> None:
    """RFC 9112: a Transfer-Encoding whose last coding is not chunked frames the body by the end of
    the connection, whatever Content-Length says."""
    data = json.dumps({"kind": "Node"}).encode()
    head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nContent-Length: 2\r\n\r\n"
    server = scripted(lambda _: head.encode() + data, close_after=lambda _: True)
    api = client(server.url)
    assert api.request("GET", "/api/v1/nodes/a") == {"kind": "Node"}
    assert api.request("GET", "/api/v1/nodes/a") == {"kind": "Node"}
    assert len(server.peers) == 2


def test_the_host_header_names_host_and_port_only(scripted: Callable[..., Scripted]) -> None:
    server = scripted(lambda _: framed({}))
    port = server.url.rsplit(":", 1)[1]
    client(f"http://user:secret@127.0.0.1:{port}").request("GET", "/a")
    assert f"\r\nHost: 127.0.0.1:{port}\r\n".encode() in server.requests[0] and b"secret" not in server.requests[0]


def cn_only_certificate(folder: Path) -> tuple[Path, Path]:
    """A CA, and a serving certificate it signed that names ``localhost`` only in its subject's CN
    (server authentication allowed, no subject alternative names): (the CA's file, the pair's file)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kept-connections-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (folder / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pem = serialization.Encoding.PEM
    private = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (folder / "cn-only.pem").write_bytes(leaf.public_bytes(pem) + private)
    return folder / "ca.crt", folder / "cn-only.pem"


def test_a_certificate_naming_the_server_only_in_its_common_name_is_refused(tmp_path: Path) -> None:
    """As urllib3 2 refuses it: the name must be among the certificate's subject alternative names."""
    ca_file, pair = cn_only_certificate(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pair))
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(65536)
                tls.sendall(framed({}, extra="Connection: close\r\n"))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    cfg = kube.Credentials(f"https://localhost:{listener.getsockname()[1]}")
    cfg.ssl_ca_cert = str(ca_file)
    try:
        with pytest.raises(kube.Unavailable, match="Hostname mismatch"):
            kube.Client(cfg, user_agent="t", environ={}).request("GET", "/a", timeout=5.0)
    finally:
        listener.close()
        thread.join(5)


# -- read strictly (RFC 9112) ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field",
    [b"Content-Length : 2", b"Content-Length\t: 2", b"Bad Name: x", b"B@d: x", b"\xc3\xa9: x", b" folded: x", b": x"],
    ids=["space-before-colon", "tab-before-colon", "space-in-name", "not-a-token", "non-ascii", "folded", "empty"],
)
def test_a_header_field_not_written_as_rfc_9112_asks_is_unavailable(
    scripted: Callable[..., Scripted], field: bytes
) -> None:
    server = scripted(lambda _: b"HTTP/1.1 200 OK\r\n" + field + b"\r\nContent-Length: 2\r\n\r\n{}", lambda _: True)
    with pytest.raises(kube.Unavailable, match="not a header field"):
        client(server.url).request("GET", "/api/v1/nodes", timeout=5.0)


def test_an_answer_framed_by_both_transfer_encoding_and_content_length_closes_its_connection(
    scripted: Callable[..., Scripted],
) -> None:
    """RFC 9112, 6.3: read by Transfer-Encoding; the connection is not used again (the bytes Content-
    Length would have framed differently may be a smuggled answer)."""
    answer = chunked({"kind": "Node"}, 4).replace(b"Transfer-Encoding", b"Content-Length: 3\r\nTransfer-Encoding")
    server = scripted(lambda _: answer)
    api = client(server.url)
    assert api.request("GET", "/api/v1/nodes/a") == {"kind": "Node"}
    assert api.request("GET", "/api/v1/nodes/a") == {"kind": "Node"}
    assert len(server.peers) == 2


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "urllib3"])
@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/api/v1/namespaces/\u00e4", {}),
        ("/api/v1/namespaces/\u4e2d", {}),
        ("/api/v1/namespaces/a b", {}),
        ("/api/v1/nodes", {"X-Note": "\u4e2d"}),
        ("/api/v1/nodes", {"X-Note": "a\r\nInjected: 1"}),
        ("/api/v1/nodes", {"Bad Name": "x"}),
    ],
    ids=["latin-1-path", "cjk-path", "space", "cjk-value", "crlf-value", "bad-name"],
)
def test_a_request_that_cannot_be_written_is_unsendable_and_nothing_is_sent(
    scripted: Callable[..., Scripted], path: str, headers: dict[str, str], lane: bool
) -> None:
    server = scripted(lambda _: framed({}))
    cfg = kube.Credentials(server.url)
    cfg.impersonate = tuple(headers.items())
    with pytest.raises(kube.Unsendable) as raised:
        kube.Client(cfg, user_agent="t", environ={}, lane=lane).request("GET", path)
    assert isinstance(raised.value, kube.Rejected) and raised.value.status is None
    assert not server.requests
    if lane:
        with pytest.raises(kube.Unsendable):
            kube.Lane(cfg, 1).request("GET", path, headers, None, 5.0, kube.ERROR_READ)


# -- every request by its deadline ---------------------------------------------------------------------
def trickling(stop: threading.Event, head: bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n") -> Reply:
    def reply(_: bytes) -> Callable[[socket.socket], None]:
        def write(conn: socket.socket) -> None:
            conn.sendall(head)
            while not stop.wait(0.05):
                conn.sendall(b" ")

        return write

    return reply


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "urllib3"])
def test_a_connect_and_read_timeout_bounds_the_whole_request(scripted: Callable[..., Scripted], lane: bool) -> None:
    """(connect, read) as the LIST pager passes them: a byte every 50 ms satisfies every read, but the
    whole exchange ends by their sum."""
    stop = threading.Event()
    server = scripted(trickling(stop))
    cfg = kube.Credentials(server.url)
    api = kube.Client(cfg, user_agent="t", environ={}, lane=lane)
    started = time.monotonic()
    try:
        with pytest.raises(kube.Unavailable, match="TimeoutError"):
            api.request("GET", "/api/v1/pods", timeout=(0.3, 0.5))
        assert time.monotonic() - started < 3
    finally:
        stop.set()


def test_a_watch_event_that_never_ends_is_unavailable_within_the_read_timeout(
    scripted: Callable[..., Scripted],
) -> None:
    """A watch may stay idle as long as its read timeout, but an event once begun must end within as long."""
    stop = threading.Event()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n100000\r\n{"
    server = scripted(trickling(stop, head))
    api = kube.Client(kube.Credentials(server.url), user_agent="t", environ={})
    started = time.monotonic()
    try:
        with pytest.raises(kube.Unavailable, match="not ended within"):
            list(api.stream("/api/v1/pods", {"watch": "true"}, read_timeout_s=0.5))
        assert time.monotonic() - started < 3
    finally:
        stop.set()


def test_an_idle_watch_is_kept_while_its_events_come_whole(scripted: Callable[..., Scripted]) -> None:
    """Events written whole, apart by more than the read timeout's half, pass: only a begun line is timed."""

    def events(_: bytes) -> Callable[[socket.socket], None]:
        def write(conn: socket.socket) -> None:
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(3):
                time.sleep(0.3)
                line = json.dumps({"type": "ADDED", "object": {"n": i}}).encode() + b"\n"
                conn.sendall(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            conn.sendall(b"0\r\n\r\n")

        return write

    server = scripted(events, close_after=lambda _: True)
    api = kube.Client(kube.Credentials(server.url), user_agent="t", environ={})
    seen = [e["object"]["n"] for e in api.stream("/api/v1/pods", {"watch": "true"}, read_timeout_s=0.5)]
    assert seen == [0, 1, 2]


def test_a_watch_cut_inside_an_event_is_unavailable(scripted: Callable[..., Scripted]) -> None:
    head = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n100\r\n{"type": '
    server = scripted(lambda _: head, close_after=lambda _: True)
    api = kube.Client(kube.Credentials(server.url), user_agent="t", environ={})
    with pytest.raises(kube.Unavailable, match="watch /api/v1/pods"):
        list(api.stream("/api/v1/pods", {"watch": "true"}, read_timeout_s=5))


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "urllib3"])
def test_a_trickled_head_ends_by_the_requests_deadline(scripted: Callable[..., Scripted], lane: bool) -> None:
    """The head itself written a byte every 50 ms (each read is answered, the head never ends)."""
    stop = threading.Event()
    server = scripted(trickling(stop, b"HTTP/1.1 200 OK\r\nX-Slow: "))
    api = kube.Client(kube.Credentials(server.url), user_agent="t", environ={}, lane=lane)
    started = time.monotonic()
    try:
        with pytest.raises(kube.Unavailable, match="TimeoutError"):
            api.request("GET", "/api/v1/pods", timeout=(0.3, 0.5))
        assert time.monotonic() - started < 3
    finally:
        stop.set()
