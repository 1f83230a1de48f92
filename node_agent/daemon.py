"""The node daemon (``fiar-agent run``): probe, publish on the own Node, re-probe when asked.

Triggers of a probe: start-up; the interval; a changed driver version (checked cheaply every
``--driver-check`` seconds); the annotation ``fiar.io/reprobe`` on the own Node (seen through a
watch; cleared once the new verdict is published). Triggers that arrive during a probe are merged
into the next one. After a degraded probe (a step could not answer: GPUs busy or unreadable,
torch/FlashInfer missing, kernels not built) the next one comes after ``--retry-interval`` seconds
(default 600) instead of ``--interval`` (trigger ``retry``); it still skips busy GPUs (idle guard). A probe
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

``Agent.run`` is one loop over explicit triggers (``loop.Trigger``): the watch thread and the signal
handler only post triggers to an ``Inbox``; the loop hands them to ``loop.step``, which decides what
comes next from a typed state (deadlines, backoff, last driver, pending write), does it, and feeds
the result back. Time comes from an injected ``clock.Clock``. The earlier report flows through as a
``report.PreviousReport`` and a probe as a ``probe.ProbeResult``; JSON is only written and parsed.

Run as PID 1 (a container without an init), the daemon also reaps exited processes re-parented to
it (a compiler or rank whose parent was killed), so they neither pile up as zombies nor keep a
killed process group alive; ``childproc`` keeps the exit status of its own children meanwhile.

The resident process imports neither torch nor FlashInfer: every native step runs in a child.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import fiar_contract as contract
from node_agent import childproc, loop
from node_agent import kernel_cache as kernel_cache_mod
from node_agent import report as report_mod
from node_agent.clock import SYSTEM_CLOCK, Clock
from node_agent.errors import ConfigError, PublishError
from node_agent.hardware import Hardware
from node_agent.metrics import AgentMetrics, Health, parse_addr, serve
from node_agent.probe import ProbeConfig, ProbeResult, probe
from node_agent.publish import Backoff, NodePublisher, NodeState, load_client_config
from node_agent.report import PreviousReport

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
        if self.probe.shared_gpu:
            raise ConfigError("a shared-GPU probe labels no node: the daemon never runs one (use fiar-agent probe)")
        self.probe.validate()


class NodeApi(Protocol):
    """The agent's own Node, as ``publish.NodePublisher`` reads, writes and watches it."""

    node_name: str

    def read(self) -> NodeState: ...

    def publish(self, labels: Mapping[str, str], report_text: str) -> dict[str, str | None]: ...

    def clear_reprobe(self, value: str) -> bool: ...

    def watch(
        self,
        on_state: Callable[[NodeState], None],
        stop: threading.Event,
        *,
        on_error: Callable[[PublishError], None] | None = None,
        backoff: Backoff | None = None,
    ) -> None: ...


def draw_jitter() -> float:
    """A backoff's jitter: up to 20% either way, so agents restarted together do not retry in step."""
    return random.uniform(-0.2, 0.2)


class Inbox:
    """Triggers from other threads (the Node watch, signals) to the loop, and the reprobe value seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.wake = threading.Event()
        self._triggers: list[loop.Trigger] = []
        self._reprobe: str | None = None
        self._seen: str | None = None
        """The last ``fiar.io/reprobe`` value on the Node: seen again, it is no new request."""

    def put(self, trigger: loop.Trigger) -> None:
        with self._lock:
            self._triggers.append(trigger)
        self.wake.set()

    def saw_reprobe(self, value: str | None) -> bool:
        """Whether ``value`` (the Node's ``fiar.io/reprobe``) is a new request; queued if so."""
        with self._lock:
            if value is None or value == self._seen:
                self._seen = value
                return False
            self._seen = value
            self._reprobe = value
            self._triggers.append("reprobe")
        self.wake.set()
        return True

    def cleared(self, value: str) -> None:
        """``value`` was removed from the Node: the same value set again later is a new request."""
        with self._lock:
            if self._seen == value:
                self._seen = None

    def take(self) -> tuple[tuple[loop.Trigger, ...], str | None]:
        with self._lock:
            triggers, reprobe = tuple(self._triggers), self._reprobe
            self._triggers, self._reprobe = [], None
        return triggers, reprobe


class Agent:
    def __init__(
        self,
        config: DaemonConfig,
        hardware: Hardware,
        publisher: NodeApi,
        metrics: AgentMetrics,
        health: Health,
        *,
        clock: Clock = SYSTEM_CLOCK,
        jitter: Callable[[], float] = draw_jitter,
    ) -> None:
        self.config = config
        self.hw = hardware
        self.publisher = publisher
        self.metrics = metrics
        self.health = health
        self.clock = clock
        self.jitter = jitter
        self.inbox = Inbox()
        self.last_report: PreviousReport | None = None
        """What the next probe compares with: the Node's report, then the last probe that read the GPUs."""
        self.timing = loop.Timing(
            interval_s=config.interval_s,
            retry_interval_s=config.retry_interval_s,
            driver_check_s=config.driver_check_s,
            api_backoff_max_s=config.api_backoff_max_s,
        )

    # -- triggers from other threads -----------------------------------------------------------
    def stop(self, stop: threading.Event) -> None:
        """End the loop (and any running smoke test) as soon as possible."""
        stop.set()
        self.inbox.put("stop")

    def on_node_state(self, state: NodeState) -> None:
        """Watch callback: a new ``fiar.io/reprobe`` value asks for a probe."""
        value = state.reprobe
        if not self.inbox.saw_reprobe(value):
            return
        assert value is not None
        self.metrics.reprobe_requests.inc()
        node, key = self.publisher.node_name, contract.ANNOTATION_REPROBE
        log.info("reprobe requested on node %s (%s=%s)", node, key, shown(value))

    def _watch(self, stop: threading.Event) -> None:
        def on_error(exc: PublishError) -> None:
            log.warning("watch on node %s interrupted: %s", self.publisher.node_name, exc)

        backoff = Backoff(cap=self.config.api_backoff_max_s)
        self.publisher.watch(self.on_node_state, stop, on_error=on_error, backoff=backoff)

    # -- effects -------------------------------------------------------------------------------
    def _load_previous(self) -> bool:
        """Read the Node's last report (and a pending reprobe request); whether the Node could be read."""
        try:
            state = self.publisher.read()
        except PublishError as exc:
            log.info("previous report not read yet (API: %s)", exc)
            return False
        text = state.annotations.get(contract.ANNOTATION_PROBE_REPORT)
        self.last_report, why = PreviousReport.parse(text)
        if text and self.last_report is None:
            node = self.publisher.node_name
            log.warning(
                "no previous report: %s on node %s is not one (%s)", contract.ANNOTATION_PROBE_REPORT, node, why
            )
        if state.reprobe is not None:
            self.on_node_state(state)
        return True

    def _probe(self, action: loop.Probe, stop: threading.Event) -> ProbeResult | None:
        """One probe; None when the agent was stopped meanwhile."""
        log.info("probe (%s) on node %s", action.name, self.publisher.node_name)
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
        self.metrics.record_probe(action.name, result)
        own = result.as_previous()
        if own.fingerprint or not (self.last_report and self.last_report.fingerprint):
            # a report that could not read the GPUs never replaces one that did: the next probe
            # compares its hardware with the last one that was seen
            self.last_report = own
        log.info("verdict (%s): %s", result.verdict.status, result.labels)
        return result

    def _write(self, action: loop.Write) -> loop.Wrote:
        read = False
        if action.read_previous and action.publish is not None:
            own = self.last_report
            read = self._load_previous()
            if read:
                # The API was down when the probe ran, so it could not keep the Node's verdict.
                if loop.node_verdict_wins(action.publish.labels, self.last_report):
                    log.info("earlier verdict found on node %s; probing again to keep it", self.publisher.node_name)
                    return loop.Wrote("superseded", previous_read=True)
                self.last_report = own  # else the probe's own report stays the one to compare with
        published = False
        try:
            if action.publish is not None:
                changes = self.publisher.publish(action.publish.labels, action.publish.report_text)
                published = True
                self.metrics.record_labels(action.publish.labels)
                log.info("published on node %s: %s", self.publisher.node_name, changes or "no label change")
            if action.clear is not None:
                cleared = self.publisher.clear_reprobe(action.clear)
                log.info("reprobe annotation %s", "cleared" if cleared else "changed meanwhile; kept")
                if cleared:
                    self.inbox.cleared(action.clear)
        except PublishError as exc:
            self.metrics.publish_failures.labels(error=type(exc).__name__).inc()
            return loop.Wrote("failed", previous_read=read, published=published, error=str(exc))
        return loop.Wrote("written", previous_read=read, published=published, cleared=action.clear is not None)

    # -- the loop ------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> int:
        """Probe, publish and re-probe until ``stop``: one loop over ``loop.step``'s actions."""
        timing, clock = self.timing, self.clock
        previous_read = self._load_previous()
        threading.Thread(target=self._watch, args=(stop,), name="node-watch", daemon=True).start()
        self.inbox.put("start")
        state = loop.initial(clock.monotonic(), self.hw.driver_version(), previous_read, timing)
        while True:
            self.health.beat()
            triggers, reprobe = self.inbox.take()
            state = loop.arrive(state, (*triggers, *(("stop",) if stop.is_set() else ())), reprobe)
            state, action = loop.step(state, clock.monotonic(), timing)
            if isinstance(action, loop.Stop):
                break
            if isinstance(action, loop.Probe):
                try:
                    result = self._probe(action, stop)
                except Exception:
                    state = loop.probe_failed(state, clock.monotonic(), action, timing, self.jitter())
                    wait = state.probe_hold_until - clock.monotonic()
                    log.exception("probe failed unexpectedly; retrying later (in %.0fs)", wait)
                    continue
                if result is None:
                    break
                if result.verdict.shared_gpu:  # DaemonConfig.validate refuses it; never publish one regardless
                    raise ConfigError("a shared-GPU verdict labels no node")
                publish = loop.Publish(result.labels, report_mod.dumps(result.report))
                state = loop.probed(state, clock.monotonic(), action, result.verdict.status, publish, timing)
                if state.probe_timer == "retry":
                    log.info("degraded probe: next probe in %.0fs (--retry-interval)", timing.degraded_wait_s)
            elif isinstance(action, loop.Write):
                wrote = self._write(action)
                state = loop.wrote(state, clock.monotonic(), wrote, timing, self.jitter())
                if wrote.outcome == "failed":
                    delay = state.write_at - clock.monotonic()
                    node = self.publisher.node_name
                    log.warning("cannot write to node %s (%s); retry in %.1fs", node, wrote.error, delay)
            elif isinstance(action, loop.CheckDriver):
                current = self.hw.driver_version()
                before, state = state.driver, loop.driver_read(state, current)
                if state.driver != before:
                    log.info("driver version changed: %s -> %s", before, current)
            else:
                clock.wait(self.inbox.wake, action.until - clock.monotonic())
                self.inbox.wake.clear()
            self.metrics.publish_pending.set(1 if state.publish is not None else 0)
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
