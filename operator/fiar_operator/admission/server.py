"""The webhooks' HTTPS server, and a plain-HTTP server for metrics and health.

Both run on an event loop of their own in a background thread, so that reconciliation work on
kopf's loop never delays an admission answer. Routes (``ROUTES``, one row per webhook):

    POST /mutate/pods      pod CREATE webhook
    POST /mutate/binding   pods/binding CREATE webhook
    POST /validate/policies  FiAllreducePolicy CREATE and UPDATE webhook (validating, always allows)
    GET  /healthz          200 while every part makes progress (liveness.py)
    GET  /readyz           200 once every watched kind has been listed (and TLS can complete a handshake)
    GET  /metrics          Prometheus exposition (metrics port only)
    GET  /indexes          the indexes' sizes as JSON, objects and estimated bytes (metrics port only;
                           ``kubectl fiar status`` reads it through the API server's service proxy)

What reaches a review is bounded by the transport (``transport.py``). A review of at most
``ON_LOOP_BODY`` bytes is answered on the event loop when its planning takes no step of a budget
(a single pod's CREATE or binding: work linear in its body and the policies). One that needs a step
(a group's candidate nodes), and every larger review, goes to a small thread pool, answered
fail-open after ``WORK_DEADLINE``, when planning also stops (``limits.Budget``: planning past its
work budget or deadline abandons the review, answered unchanged with a warning, and frees the
thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from aiohttp import web

from fiar_operator.admission.review import Admission, Need, Review, parse_review, respond
from fiar_operator.admission.transport import (
    DEFAULT_BOUNDS,
    BodyBudget,
    Bounds,
    Connections,
    ServerLoop,
    TlsFiles,
    bound_port,
    bounds_total,
    install_log_filters,
    make_body_budget,
    open_site,
    raise_file_limit,
)
from fiar_operator.core import limits
from fiar_operator.core.errors import ApiError, ConfigurationError, NeedsThread, ReviewError
from fiar_operator.core.liveness import Heartbeats
from fiar_operator.core.metrics import Metrics
from fiar_operator.core.settings import Settings
from fiar_operator.state import kinds
from fiar_operator.state.kube import Kube

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass(frozen=True)
class Route:
    """One webhook: where the API server sends its reviews, and the review's handler."""

    webhook: str
    """The webhook's name in metrics and logs."""
    path: str
    handler: Callable[[Admission], Callable[..., dict[str, Any] | Need]]
    """The ``Admission`` method that answers its reviews."""
    on_loop: bool = False
    """Whether a review of at most ``ON_LOOP_BODY`` bytes is first answered on the event loop, with a
    budget of no planning step (``limits.OnLoop``): one that needs a step goes to a review thread."""


ROUTES: Final = (
    Route("pods", "/mutate/pods", lambda admission: admission.pod_create, on_loop=True),
    Route("binding", "/mutate/binding", lambda admission: admission.binding, on_loop=True),
    Route("policies", "/validate/policies", lambda admission: admission.policy),
)
ON_LOOP_BODY: Final = 16 * 1024
"""Bytes of a review answered on the event loop at most. A Binding's review is about 1 KB, a vLLM
pod's CREATE review 3-10 KB; parsing 16 KiB of JSON takes tens of microseconds, and planning walks
what was parsed a few times. A review's trip to a review thread and back costs the process
115-140 µs of CPU here (``bench/operator_python_floor.py``); a single pod's binding takes 59 µs at
p50 to answer, a vLLM pod's CREATE 331-349 µs (``bench/operator_admission_latency.py``)."""


def encode(answer: Mapping[str, Any]) -> bytes:
    """The body of an answer (on a review thread: the event loop only sends it)."""
    return json.dumps(answer, separators=(",", ":")).encode()


def encoded(answer: Mapping[str, Any] | Need) -> bytes | Need:
    return answer if isinstance(answer, Need) else encode(answer)


class _Job:
    """One review on its way through the thread pool: the body, then the parsed review."""

    def __init__(self, body: bytes, budget: limits.Budget) -> None:
        self.body = body
        self.review: Review | None = None
        self.budget = budget
        """Planning's work budget; its deadline is the review's, so that a review answered on its
        deadline stops planning too and frees its thread."""


class Server:
    def __init__(
        self,
        admission: Admission,
        metrics: Metrics,
        settings: Settings,
        kube: Kube | None,
        ready: Callable[[], Mapping[str, bool]],
        bounds: Bounds = DEFAULT_BOUNDS,
        heartbeats: Heartbeats | None = None,
    ) -> None:
        self.admission, self.metrics, self.settings, self.kube = admission, metrics, settings, kube
        self.ready, self.bounds = ready, bounds
        self.heartbeats = heartbeats if heartbeats is not None else Heartbeats()
        self.tls = TlsFiles(str(settings.tls_cert), str(settings.tls_key)) if settings.tls_cert else None
        self.port = 0
        self.metrics_port = 0
        self.connections = Connections(bounds.max_connections)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="webhook-server", daemon=True)
        self._started = threading.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._error: BaseException | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="webhook-read")
        self._work = concurrent.futures.ThreadPoolExecutor(
            max_workers=bounds.workers, thread_name_prefix="webhook-work"
        )
        self._budget: BodyBudget | None = None
        self.progress = _Progress()

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> None:
        raise_file_limit()
        install_log_filters()
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
        loop = ServerLoop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        runners: list[web.AppRunner] = []
        try:
            self._budget = loop.run_until_complete(make_body_budget(bounds_total(self.bounds)))
            runners.append(
                loop.run_until_complete(
                    open_site(
                        self._webhook_app(),
                        self.settings.webhook_host,
                        self.settings.webhook_port,
                        self.tls,
                        self.connections,
                        self.bounds,
                    )
                )
            )
            self.port = bound_port(runners[-1])
            if self.settings.metrics_port is not None:
                runners.append(
                    loop.run_until_complete(
                        open_site(
                            self._metrics_app(),
                            self.settings.metrics_host,
                            self.settings.metrics_port,
                            None,
                            Connections(self.bounds.max_connections),
                            self.bounds,
                        )
                    )
                )
                self.metrics_port = bound_port(runners[-1])
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

    async def _watch_certificate(self) -> None:
        assert self.tls is not None
        while True:
            await asyncio.sleep(self.settings.tls_reload_interval)
            self.tls.reload_if_changed()

    # -- apps ------------------------------------------------------------------------------------
    def _webhook_app(self) -> web.Application:
        app = web.Application(client_max_size=self.bounds.max_body)
        for route in ROUTES:
            app.router.add_post(route.path, functools.partial(self._serve, route=route))
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        return app

    def _metrics_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/indexes", self._indexes)
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
        missing = kinds.not_listed(self.ready())
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

    async def _indexes(self, _: web.Request) -> web.Response:
        return web.json_response(self.metrics.indexes())

    # -- webhooks --------------------------------------------------------------------------------
    async def _serve(self, request: web.Request, route: Route) -> web.Response:
        started = time.perf_counter()
        try:
            return await self._review(request, route)
        finally:
            self.metrics.latency.labels(route.webhook).observe(time.perf_counter() - started)

    async def _review(self, request: web.Request, route: Route) -> web.Response:
        """Read, parse and answer one review within the transport's bounds and ``work_deadline``."""
        webhook = route.webhook
        b = self.bounds
        if request.content_length is not None and request.content_length > b.max_body:
            return self._refuse(webhook, 413, f"the body exceeds {b.max_body} bytes")
        assert self._budget is not None
        size = request.content_length or b.max_body
        share = self._budget.take_now(size)
        if share is None:
            try:
                share = await asyncio.wait_for(self._budget.acquire(size), b.read_deadline)
            except asyncio.TimeoutError:
                return self._refuse(webhook, 503, "too many reviews in progress", "busy")
        try:
            # A body already received whole is read at once: no deadline, and no task for it.
            reading = request.read()
            body = await (reading if request.content.is_eof() else asyncio.wait_for(reading, b.read_deadline))
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
            answer = await self._answer(job, route)
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
            answer = encode(
                respond(job.review, warnings=[f"pod not configured: not answered within {b.work_deadline:g} s"])
            )
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
            answer = encode(respond(job.review))
        finally:
            await self._budget.release(share)
        return web.Response(body=answer, content_type="application/json")

    def _refuse(self, webhook: str, status: int, message: str, result: str = "bad_request") -> web.Response:
        self.metrics.admission(webhook, result)
        return web.json_response({"error": message}, status=status)

    async def _answer(self, job: _Job, route: Route) -> bytes:
        """Parse, answer and encode: on the event loop where the route allows it and planning takes no
        step, else on the thread pool (one hop), within ``work_deadline`` (``asyncio.TimeoutError``
        past it); a ``Need`` is read here, then answered there."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self.bounds.work_deadline
        first = self._first_on_loop(job, route) if route.on_loop and len(job.body) <= ON_LOOP_BODY else None
        if first is None:
            first = await asyncio.wait_for(
                self._on_review_thread(functools.partial(self._first, job, route, job.budget)),
                self.bounds.work_deadline,
            )
        review = job.review
        assert review is not None
        if isinstance(first, Need):
            fetched = await asyncio.wait_for(self._fetch(first), max(until - loop.time(), 0.0))
            handler = route.handler(self.admission)

            def again() -> bytes | Need:
                return encoded(handler(review, fetched=fetched, can_read=False, budget=job.budget))

            first = await asyncio.wait_for(self._on_review_thread(again), max(until - loop.time(), 0.0))
        return first if not isinstance(first, Need) else encode(respond(review))

    def _on_review_thread(self, call: Callable[[], _T]) -> asyncio.Future[_T]:
        """``call`` on a review thread, counted by ``progress`` (for /healthz)."""
        future = self._work.submit(call)
        self.progress.submitted()
        future.add_done_callback(self.progress.done)
        return asyncio.wrap_future(future)

    def _first_on_loop(self, job: _Job, route: Route) -> bytes | Need | None:
        """The answer made on the event loop, or None when planning needs a review thread (which
        plans the parsed review again, with the review's whole budget)."""
        try:
            return self._first(job, route, limits.OnLoop())
        except NeedsThread:
            return None

    def _first(self, job: _Job, route: Route, budget: limits.Budget) -> bytes | Need:
        """Parse the review (once: a review begun on the loop is already parsed) and answer it."""
        if job.review is None:
            job.review = parse_review(job.body)
            job.body = b""  # planning may hold a review thread a while: the body is not kept meanwhile
        return encoded(route.handler(self.admission)(job.review, can_read=self.kube is not None, budget=budget))

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
