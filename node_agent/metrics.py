"""Prometheus metrics and the /metrics + /healthz endpoint of the daemon.

Metrics (own registry, plus the process collector: ``process_resident_memory_bytes`` is the
agent's RSS):

``fiar_agent_probes_total{trigger,status}``            probes run, by trigger (``loop.Trigger``, joined
                                                       by ``+`` when several) and ok/degraded
``fiar_agent_probe_duration_seconds``                  length of the last probe
``fiar_agent_last_probe_timestamp_seconds``            when the last probe finished
``fiar_agent_label{key,value}``                        1 for each label value currently published
``fiar_agent_smoke_step_seconds{backend,step}``        step durations of the last smoke tests (jit apart)
``fiar_agent_publish_failures_total{error}``           failed writes to the API server
``fiar_agent_publish_pending``                         1 while a verdict waits for the API server
``fiar_agent_reprobe_requests_total``                  ``fiar.io/reprobe`` requests seen

/healthz answers 200 while the run loop (or a running probe) has shown life within the stale
limit, 503 otherwise: a wedged agent is restarted, a busy one is not.

The port is open to the pod network, so no client holds a thread for long: a connection idle for
``IDLE_TIMEOUT_S`` is closed, one still open after ``CONNECTION_DEADLINE_S`` (a slow drip) is shut
down, and at most ``MAX_CONNECTIONS`` are served at once: a new one shuts the oldest down, so a
flood of idle connections cannot lock out the kubelet's health check.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

import fiar_contract as contract
from node_agent.errors import ConfigError

if TYPE_CHECKING:
    from node_agent.probe import ProbeResult


class Health:
    """A heartbeat the loop and running probes beat; stale after ``stale_after_s``."""

    def __init__(self, stale_after_s: float) -> None:
        self.stale_after_s = stale_after_s
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def beat(self) -> None:
        with self._lock:
            self._last = time.monotonic()

    def healthy(self) -> bool:
        with self._lock:
            return time.monotonic() - self._last <= self.stale_after_s


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        r = self.registry
        self.probes = Counter("fiar_agent_probes", "Probes run.", ["trigger", "status"], registry=r)
        self.probe_duration = Gauge("fiar_agent_probe_duration_seconds", "Length of the last probe.", registry=r)
        self.last_probe = Gauge("fiar_agent_last_probe_timestamp_seconds", "When the last probe finished.", registry=r)
        self.label = Gauge("fiar_agent_label", "1 for each published label value.", ["key", "value"], registry=r)
        self.smoke_step = Gauge(
            "fiar_agent_smoke_step_seconds", "Step durations of the last smoke tests.", ["backend", "step"], registry=r
        )
        self.publish_failures = Counter(
            "fiar_agent_publish_failures", "Failed writes to the API server.", ["error"], registry=r
        )
        self.publish_pending = Gauge("fiar_agent_publish_pending", "1 while a verdict waits for the API.", registry=r)
        self.reprobe_requests = Counter("fiar_agent_reprobe_requests", "fiar.io/reprobe requests seen.", registry=r)

    def record_probe(self, trigger: str, result: ProbeResult) -> None:
        self.probes.labels(trigger=trigger, status=result.verdict.status).inc()
        self.probe_duration.set(round(result.duration_s, 3))
        self.last_probe.set(time.time())
        for backend, outcome in result.tests.items():
            for step, seconds in outcome.measured.steps.items():
                self.smoke_step.labels(backend=backend, step=step).set(float(seconds))

    def record_labels(self, labels: Mapping[str, str]) -> None:
        self.label.clear()
        for key in contract.AGENT_LABELS:
            if key in labels:
                self.label.labels(key=key, value=labels[key]).set(1)


IDLE_TIMEOUT_S = 5.0
"""A connection that sends or takes nothing for this long is closed."""
CONNECTION_DEADLINE_S = 15.0
"""No connection stays open longer than this, however slowly it sends."""
MAX_CONNECTIONS = 16
"""Connections served at once (one thread each); a new one shuts the oldest down."""


class BoundedHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server whose connections are bounded in number and in time."""

    daemon_threads = True
    request_queue_size = 128
    """Listen backlog: connections waiting to be accepted while a flood is being cut down."""

    def __init__(
        self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler], *, max_connections: int, deadline_s: float
    ) -> None:
        self.max_connections = max_connections
        self.deadline_s = deadline_s
        self._open: dict[Any, float] = {}
        """Open connections and their deadlines, oldest first."""
        self._open_lock = threading.Lock()
        super().__init__(addr, handler)

    @property
    def open_connections(self) -> int:
        with self._open_lock:
            return len(self._open)

    def _end(self, conn: Any) -> None:
        """Wake the connection's thread: its next read sees the end of the stream, and it exits."""
        self._open.pop(conn, None)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            while len(self._open) >= self.max_connections:
                self._end(next(iter(self._open)))
            self._open[request] = time.monotonic() + self.deadline_s
        super().process_request(request, client_address)

    def service_actions(self) -> None:
        """Called by ``serve_forever`` every poll interval: shut down connections past their deadline."""
        now = time.monotonic()
        with self._open_lock:
            for conn in [c for c, deadline in self._open.items() if deadline <= now]:
                self._end(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away or was cut off is no error of the agent's: no traceback in its log."""

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.pop(request, None)
        super().shutdown_request(request)


def parse_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--metrics-addr must be HOST:PORT, got {addr!r}")
    return host or "0.0.0.0", int(port)


def serve(
    addr: str,
    metrics: AgentMetrics,
    health: Health,
    *,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
    deadline_s: float = CONNECTION_DEADLINE_S,
    max_connections: int = MAX_CONNECTIONS,
) -> BoundedHTTPServer:
    """Start /metrics and /healthz on ``addr`` in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        timeout = idle_timeout_s  # socket timeout of every read and write of the connection

        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/metrics":
                body, status, ctype = generate_latest(metrics.registry), 200, CONTENT_TYPE_LATEST
            elif self.path.split("?")[0] == "/healthz":
                ok = health.healthy()
                body, status, ctype = (b"ok\n" if ok else b"stale\n"), (200 if ok else 503), "text/plain"
            else:
                body, status, ctype = b"not found\n", 404, "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
            pass

    host, port = parse_addr(addr)
    try:
        server = BoundedHTTPServer((host, port), Handler, max_connections=max_connections, deadline_s=deadline_s)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {addr}: {exc}") from exc
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="metrics", daemon=True).start()
    return server
