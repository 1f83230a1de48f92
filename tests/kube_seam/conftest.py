"""Small real HTTP(S) servers on loopback that stand in for the API server (and for a proxy).

Each records what it received (method, path, headers) and answers with what the test scripted:
a status and JSON body, or a chunked watch stream written line by line.
"""

from __future__ import annotations

import json
import ssl
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from devcluster.pki import CertificateAuthority


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    fields: list[tuple[str, str]] = field(default_factory=list)
    """Every header field as received, repeated names included."""
    client: str | None = None
    """The common name of the client certificate presented (a server with ``client_ca``)."""


@dataclass
class Answer:
    status: int = 200
    body: Any = field(default_factory=dict)
    chunks: list[bytes] | None = None
    """A chunked answer (a watch stream) instead of ``body``."""
    close: bool = False
    """Close the connection after the answer (``Connection: close``)."""


Script = Callable[[Seen], Answer]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client hanging up on a stream is expected
            super().handle_error(request, client_address)


class Loopback:
    """A threaded HTTP/1.1 server on 127.0.0.1; ``tls`` serves HTTPS with a certificate for 127.0.0.1."""

    def __init__(self, script: Script, tls: tuple[Path, Path] | None = None, client_ca: Path | None = None) -> None:
        self.script = script
        self.seen: list[Seen] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                headers = dict(self.headers.items())
                seen = Seen(self.command, self.path, headers, self.rfile.read(length), list(self.headers.items()))
                peer = self.connection.getpeercert() if hasattr(self.connection, "getpeercert") else None
                if peer:
                    seen.client = dict(pair[0] for pair in peer["subject"]).get("commonName")
                outer.seen.append(seen)
                answer = outer.script(seen)
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                if answer.close:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                if answer.chunks is not None:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in answer.chunks:
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    return
                data = json.dumps(answer.body).encode() if not isinstance(answer.body, bytes) else answer.body
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            if client_ca is not None:  # a client certificate this CA signed is required
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(str(client_ca))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[..., Loopback]]:
    started: list[Loopback] = []

    def start(script: Script, tls: tuple[Path, Path] | None = None, client_ca: Path | None = None) -> Loopback:
        server = Loopback(script, tls, client_ca)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


@dataclass(frozen=True)
class ServiceAccount:
    """The files a pod's service account mounts, and a serving certificate for 127.0.0.1."""

    folder: Path
    ca: Path
    token: Path
    serving: tuple[Path, Path]


@pytest.fixture
def service_account(tmp_path: Path) -> ServiceAccount:
    authority = CertificateAuthority("kube-seam-test-ca")
    folder = tmp_path / "serviceaccount"
    folder.mkdir()
    (folder / "ca.crt").write_bytes(authority.cert_pem)
    (folder / "token").write_text("first-token")
    serving = authority.issue("apiserver", hosts=("127.0.0.1",)).write(tmp_path, "apiserver")
    return ServiceAccount(folder, folder / "ca.crt", folder / "token", serving)
