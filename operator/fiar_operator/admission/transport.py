"""The webhook port's transport: connections, bodies and TLS, each bounded.

The port is reachable by whatever the pod network lets through (the chart's NetworkPolicy narrows
it), so every request is bounded: a body of at most ``MAX_BODY`` bytes read within
``READ_DEADLINE``, at most ``MAX_CONNECTIONS`` connections (over it, the one idle the longest is
closed), a new connection that sends no complete request within ``IDLE_TIMEOUT`` (slow headers, or
nothing) closed, an idle one closed ``KEEPALIVE_TIMEOUT`` after its last answer, bodies held at once
bounded (``BodyBudget``). The serving certificate is re-loaded when its
files change (``TlsFiles``). The soft limit of open files is raised to the hard one at start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger(__name__)


MAX_BODY: Final = 4 * 1024 * 1024
"""Bytes of one AdmissionReview at most. The API server refuses request bodies over 3 MiB, so the
object under review is at most that; 1 MiB more covers the envelope (uid, kind, userInfo, options)."""
READ_DEADLINE: Final = 5.0
"""Seconds to receive a request's body (the API server sends it at once; webhooks time out at 1-2 s)."""
WORK_DEADLINE: Final = 0.6
"""Seconds for parsing and answering one review; then it is answered allowed, unchanged (fail-open,
as the API server would on its timeout), so the connection is not held for nothing. It sits 0.4 s
below the webhooks' 1 s timeout (webhookconfig.TIMEOUT_SECONDS), which also covers the API server's
connection, the request's transfer and its wait for the event loop; the binding webhook's bounded
read (at most ``settings.MAX_READ_TIMEOUT``) fits inside it."""
WORKERS: Final = 4
"""Threads that parse and plan reviews; also the reviews whose bodies are held in memory at once."""
MAX_CONNECTIONS: Final = 256
"""Open connections per port at most. An idle TLS connection costs about 76 KiB (``TLS_READ_BUFFER``),
so this bounds them to about 19 MiB, and stays far under the usual 1,024 file descriptors."""
TLS_READ_BUFFER: Final = 32 * 1024
"""Bytes each TLS connection of the webhook port reads into. asyncio gives every TLS connection a
256 KiB buffer, allocated and zeroed when it opens: 300 KiB of resident memory per open connection
(100 connections held by one client, each having sent a 9 KB review: 29.2 MiB), against 76 KiB with
32 KiB (7.4 MiB; ``ServerLoop``). The API server keeps one connection per review in flight, so at 20
concurrent creators and 20 bindings that was 10-12 MiB of the process. A TLS record carries at most
16 KiB, so one read still takes two records."""
IDLE_TIMEOUT: Final = 10.0
"""Seconds a new connection may take to send its first request's headers (slow headers, or a
connection that sends nothing): it is closed then (``Connections.sweep``)."""
KEEPALIVE_TIMEOUT: Final = 120.0
"""Seconds an idle connection is kept after its last answer: longer than the API server keeps an idle
connection to a webhook (90 s: client-go's transport takes Go's ``http.DefaultTransport``
``IdleConnTimeout``, k8s.io/apimachinery ``SetOldTransportDefaults``), so the API server closes it
first. A review the API server sends on a connection the webhook is closing fails with ``EOF`` and is
not retried (a POST): its pod is admitted without fiar's change. Closed after 10 s, 3 of 6,000 managed
pods in one K run met that (2026-12-04, BENCHMARKS.md)."""
HANDSHAKE_TIMEOUT: Final = 5.0
"""Seconds for a TLS handshake."""
SHUTDOWN_TIMEOUT: Final = 2.0
"""Seconds a closed TLS connection waits for the peer's close_notify before its socket is freed."""
POOL_STALL: Final = 5.0
"""Seconds the review threads may go without finishing a review while reviews wait for them: only
threads that all hang stay silent this long (a review takes milliseconds; the largest allowed ones
well under a second). A burst only queues reviews, and they keep finishing, so it never counts."""


@dataclass(frozen=True)
class Bounds:
    """The limits above, as one value (tests use smaller ones)."""

    max_body: int = MAX_BODY
    read_deadline: float = READ_DEADLINE
    work_deadline: float = WORK_DEADLINE
    workers: int = WORKERS
    max_connections: int = MAX_CONNECTIONS
    idle_timeout: float = IDLE_TIMEOUT
    keepalive_timeout: float = KEEPALIVE_TIMEOUT
    handshake_timeout: float = HANDSHAKE_TIMEOUT
    pool_stall: float = POOL_STALL


DEFAULT_BOUNDS: Final = Bounds()


def _server_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


class TlsFiles:
    """The serving certificate, loaded from files and re-loaded when they change (rotation).

    Each load builds a fresh context; it replaces the served one only when the pair loaded, so a
    half-rotated pair (a new certificate beside the old key) never takes TLS down. ``context`` is
    the one the listener holds: it hands every new connection the current context (its SNI
    callback runs for every handshake, with or without a server name).
    """

    def __init__(self, cert: str, key: str) -> None:
        self.cert, self.key = cert, key
        self._stamp = self._mtimes()
        self.current = _server_context(cert, key)
        self.error: str | None = None
        """Why the files on disk could not be loaded at the last attempt (None: they were)."""
        self.context = _server_context(cert, key)
        self.context.sni_callback = self._select

    def _select(self, connection: Any, _server_name: str | None, _context: ssl.SSLContext) -> None:
        connection.context = self.current

    def _mtimes(self) -> tuple[float, float]:
        return os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime

    def reload_if_changed(self) -> bool:
        """Load the files when they changed; whether the served certificate was replaced."""
        try:
            stamp = self._mtimes()
            if stamp == self._stamp:
                return False
            fresh = _server_context(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            self.error = str(exc)
            log.warning("webhook certificate not reloaded, the previous one is still served: %s", exc)
            return False
        self.current, self._stamp, self.error = fresh, stamp, None
        log.info("webhook certificate reloaded from %s", self.cert)
        return True

    def usable(self) -> bool:
        """Whether a TLS handshake with the served context completes (checked in memory)."""
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
        to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
        server_side = self.context.wrap_bio(to_server, to_client, server_side=True)
        client_side = client.wrap_bio(to_client, to_server, server_side=False)
        for _ in range(10):
            done = 0
            for side in (client_side, server_side):
                try:
                    side.do_handshake()
                    done += 1
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
                except ssl.SSLError:
                    return False
            if done == 2:
                return True
        return False


class ServerLoop(asyncio.SelectorEventLoop):
    """The event loop of the webhook and metrics ports: its TLS connections read into
    ``TLS_READ_BUFFER`` bytes instead of asyncio's 256 KiB (``SSLProtocol.max_size``, a class
    attribute asyncio reads for each connection's buffer and each read). A Python whose TLS
    protocol lacks that buffer keeps its own."""

    def _make_ssl_transport(self, *args: Any, **kwargs: Any) -> Any:
        transport = super()._make_ssl_transport(*args, **kwargs)  # type: ignore[misc]
        protocol = getattr(transport, "_ssl_protocol", None)
        if protocol is not None and hasattr(protocol, "_ssl_buffer_view") and protocol.max_size > TLS_READ_BUFFER:
            protocol.max_size = TLS_READ_BUFFER
            protocol._ssl_buffer = bytearray(TLS_READ_BUFFER)
            protocol._ssl_buffer_view = memoryview(protocol._ssl_buffer)
        return transport


class BodyBudget:
    """Bytes of request bodies held at once: a review waits until its share is free."""

    def __init__(self, total: int) -> None:
        self.total, self.used = total, 0
        self._changed = asyncio.Condition()
        self._waiting = 0
        """Reviews waiting in ``acquire``: while any waits, ``take_now`` takes nothing (no review
        jumps the line) and ``release`` wakes them."""

    def take_now(self, size: int) -> int | None:
        """The share at once, when it is free and no review waits for one; None otherwise."""
        size = min(size, self.total)
        if self._waiting or self.used + size > self.total:
            return None
        self.used += size
        return size

    async def acquire(self, size: int) -> int:
        size = min(size, self.total)
        self._waiting += 1
        try:
            async with self._changed:
                await self._changed.wait_for(lambda: self.used + size <= self.total)
                self.used += size
        finally:
            self._waiting -= 1
        return size

    async def release(self, size: int) -> None:
        self.used -= size
        if self._waiting:
            async with self._changed:
                self._changed.notify_all()


SLOW_REQUEST: Final = 1.0
"""Seconds in one request after which a connection may be closed to admit another (the API server
sends a review at once; only a slow body or a stuck answer takes this long)."""


class Connections:
    """The open connections of one site: at most ``limit``. To admit one more, one is closed: first
    one that never completed a request, then one in a request for over ``SLOW_REQUEST``, then the
    one idle the longest, if for over ``SLOW_REQUEST``. When none qualifies, the newcomer is closed:
    a connection that was answered moments ago (the API server's) is never closed for a new one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.busy: dict[object, float] = {}
        """Connection -> when its current request began."""
        self.active: dict[object, float] = {}
        """Connection -> when its last request ended (a connection that never sent one: absent)."""
        self.opened: dict[object, float] = {}
        """Connection -> when it was accepted, until it completes a request (``sweep``)."""
        self.evicted = 0
        self.refused = 0

    def _order(self, handler: object, now: float) -> tuple[int, float] | None:
        if handler in self.busy:
            since = self.busy[handler]
            return (1, since) if now - since > SLOW_REQUEST else None
        if handler not in self.active:
            return (0, 0.0)
        last = self.active[handler]
        return (2, last) if now - last > SLOW_REQUEST else None

    def factory(self, server: web.Server) -> Callable[[], asyncio.Protocol]:
        def make() -> asyncio.Protocol:
            open_ = server.connections
            excess = len(open_) + 1 - self.limit
            if excess <= 0:
                return self._opened(server())
            if len(self.active) > 2 * self.limit:
                alive = set(open_)
                self.active = {h: t for h, t in self.active.items() if h in alive}
            now = time.monotonic()
            ranked = sorted((key, i) for i, h in enumerate(open_) if (key := self._order(h, now)) is not None)
            for _, i in ranked[:excess]:
                handler = open_[i]
                transport = handler.transport
                handler.force_close()
                if transport is not None:
                    transport.abort()  # free the socket now, not after a TLS shutdown
                self.evicted += 1
            if len(ranked) < excess:
                self.refused += 1
                return _Refused()
            return self._opened(server())

        return make

    def _opened(self, handler: asyncio.Protocol) -> asyncio.Protocol:
        self.opened[handler] = time.monotonic()
        return handler

    def sweep(self, server: web.Server, within: float) -> int:
        """Close the connections that have not completed a first request within ``within`` seconds of
        being accepted (slow headers, or nothing sent); the number closed. A connection's handler
        starts once its headers are complete (``busy``), so one still in its TLS handshake or its
        headers is neither busy nor active."""
        now = time.monotonic()
        alive = set(server.connections)
        closed = 0
        for handler, since in list(self.opened.items()):
            if handler in self.active or handler in self.busy:
                del self.opened[handler]  # it sent a request: the keep-alive timeout applies now
            elif now - since > within:
                del self.opened[handler]
                if handler in alive:  # else its handshake failed or it closed: nothing to close
                    assert isinstance(handler, web.RequestHandler)
                    transport = handler.transport
                    handler.force_close()
                    if transport is not None:
                        transport.abort()
                    closed += 1
        return closed


class _Refused(asyncio.Protocol):
    """A connection admitted over the cap: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.Transport):
            transport.abort()
        else:
            transport.close()


class CappedSite(web.BaseSite):
    """A TCP site whose connections are counted and capped (``Connections``)."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        guard: Connections,
        handshake_timeout: float,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host, self._port, self._guard, self._handshake_timeout = host, port, guard, handshake_timeout
        self._idle_timeout = idle_timeout
        self._sweeper: asyncio.Task[None]

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep(server))
        extra: dict[str, Any] = {}
        if self._ssl_context is not None:
            extra["ssl_handshake_timeout"] = self._handshake_timeout
            if sys.version_info >= (3, 11):
                extra["ssl_shutdown_timeout"] = SHUTDOWN_TIMEOUT
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.factory(server),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=True,
            **extra,
        )

    async def _sweep(self, server: web.Server) -> None:
        interval = min(1.0, self._idle_timeout / 2)
        while True:
            await asyncio.sleep(interval)
            self._guard.sweep(server, self._idle_timeout)

    async def stop(self) -> None:
        self._sweeper.cancel()
        await super().stop()


def raise_file_limit() -> None:
    """Raise the soft limit of open files to the hard one (as Go programs do), so that connections
    never exhaust the descriptors the operator's own API connections need."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as exc:
            log.info("open-file limit stays at %d: %s", soft, exc)


class _AcceptErrors(logging.Filter):
    """asyncio logs a traceback for every failed accept() when descriptors run out: keep one line a minute."""

    def __init__(self) -> None:
        super().__init__()
        self._last = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("socket.accept() out of system resource"):
            return True
        now = time.monotonic()
        if now - self._last < 60:
            return False
        self._last = now
        record.exc_info, record.exc_text = None, None
        return True


_ACCEPT_ERRORS: Final = _AcceptErrors()


class _MalformedRequests(logging.Filter):
    """aiohttp logs a traceback for every HTTP message it cannot parse (any client on the port can
    send one): make it one line without the traceback, at most ``per_minute`` a minute, counting the
    lines left out in the next one. Other errors keep their tracebacks."""

    def __init__(self, per_minute: int = 10, clock: Any = time.monotonic) -> None:
        super().__init__()
        self.per_minute, self.clock = per_minute, clock
        self._window = -60.0
        self._lines = 0
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        now = self.clock()
        if now - self._window >= 60:
            self._window, self._lines = now, 0
        if self._lines >= self.per_minute:
            self._dropped += 1
            return False
        self._lines += 1
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        detail = " ".join(str(exc.message or type(exc).__name__).split())[:200]
        more = f" ({self._dropped} more left out)" if self._dropped else ""
        record.msg, record.args = "malformed HTTP request from %s: %s%s", (remote, detail, more)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text = None, None
        self._dropped = 0
        return True


_MALFORMED_REQUESTS: Final = _MalformedRequests()


def install_log_filters() -> None:
    """Keep what any client of the port can make asyncio and aiohttp log to a line a minute."""
    logging.getLogger("asyncio").addFilter(_ACCEPT_ERRORS)
    logging.getLogger("aiohttp.server").addFilter(_MALFORMED_REQUESTS)


def bounds_total(bounds: Bounds) -> int:
    """Bytes of bodies held at once: one largest body per worker."""
    return bounds.workers * bounds.max_body


async def make_body_budget(total: int) -> BodyBudget:
    return BodyBudget(total)  # created on the server's loop (asyncio objects bind to the running loop)


async def open_site(
    app: web.Application, host: str, port: int, tls: TlsFiles | None, guard: Connections, bounds: Bounds
) -> web.AppRunner:
    """Serve ``app`` on ``host:port`` (TLS with ``tls``), its connections counted by ``guard``."""
    app.middlewares.append(mark_busy(guard))
    runner = web.AppRunner(
        app, access_log=None, keepalive_timeout=bounds.keepalive_timeout, shutdown_timeout=SHUTDOWN_TIMEOUT
    )
    await runner.setup()
    site = CappedSite(
        runner, host, port, tls.context if tls else None, guard, bounds.handshake_timeout, bounds.idle_timeout
    )
    await site.start()
    return runner


def mark_busy(guard: Connections) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        protocol = request.protocol
        guard.busy[protocol] = time.monotonic()
        try:
            response: web.StreamResponse = await handler(request)
            return response
        finally:
            guard.busy.pop(protocol, None)
            guard.active[protocol] = time.monotonic()

    return middleware


def bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return 0
