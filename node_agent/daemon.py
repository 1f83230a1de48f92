"""The node daemon (``fiar-agent run``): probe, publish on the own Node, re-probe when asked.

Triggers of a probe: start-up; the interval; a changed driver version (checked cheaply every
``--driver-check`` seconds); the annotation ``fiar.io/reprobe`` on the own Node (seen through a
watch; cleared once the new verdict is published). Triggers that arrive during a probe are merged
into the next one. After a degraded probe (a step could not answer: GPUs busy or unreadable,
torch/FlashInfer missing, kernels not built) the next one comes after ``--retry-interval`` seconds
(default 600) instead of ``--interval``; it still skips busy GPUs (idle guard). A probe
that cannot conclude never writes ``none`` (docs/DESIGN.md#verdict-none; ``verdict`` applies it).

The previous report is read from the Node's ``fiar.io/probe-report`` at start; an annotation that
cannot be read as a report (too large, not JSON, too deeply nested, wrong version or shape) counts
as no previous report, with the reason logged. When the API cannot be read at start, the probe runs
without it, and the report is read before the first write: if that probe concluded nothing and the
Node has a verdict, the agent probes again with it rather than write "no verdict" over it. A report
whose GPUs could not be read never replaces, as the next probe's comparison, one whose GPUs could.

A verdict that cannot be written (API server down, Node not registered yet, RBAC) stays pending
and is retried with exponential backoff; the labels are written as soon as the API answers. An
unexpected error inside a probe is logged and retried later: the daemon never exits on its own,
so it never crash-loops. SIGTERM/SIGINT cancel a running smoke test (its process group is killed)
and end the loop with exit code 0.

Run as PID 1 (a container without an init), the daemon also reaps exited processes re-parented to
it (a compiler or rank whose parent was killed), so they neither pile up as zombies nor keep a
killed process group alive; ``childproc`` keeps the exit status of its own children meanwhile.

The resident process imports neither torch nor FlashInfer: every native step runs in a child.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fiar_contract as contract
from node_agent import childproc
from node_agent import kernel_cache as kernel_cache_mod
from node_agent import report as report_mod
from node_agent.errors import ConfigError, PublishError
from node_agent.hardware import Hardware
from node_agent.metrics import AgentMetrics, Health, parse_addr, serve
from node_agent.probe import ProbeConfig, probe
from node_agent.publish import Backoff, NodePublisher, NodeState, load_client_config

log = logging.getLogger("fiar-agent")

SHOWN_CHARS = 80
"""At most this many characters of an untrusted value (the reprobe annotation) reach the log."""


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """An untrusted value for the log: ``repr`` (newlines and control characters escaped, so it
    stays one line that forges none) of at most ``limit`` characters, with the length cut off."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


@dataclass(frozen=True)
class DaemonConfig:
    node_name: str
    kubeconfig: str | None
    probe: ProbeConfig
    interval_s: float = 6 * 3600.0
    retry_interval_s: float = 600.0
    """Wait after a degraded probe (capped by ``interval_s``)."""
    driver_check_s: float = 60.0
    metrics_addr: str = "0.0.0.0:9400"
    api_backoff_max_s: float = 60.0
    health_stale_s: float = 120.0
    kernel_cache: str | None = None
    """Writable folder for FlashInfer's kernels, seeded from ``kernel_seed`` (``kernel_cache``)."""
    kernel_seed: str = str(kernel_cache_mod.DEFAULT_SEED)

    @classmethod
    def from_args(cls, args: argparse.Namespace, probe_config: ProbeConfig) -> DaemonConfig:
        config = cls(
            node_name=args.node_name or "",
            kubeconfig=args.kubeconfig or None,
            probe=probe_config,
            interval_s=args.interval,
            retry_interval_s=args.retry_interval,
            driver_check_s=args.driver_check,
            metrics_addr=args.metrics_addr,
            api_backoff_max_s=args.api_backoff_max,
            kernel_cache=args.kernel_cache or None,
            kernel_seed=args.kernel_seed,
        )
        config.validate()
        return config

    def validate(self) -> None:
        if not self.node_name:
            raise ConfigError("no node name: set NODE_NAME (downward API spec.nodeName) or pass --node-name")
        if not self.interval_s > 0:
            raise ConfigError(f"--interval must be positive, got {self.interval_s}")
        if not self.retry_interval_s > 0:
            raise ConfigError(f"--retry-interval must be positive, got {self.retry_interval_s}")
        if not self.driver_check_s > 0:
            raise ConfigError(f"--driver-check must be positive, got {self.driver_check_s}")
        if not self.api_backoff_max_s > 0:
            raise ConfigError(f"--api-backoff-max must be positive, got {self.api_backoff_max_s}")
        if self.metrics_addr:
            parse_addr(self.metrics_addr)
        if self.kernel_cache and not os.path.isdir(self.kernel_seed):
            raise ConfigError(f"--kernel-seed {self.kernel_seed}: no such folder (the image's prebuilt kernels)")
        self.probe.validate()


class Agent:
    def __init__(
        self,
        config: DaemonConfig,
        hardware: Hardware,
        publisher: NodePublisher,
        metrics: AgentMetrics,
        health: Health,
    ) -> None:
        self.config = config
        self.hw = hardware
        self.publisher = publisher
        self.metrics = metrics
        self.health = health
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._triggers: list[str] = []
        self._reprobe_seen: str | None = None
        self._reprobe_requested: str | None = None
        self.last_report: dict[str, Any] | None = None
        self.previous_read = False
        """Whether the Node's earlier report was read (the API may be down at start)."""
        self.probes_done = 0

    # -- triggers ------------------------------------------------------------------------------
    def request(self, trigger: str) -> None:
        with self._lock:
            if trigger not in self._triggers:
                self._triggers.append(trigger)
        self._wake.set()

    def stop(self, stop: threading.Event) -> None:
        """End the loop (and any running smoke test) as soon as possible."""
        stop.set()
        self._wake.set()

    def on_node_state(self, state: NodeState) -> None:
        """Watch callback: a new ``fiar.io/reprobe`` value asks for a probe."""
        value = state.reprobe
        with self._lock:
            if value is None:
                self._reprobe_seen = None
                return
            if value == self._reprobe_seen:
                return
            self._reprobe_seen = value
            self._reprobe_requested = value
        self.metrics.reprobe_requests.inc()
        node, key = self.publisher.node_name, contract.ANNOTATION_REPROBE
        log.info("reprobe requested on node %s (%s=%s)", node, key, shown(value))
        self.request("reprobe")

    def _take(self) -> tuple[list[str], str | None]:
        with self._lock:
            triggers, self._triggers = self._triggers, []
            reprobe = self._reprobe_requested if "reprobe" in triggers else None
            if reprobe is not None:
                self._reprobe_requested = None
        return triggers, reprobe

    # -- loop ----------------------------------------------------------------------------------
    def _load_previous(self) -> bool:
        """Read the Node's last report (and a pending reprobe request); whether the Node could be read."""
        try:
            state = self.publisher.read()
        except PublishError as exc:
            log.info("previous report not read yet (API: %s)", exc)
            return False
        self.previous_read = True
        text = state.annotations.get(contract.ANNOTATION_PROBE_REPORT)
        self.last_report, why = report_mod.parse(text)
        if text and self.last_report is None:
            node = self.publisher.node_name
            log.warning(
                "no previous report: %s on node %s is not one (%s)", contract.ANNOTATION_PROBE_REPORT, node, why
            )
        if state.reprobe is not None:
            self.on_node_state(state)
        return True

    def _watch(self, stop: threading.Event) -> None:
        def on_error(exc: PublishError) -> None:
            log.warning("watch on node %s interrupted: %s", self.publisher.node_name, exc)

        backoff = Backoff(cap=self.config.api_backoff_max_s)
        self.publisher.watch(self.on_node_state, stop, on_error=on_error, backoff=backoff)

    def _probe(self, triggers: list[str], stop: threading.Event) -> dict[str, Any] | None:
        trigger = "+".join(triggers)
        log.info("probe (%s) on node %s", trigger, self.publisher.node_name)
        result = probe(
            self.hw,
            self.config.probe,
            progress=lambda line: log.info("  %s", line),
            cancel=stop,
            heartbeat=self.health.beat,
            previous=self.last_report,
            node=self.publisher.node_name,
        )
        if stop.is_set():
            return None
        self.metrics.record_probe(trigger, result.report)
        if result.report.get("fingerprint") or not (self.last_report or {}).get("fingerprint"):
            # a report that could not read the GPUs never replaces one that did: the next probe
            # compares its hardware with the last one that was seen
            self.last_report = result.report
        self.probes_done += 1
        log.info("verdict (%s): %s", result.report["status"], result.labels)
        return result.report

    def run(self, stop: threading.Event) -> int:
        cfg = self.config
        self._load_previous()
        threading.Thread(target=self._watch, args=(stop,), name="node-watch", daemon=True).start()
        self.request("start")
        now = time.monotonic()
        next_interval = now + cfg.interval_s
        next_driver = now + cfg.driver_check_s
        driver = self.hw.driver_version()
        pending: tuple[dict[str, str], str] | None = None
        clear: str | None = None
        next_write = 0.0
        publish_backoff = Backoff(cap=cfg.api_backoff_max_s)
        probe_backoff = Backoff(initial=30.0, cap=max(30.0, cfg.interval_s))
        next_probe_retry = 0.0

        while not stop.is_set():
            self.health.beat()
            now = time.monotonic()
            if now >= next_probe_retry:
                triggers, reprobe = self._take()
            else:
                triggers, reprobe = [], None
            if triggers:
                try:
                    doc = self._probe(triggers, stop)
                except Exception:
                    log.exception("probe failed unexpectedly; retrying later")
                    with self._lock:
                        self._triggers = triggers + [t for t in self._triggers if t not in triggers]
                        if reprobe is not None and self._reprobe_requested is None:
                            self._reprobe_requested = reprobe
                    next_probe_retry = time.monotonic() + probe_backoff.next_delay()
                    continue
                if doc is None:
                    break
                probe_backoff.reset()
                pending = (dict(doc["labels"]), report_mod.dumps(doc))
                if reprobe is not None:  # "" is a request too
                    clear = reprobe
                next_write = 0.0
                wait_s = cfg.interval_s
                if doc["status"] == "degraded":
                    wait_s = min(cfg.retry_interval_s, cfg.interval_s)
                    log.info("degraded probe: next probe in %.0fs (--retry-interval)", wait_s)
                next_interval = time.monotonic() + wait_s

            now = time.monotonic()
            own = self.last_report
            if pending is not None and not self.previous_read and now >= next_write and self._load_previous():
                # The API was down when the probe ran, so it could not keep the Node's verdict. If the
                # probe concluded nothing and the Node has a verdict, probe again with it instead of
                # writing "no verdict" over it; else the probe's own report stays the one to compare with.
                had = (self.last_report or {}).get("labels") or {}
                if contract.LABEL_BACKEND not in pending[0] and contract.LABEL_BACKEND in had:
                    log.info("earlier verdict found on node %s; probing again to keep it", self.publisher.node_name)
                    pending = None
                    self.request("previous-report")
                    continue
                self.last_report = own
            if (pending is not None or clear is not None) and now >= next_write:
                try:
                    if pending is not None:
                        changes = self.publisher.publish(*pending)
                        self.metrics.record_labels(pending[0])
                        log.info("published on node %s: %s", self.publisher.node_name, changes or "no label change")
                        pending = None
                    if clear is not None:
                        cleared = self.publisher.clear_reprobe(clear)
                        log.info("reprobe annotation %s", "cleared" if cleared else "changed meanwhile; kept")
                        if cleared:
                            with self._lock:  # the same value set again later is a new request
                                if self._reprobe_seen == clear:
                                    self._reprobe_seen = None
                        clear = None
                    publish_backoff.reset()
                except PublishError as exc:
                    self.metrics.publish_failures.labels(error=type(exc).__name__).inc()
                    delay = publish_backoff.next_delay()
                    log.warning("cannot write to node %s (%s); retry in %.1fs", self.publisher.node_name, exc, delay)
                    next_write = time.monotonic() + delay
            self.metrics.publish_pending.set(1 if pending is not None else 0)

            now = time.monotonic()
            if now >= next_driver:
                next_driver = now + cfg.driver_check_s
                current = self.hw.driver_version()
                if current is not None and current != driver:
                    log.info("driver version changed: %s -> %s", driver, current)
                    driver = current
                    self.request("driver-change")
            if now >= next_interval:
                next_interval = now + cfg.interval_s
                self.request("interval")

            deadlines = [next_driver, next_interval]
            if pending is not None or clear is not None:
                deadlines.append(next_write)
            if next_probe_retry > now:
                deadlines.append(next_probe_retry)
            wait = min(deadlines) - time.monotonic()
            self._wake.wait(max(0.05, min(wait, 5.0)) if math.isfinite(wait) else 5.0)
            self._wake.clear()
        log.info("stopping")
        return 0


def seed_kernel_cache(config: DaemonConfig) -> None:
    """Point the smoke tests' ``FLASHINFER_WORKSPACE_BASE`` at the image-keyed kernel cache."""
    if not config.kernel_cache:
        return
    seed, cache = Path(config.kernel_seed), Path(config.kernel_cache)
    try:
        folder = kernel_cache_mod.prepare(seed, cache)
    except OSError as exc:  # a full or read-only disk: probe with the image's kernels as they are
        log.warning("kernel cache %s not seeded (%s); FlashInfer uses %s as it is", cache, exc, seed)
        os.environ["FLASHINFER_WORKSPACE_BASE"] = str(seed)
        return
    os.environ["FLASHINFER_WORKSPACE_BASE"] = str(folder)
    log.info("kernel cache %s (seeded from %s)", folder, seed)


def main(config: DaemonConfig, hardware: Hardware) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    seed_kernel_cache(config)
    client_config = load_client_config(config.kubeconfig)
    publisher = NodePublisher(client_config, config.node_name)
    metrics = AgentMetrics()
    health = Health(stale_after_s=config.health_stale_s)
    server = serve(config.metrics_addr, metrics, health) if config.metrics_addr else None
    if server is not None:
        host, port = server.server_address[:2]
        log.info("serving /metrics and /healthz on http://%s:%s", host, port)
    stop = threading.Event()
    agent = Agent(config, hardware, publisher, metrics, health)

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s", signal.Signals(signum).name)
        agent.stop(stop)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if os.getpid() == 1:
        childproc.start_reaper(stop)
        log.info("running as PID 1: reaping orphaned child processes")
    log.info("fiar-agent on node %s, hardware %s", config.node_name, hardware.description)
    try:
        return agent.run(stop)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
