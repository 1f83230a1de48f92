"""HTTPS server of the admission webhooks, and a plain-HTTP server for metrics and health.

Both run on an event loop of their own in a background thread, so that reconciliation work on
kopf's loop never delays an admission answer. Routes:

    POST /mutate/pods      pod CREATE webhook
    POST /mutate/binding   pods/binding CREATE webhook
    GET  /healthz          200 while every part makes progress (liveness.py)
    GET  /readyz           200 once every index has been listed (and TLS can complete a handshake)
    GET  /metrics          Prometheus exposition (metrics port only)

The webhook port is reachable by whatever the pod network lets through (the chart's NetworkPolicy
narrows it), so every request is bounded: a body of at most ``MAX_BODY`` bytes read within
``READ_DEADLINE``; parsing and planning on a small thread pool, never on the event loop, answered
fail-open after ``WORK_DEADLINE``, when planning also stops (``limits.Budget``: planning past its
work budget or deadline abandons the review, answered unchanged with a warning, and frees the
thread); at most ``MAX_CONNECTIONS`` connections (over it, the one idle the longest is closed); a
connection that sends no complete request within ``IDLE_TIMEOUT`` (slow headers, or idle) is
closed. The soft limit of open files is raised to the hard one at start.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import resource
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from fiar_operator.admission.review import Admission, Need, Review, parse_review, respond
from fiar_operator.core import limits
from fiar_operator.core.errors import ApiError, ConfigurationError, ReviewError
from fiar_operator.core.liveness import Heartbeats
from fiar_operator.core.metrics import Metrics
from fiar_operator.core.settings import Settings
from fiar_operator.state.kube import Kube

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
"""Open connections per port at most. An idle TLS connection costs about 270 KiB, so this bounds
them to about 70 MiB, and stays far under the usual 1,024 file descriptors."""
IDLE_TIMEOUT: Final = 10.0
"""Seconds a connection may take to send a complete request's headers after it opened or after its
last answer (idle keep-alive connections are closed then too)."""
HANDSHAKE_TIMEOUT: Final = 5.0
"""Seconds for a TLS handshake."""
SHUTDOWN_TIMEOUT: Final = 2.0
"""Seconds a closed TLS connection waits for the peer's close_notify before its socket is freed."""
READY_KINDS: Final = ("nodes", "namespaces", "policies", "pods")
_T = TypeVar("_T")
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
    handshake_timeout: float = HANDSHAKE_TIMEOUT
    pool_stall: float = POOL_STALL


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


class _Job:
    """One review on its way through the thread pool: the body, then the parsed review."""

    def __init__(self, body: bytes, budget: limits.Budget) -> None:
        self.body = body
        self.review: Review | None = None
        self.budget = budget
        """Planning's work budget; its deadline is the review's, so that a review answered on its
        deadline stops planning too and frees its thread."""


class _Budget:
    """Bytes of request bodies held at once: a review waits until its share is free."""

    def __init__(self, total: int) -> None:
        self.total, self.used = total, 0
        self._changed = asyncio.Condition()

    async def acquire(self, size: int) -> int:
        size = min(size, self.total)
        async with self._changed:
            await self._changed.wait_for(lambda: self.used + size <= self.total)
            self.used += size
        return size

    async def release(self, size: int) -> None:
        async with self._changed:
            self.used -= size
            self._changed.notify_all()


SLOW_REQUEST: Final = 1.0
"""Seconds in one request after which a connection may be closed to admit another (the API server
sends a review at once; only a slow body or a stuck answer takes this long)."""


class _Connections:
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
                return server()
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
            return server()

        return make


class _Refused(asyncio.Protocol):
    """A connection admitted over the cap: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.Transport):
            transport.abort()
        else:
            transport.close()


class _Site(web.BaseSite):
    """A TCP site whose connections are counted and capped (``_Connections``)."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        guard: _Connections,
        handshake_timeout: float,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host, self._port, self._guard, self._handshake_timeout = host, port, guard, handshake_timeout

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
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


class Server:
    def __init__(
        self,
        admission: Admission,
        metrics: Metrics,
        settings: Settings,
        kube: Kube | None,
        ready: Callable[[], Mapping[str, bool]],
        bounds: Bounds = Bounds(),
        heartbeats: Heartbeats | None = None,
    ) -> None:
        self.admission, self.metrics, self.settings, self.kube = admission, metrics, settings, kube
        self.ready, self.bounds = ready, bounds
        self.heartbeats = heartbeats if heartbeats is not None else Heartbeats()
        self.tls = TlsFiles(str(settings.tls_cert), str(settings.tls_key)) if settings.tls_cert else None
        self.port = 0
        self.metrics_port = 0
        self.connections = _Connections(bounds.max_connections)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="webhook-server", daemon=True)
        self._started = threading.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._error: BaseException | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="webhook-read")
        self._work = concurrent.futures.ThreadPoolExecutor(
            max_workers=bounds.workers, thread_name_prefix="webhook-work"
        )
        self._budget: _Budget | None = None
        self.progress = _Progress()

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> None:
        _raise_file_limit()
        logging.getLogger("asyncio").addFilter(_ACCEPT_ERRORS)
        logging.getLogger("aiohttp.server").addFilter(_MALFORMED_REQUESTS)
        self._thread.start()
        if not self._started.wait(timeout):
            raise ConfigurationError("the webhook server did not start")
        if self._error is not None:
            raise ConfigurationError(f"the webhook server did not start: {self._error}") from self._error

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._work.shutdown(wait=False, cancel_futures=True)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        runners: list[web.AppRunner] = []
        try:
            self._budget = loop.run_until_complete(_make_budget(bounds_total(self.bounds)))
            runners.append(
                loop.run_until_complete(
                    self._site(
                        self._webhook_app(),
                        self.settings.webhook_host,
                        self.settings.webhook_port,
                        self.tls,
                        self.connections,
                    )
                )
            )
            self.port = _bound_port(runners[-1])
            if self.settings.metrics_port is not None:
                runners.append(
                    loop.run_until_complete(
                        self._site(
                            self._metrics_app(),
                            self.settings.metrics_host,
                            self.settings.metrics_port,
                            None,
                            _Connections(self.bounds.max_connections),
                        )
                    )
                )
                self.metrics_port = _bound_port(runners[-1])
            if self.tls is not None:
                self._tasks.add(loop.create_task(self._watch_certificate()))
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            for task in self._tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
            for runner in runners:
                loop.run_until_complete(runner.cleanup())
            left = asyncio.all_tasks(loop)  # requests of clients that never finished sending
            for task in left:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.close()

    async def _site(
        self, app: web.Application, host: str, port: int, tls: TlsFiles | None, guard: _Connections
    ) -> web.AppRunner:
        app.middlewares.append(_mark_busy(guard))
        runner = web.AppRunner(
            app, access_log=None, keepalive_timeout=self.bounds.idle_timeout, shutdown_timeout=SHUTDOWN_TIMEOUT
        )
        await runner.setup()
        await _Site(runner, host, port, tls.context if tls else None, guard, self.bounds.handshake_timeout).start()
        return runner

    async def _watch_certificate(self) -> None:
        assert self.tls is not None
        while True:
            await asyncio.sleep(self.settings.tls_reload_interval)
            self.tls.reload_if_changed()

    # -- apps ------------------------------------------------------------------------------------
    def _webhook_app(self) -> web.Application:
        app = web.Application(client_max_size=self.bounds.max_body)
        app.router.add_post("/mutate/pods", self._pods)
        app.router.add_post("/mutate/binding", self._binding)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        return app

    def _metrics_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        return app

    async def _healthz(self, _: web.Request) -> web.Response:
        """200 while this loop answers, every heartbeat is within its bound, and the review threads
        finished a review within ``pool_stall`` whenever reviews waited for them; 503 with the reason
        otherwise."""
        silent = self.heartbeats.silent()
        if silent:
            parts = ", ".join(f"{name} for {age:.0f} s" for name, age in silent)
            return web.Response(status=503, text=f"no progress: {parts}\n")
        stalled = self.progress.stalled(self.bounds.pool_stall)
        if stalled is not None:
            waiting, age = stalled
            return web.Response(
                status=503, text=f"no review thread finished a review for {age:.0f} s ({waiting} waiting)\n"
            )
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        synced = self.ready()
        missing = [k for k in READY_KINDS if not synced.get(k)]
        if missing:
            return web.Response(status=503, text=f"not listed yet: {', '.join(missing)}\n")
        if self.tls is not None and not self.tls.usable():
            return web.Response(status=503, text="the webhook certificate cannot complete a TLS handshake\n")
        if self.tls is not None and self.tls.error:
            return web.Response(
                text=f"ok (certificate files not loadable, the previous one is served: {self.tls.error})\n"
            )
        return web.Response(text="ok\n")

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), content_type="text/plain", charset="utf-8")

    # -- webhooks --------------------------------------------------------------------------------
    async def _pods(self, request: web.Request) -> web.Response:
        return await self._serve(request, "pods")

    async def _binding(self, request: web.Request) -> web.Response:
        return await self._serve(request, "binding")

    async def _serve(self, request: web.Request, webhook: str) -> web.Response:
        started = time.perf_counter()
        try:
            return await self._review(request, webhook)
        finally:
            self.metrics.latency.labels(webhook).observe(time.perf_counter() - started)

    async def _review(self, request: web.Request, webhook: str) -> web.Response:
        """Read, parse and answer one review within the bounds of the module docstring."""
        b = self.bounds
        if request.content_length is not None and request.content_length > b.max_body:
            return self._refuse(webhook, 413, f"the body exceeds {b.max_body} bytes")
        assert self._budget is not None
        try:
            share = await asyncio.wait_for(self._budget.acquire(request.content_length or b.max_body), b.read_deadline)
        except asyncio.TimeoutError:
            return self._refuse(webhook, 503, "too many reviews in progress", "busy")
        try:
            body = await asyncio.wait_for(request.read(), b.read_deadline)
        except web.HTTPRequestEntityTooLarge:
            await self._budget.release(share)
            return self._refuse(webhook, 413, f"the body exceeds {b.max_body} bytes")
        except asyncio.TimeoutError:
            await self._budget.release(share)
            return self._refuse(webhook, 408, f"the body did not arrive within {b.read_deadline:g} s")
        except ConnectionError:  # the client went away mid-body: nothing to answer, nothing to log
            await self._budget.release(share)
            return self._refuse(webhook, 400, "the connection was lost")
        job = _Job(body, limits.Budget.within(b.work_deadline))
        del body
        try:
            answer = await asyncio.wait_for(self._answer(job, webhook), b.work_deadline)
        except ReviewError as exc:
            log.warning("%s webhook: malformed review from %s: %.200s", webhook, request.remote, exc)
            return self._refuse(webhook, 400, str(exc))
        except asyncio.TimeoutError:
            if job.review is None:
                return self._refuse(webhook, 503, f"the review was not parsed within {b.work_deadline:g} s", "deadline")
            log.warning(
                "%s webhook: review %.64r not answered within %g s; allowed unchanged",
                webhook,
                job.review.uid,
                b.work_deadline,
            )
            self.metrics.admission(webhook, "deadline")
            answer = respond(job.review)
        except Exception as exc:  # one line, no traceback: hostile input must not flood the log
            assert job.review is not None
            log.warning(
                "%s webhook failed on review %.64r (%s: %.200s); allowed unchanged",
                webhook,
                job.review.uid,
                type(exc).__name__,
                exc,
            )
            self.metrics.admission(webhook, "error")
            answer = respond(job.review)
        finally:
            await self._budget.release(share)
        return web.json_response(answer)

    def _refuse(self, webhook: str, status: int, message: str, result: str = "bad_request") -> web.Response:
        self.metrics.admission(webhook, result)
        return web.json_response({"error": message}, status=status)

    async def _answer(self, job: _Job, webhook: str) -> dict[str, Any]:
        """Parse and answer on the thread pool (one hop); a ``Need`` is read here, then answered there."""
        first = await self._on_review_thread(functools.partial(self._first, job, webhook))
        assert job.review is not None
        if isinstance(first, Need):
            call = self.admission.pod_create if webhook == "pods" else self.admission.binding
            fetched = await self._fetch(first)
            first = await self._on_review_thread(
                functools.partial(call, job.review, fetched=fetched, can_read=False, budget=job.budget)
            )
        return first if not isinstance(first, Need) else respond(job.review)

    def _on_review_thread(self, call: Callable[[], _T]) -> asyncio.Future[_T]:
        """``call`` on a review thread, counted by ``progress`` (for /healthz)."""
        future = self._work.submit(call)
        self.progress.submitted()
        future.add_done_callback(self.progress.done)
        return asyncio.wrap_future(future)

    def _first(self, job: _Job, webhook: str) -> dict[str, Any] | Need:
        body, job.body = job.body, b""
        job.review = parse_review(body)
        del body
        call = self.admission.pod_create if webhook == "pods" else self.admission.binding
        return call(job.review, can_read=self.kube is not None, budget=job.budget)

    async def _fetch(self, need: Need) -> dict[str, Any] | None:
        """A bounded read of an object the indexes lack; None when it fails or takes too long."""
        if self.kube is None:
            return None
        kube, timeout = self.kube, self.settings.read_timeout
        if need.kind == "pod":

            def call() -> dict[str, Any]:
                return kube.get_pod(need.namespace, need.name, timeout=timeout)
        else:

            def call() -> dict[str, Any]:
                return kube.get_namespace(need.namespace, timeout=timeout)

        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._pool, call), timeout=timeout + 0.05)
        except (ApiError, asyncio.TimeoutError) as exc:
            log.info("bounded read of %s %r/%r failed: %.200s", need.kind, need.namespace[:80], need.name[:80], exc)
            return None


class _Progress:
    """Whether the review threads still finish reviews: reviews submitted and not done, and when one
    last finished (or, when none was waiting, when the first of those was submitted). Thread-safe.

    A review cancelled before it ran (its deadline passed while it waited) is no longer waiting but
    is not progress either: threads that all hang would otherwise look alive for as long as new
    reviews keep arriving and timing out behind them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._waiting = 0
        self._since = clock()

    def submitted(self) -> None:
        with self._lock:
            if self._waiting == 0:
                self._since = self.clock()
            self._waiting += 1

    def done(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._waiting -= 1
            if not future.cancelled():
                self._since = self.clock()

    def stalled(self, bound: float) -> tuple[int, float] | None:
        """(reviews waiting, seconds without one finished) when that exceeds ``bound``, else None."""
        with self._lock:
            age = self.clock() - self._since
            return (self._waiting, age) if self._waiting and age > bound else None


def _raise_file_limit() -> None:
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


def bounds_total(bounds: Bounds) -> int:
    """Bytes of bodies held at once: one largest body per worker."""
    return bounds.workers * bounds.max_body


async def _make_budget(total: int) -> _Budget:
    return _Budget(total)  # created on the server's loop (asyncio objects bind to the running loop)


def _mark_busy(guard: _Connections) -> Any:
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


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return 0
