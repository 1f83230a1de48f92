"""HTTPS server of the admission webhooks, and a plain-HTTP server for metrics and health.

Both run on an event loop of their own in a background thread, so that reconciliation work on
kopf's loop never delays an admission answer. Routes:

    POST /mutate/pods      pod CREATE webhook
    POST /mutate/binding   pods/binding CREATE webhook
    GET  /healthz          200 while serving
    GET  /readyz           200 once every index has been listed
    GET  /metrics          Prometheus exposition (metrics port only)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from aiohttp import web

from fiar_operator.admission import Admission, Need, parse_review, respond
from fiar_operator.errors import ApiError, ConfigurationError, ReviewError
from fiar_operator.kube import Kube
from fiar_operator.metrics import Metrics
from fiar_operator.settings import Settings

log = logging.getLogger(__name__)

MAX_BODY: Final = 8 * 1024 * 1024
READY_KINDS: Final = ("nodes", "namespaces", "policies", "pods")


class TlsFiles:
    """An SSL context loaded from files and re-loaded when they change (certificate rotation)."""

    def __init__(self, cert: str, key: str) -> None:
        self.cert, self.key = cert, key
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp = self._mtimes()
        self.context.load_cert_chain(cert, key)

    def _mtimes(self) -> tuple[float, float]:
        return os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime

    def reload_if_changed(self) -> bool:
        try:
            stamp = self._mtimes()
            if stamp == self._stamp:
                return False
            self.context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            log.warning("webhook certificate not reloaded: %s", exc)
            return False
        self._stamp = stamp
        log.info("webhook certificate reloaded from %s", self.cert)
        return True


class Server:
    def __init__(
        self,
        admission: Admission,
        metrics: Metrics,
        settings: Settings,
        kube: Kube | None,
        ready: Callable[[], Mapping[str, bool]],
    ) -> None:
        self.admission, self.metrics, self.settings, self.kube = admission, metrics, settings, kube
        self.ready = ready
        self.tls = TlsFiles(str(settings.tls_cert), str(settings.tls_key)) if settings.tls_cert else None
        self.port = 0
        self.metrics_port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="webhook-server", daemon=True)
        self._started = threading.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._error: BaseException | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="webhook-read")

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> None:
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

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        runners: list[web.AppRunner] = []
        try:
            runners.append(
                loop.run_until_complete(
                    self._site(self._webhook_app(), self.settings.webhook_host, self.settings.webhook_port, self.tls)
                )
            )
            self.port = _bound_port(runners[-1])
            if self.settings.metrics_port is not None:
                runners.append(
                    loop.run_until_complete(
                        self._site(self._metrics_app(), self.settings.metrics_host, self.settings.metrics_port, None)
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
            loop.close()

    async def _site(self, app: web.Application, host: str, port: int, tls: TlsFiles | None) -> web.AppRunner:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port, ssl_context=tls.context if tls else None).start()
        return runner

    async def _watch_certificate(self) -> None:
        assert self.tls is not None
        while True:
            await asyncio.sleep(self.settings.tls_reload_interval)
            self.tls.reload_if_changed()

    # -- apps ------------------------------------------------------------------------------------
    def _webhook_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
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
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        synced = self.ready()
        missing = [k for k in READY_KINDS if not synced.get(k)]
        if missing:
            return web.Response(status=503, text=f"not listed yet: {', '.join(missing)}\n")
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
            try:
                review = parse_review(await request.read())
            except ReviewError as exc:
                self.metrics.admission(webhook, "bad_request")
                return web.json_response({"error": str(exc)}, status=400)
            except web.HTTPRequestEntityTooLarge:
                self.metrics.admission(webhook, "bad_request")
                return web.json_response({"error": f"the body exceeds {MAX_BODY} bytes"}, status=413)
            try:
                answer = await self._answer(review, webhook)
            except Exception:
                log.exception("%s webhook failed; the request is allowed unchanged", webhook)
                self.metrics.admission(webhook, "error")
                answer = respond(review)
            return web.json_response(answer)
        finally:
            self.metrics.latency.labels(webhook).observe(time.perf_counter() - started)

    async def _answer(self, review: Any, webhook: str) -> dict[str, Any]:
        if webhook == "pods":
            first = self.admission.pod_create(review, can_read=self.kube is not None)
            if isinstance(first, Need):
                fetched = await self._fetch(first)
                first = self.admission.pod_create(review, fetched=fetched, can_read=False)
        else:
            first = self.admission.binding(review, can_read=self.kube is not None)
            if isinstance(first, Need):
                fetched = await self._fetch(first)
                first = self.admission.binding(review, fetched=fetched, can_read=False)
        return first if not isinstance(first, Need) else respond(review)

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
            log.info("bounded read of %s %s/%s failed: %s", need.kind, need.namespace, need.name, exc)
            return None


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return 0
