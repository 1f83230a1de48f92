"""The lane: HTTP/1.1 requests to the API server on kept connections of this package's own."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from .deadline import Timeout, limits, within
from .http1 import UNBOUNDED, Closed, Headers, Reader, check_request, read_body, read_head, request_head
from .proxy import proxy_for
from .tls import tls_context

KEPT_IDLE_S: Final = 60.0
"""Seconds a kept connection may sit idle and still be used: below the API server's own 90 s
(``IdleTimeout`` of k8s.io/apiserver's secure serving), so that no request is sent on a connection
the server is closing."""
_SAFE_AGAIN: Final = frozenset({"GET", "HEAD"})
"""Methods sent again on a new connection when a kept one turns out closed before any answer."""


class Lane:
    """HTTP/1.1 requests to the API server on kept connections, written on ``socket`` and ``ssl``.

    An Event POST through urllib3 costs this process 542-667 µs of CPU on the development machine,
    most of it in urllib3's and ``http.client``'s Python (``email`` parses each answer's headers);
    on this lane 235-283 µs, a GET 168-221 µs against 451-543 (``bench/operator_python_floor.py``,
    BENCHMARKS.md). It carries ``Client.request``. Watch streams stay on urllib3: read on this lane,
    an event cost as much (131-153 µs, most of it TLS and ``json.loads``). ``for_config`` gives None
    for what it does not reproduce exactly (a proxy, a name to check the certificate against that is
    not the server's), and urllib3 carries those requests too.

    Answers are framed by Content-Length, chunked encoding, or the end of the connection; a kept
    connection is used again only when its answer was read whole, the server did not ask to close
    it, no byte is waiting on it, and it was idle less than ``KEPT_IDLE_S``. Thread-safe: each
    request holds its connection alone; at most ``maxsize`` are kept."""

    def __init__(self, cfg: Any, maxsize: int, clock: Callable[[], float] = time.monotonic) -> None:
        parts = urlsplit(str(cfg.host))
        self.tls = parts.scheme == "https"
        self.hostname = parts.hostname or ""
        self.address = (self.hostname, parts.port or (443 if self.tls else 80))
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        self.authority = f"{host}:{parts.port}" if parts.port else host
        """The Host header: host and port only (never a ``user:password@`` of the URL)."""
        self.prefix = parts.path.rstrip("/")
        self.server_hostname = getattr(cfg, "tls_server_name", None) or self.hostname
        self.maxsize = maxsize
        self.socket_options: list[tuple[int, int, int]] | None = getattr(cfg, "socket_options", None)
        self.cfg, self.clock = cfg, clock
        self._kept: list[tuple[Any, float]] = []
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def for_config(cls, cfg: Any, maxsize: int, environ: Mapping[str, str] | None = None) -> Lane | None:
        """The lane for ``cfg``, or None where urllib3 must carry its requests."""
        scheme = urlsplit(str(cfg.host)).scheme
        if scheme not in ("http", "https") or proxy_for(cfg, environ) is not None:
            return None
        if isinstance(getattr(cfg, "assert_hostname", None), str):
            return None
        return cls(cfg, maxsize)

    def request(
        self, method: str, target: str, headers: Headers, body: bytes | None, timeout: Timeout, limit: int
    ) -> tuple[int, str, bytes]:
        """(status, reason, body) of one request; a body of an answer outside 2xx is read up to
        ``limit`` bytes. ``OSError`` or ``Broken`` when the exchange fails; ``Unsendable`` (sending
        nothing) when the request cannot be written as HTTP/1.1."""
        connect_s, read_s, deadline = limits(timeout)
        sock, reader, (status, reason, fields, keep) = self._exchange(
            method, target, headers, body, connect_s, read_s, deadline
        )
        try:
            answer, whole = read_body(reader, method, status, fields, UNBOUNDED if 200 <= status <= 299 else limit)
        except BaseException:
            sock.close()
            raise
        self._give(sock) if keep and whole and not reader.buffer else sock.close()
        return status, reason, answer

    def _exchange(
        self,
        method: str,
        target: str,
        headers: Headers,
        body: bytes | None,
        connect_s: float | None,
        read_s: float | None,
        deadline: float | None,
    ) -> tuple[Any, Reader, tuple[int, str, dict[str, str], bool]]:
        """Send the request and read its answer's head: (connection, its reader, the head)."""
        fields = check_request(method, self.prefix + target, headers)
        length = len(body or b"") if body is not None or method in ("POST", "PUT", "PATCH") else None
        data = request_head(method, self.prefix + target, self.authority, fields, length) + (body or b"")
        while True:
            sock, kept = self._take(connect_s, deadline)
            reader = Reader(sock, read_s, deadline)
            try:
                sock.settimeout(within(reader.read_s, deadline))
                sock.sendall(data)
                return sock, reader, read_head(reader)
            except (Closed, BrokenPipeError, ConnectionResetError):
                sock.close()
                if kept and method in _SAFE_AGAIN:  # the server closed it as it was taken
                    continue
                raise
            except BaseException:
                sock.close()
                raise

    def _take(self, connect_s: float | None, deadline: float | None) -> tuple[Any, bool]:
        now = self.clock()
        while True:
            with self._lock:
                if not self._kept:
                    break
                sock, since = self._kept.pop()
            poll = select.poll()
            poll.register(sock, select.POLLIN)
            waiting = poll.poll(0) or (self.tls and sock.pending())  # bytes on the socket, or decrypted
            if now - since < KEPT_IDLE_S and not waiting:
                return sock, True
            sock.close()  # the server closed it, sent what nobody asked for, or it sat idle too long
        return self._connect(connect_s, deadline), False

    def _connect(self, connect_s: float | None, deadline: float | None) -> Any:
        """A new connection; its TLS settings are read from the configuration's files each time, as
        urllib3 does (a rotated client certificate is used on the next connection)."""
        sock = socket.create_connection(self.address, timeout=within(connect_s, deadline))
        try:
            for option in self.socket_options if self.socket_options is not None else _NODELAY:
                sock.setsockopt(*option)
            if self.tls:
                sock.settimeout(within(connect_s, deadline))  # the handshake gets what time is left
                sock = tls_context(self.cfg).wrap_socket(sock, server_hostname=self.server_hostname)
        except BaseException:
            sock.close()
            raise
        return sock

    def _give(self, sock: Any) -> None:
        with self._lock:
            if not self._closed and len(self._kept) < self.maxsize:
                self._kept.append((sock, self.clock()))
                return
        sock.close()

    def close(self) -> None:
        """Close the kept connections; one still in use is closed when its request ends."""
        with self._lock:
            self._closed = True
            kept, self._kept = self._kept, []
        for sock, _ in kept:
            sock.close()


_NODELAY: Final = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
"""urllib3's default socket options: a request is one write, its answer not held back."""
