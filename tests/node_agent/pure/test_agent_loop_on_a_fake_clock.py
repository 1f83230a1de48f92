"""The daemon's one loop, run whole on a clock that moves only when it waits, against an in-memory
Node whose API server can be down: hours of deadlines, backoff and outages in a second, no sleeping.
The same behaviours against a real kube-apiserver are in ``test_daemon_*``."""

from __future__ import annotations

import heapq
import itertools
import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import fiar_contract as contract
from node_agent import inventory
from node_agent import report as report_mod
from node_agent.daemon import Agent, DaemonConfig
from node_agent.errors import ApiUnavailable, PublishError
from node_agent.hardware import SimulatedHardware
from node_agent.metrics import AgentMetrics, Health
from node_agent.probe import ProbeConfig, probe
from node_agent.publish import Backoff, NodeState

H200X2 = {
    contract.LABEL_BACKEND: "trtllm",
    contract.LABEL_MULTICAST: "disabled",
    contract.LABEL_MULTICAST_USABLE: "forbidden",
    contract.LABEL_MNNVL: "skipped",
    contract.LABEL_TRTLLM: "pass",
    contract.LABEL_GPUS: "2",
    contract.LABEL_COMPUTE_CAPABILITY: "9.0",
}
H200X1 = {
    contract.LABEL_BACKEND: "none",
    contract.LABEL_MULTICAST: "disabled",
    contract.LABEL_MULTICAST_USABLE: "forbidden",
    contract.LABEL_MNNVL_WORKSPACE: "no-multicast",
    contract.LABEL_MNNVL: "skipped",
    contract.LABEL_TRTLLM: "skipped",
    contract.LABEL_GPUS: "1",
    contract.LABEL_COMPUTE_CAPABILITY: "9.0",
    contract.LABEL_FLASHINFER: "0.6.13",
}
START = 1000.0
QUICK = ProbeConfig(timeout_s=30, benchmark=False)


class FakeClock:
    """Time that moves only while the loop waits; what is scheduled with ``after`` happens on time."""

    def __init__(self, limit_s: float = 7 * 24 * 3600.0) -> None:
        self.now = START
        self._limit = START + limit_s
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def after(self, seconds: float, action: Callable[[], None]) -> None:
        """Run ``action`` ``seconds`` after the start."""
        heapq.heappush(self._due, (START + seconds, next(self._order), action))

    def monotonic(self) -> float:
        return self.now

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        deadline = self.now + max(0.0, timeout_s)
        while not event.is_set() and self._due and self._due[0][0] <= deadline:
            when, _, action = heapq.heappop(self._due)
            self.now = max(self.now, when)
            action()
        if event.is_set():
            return True
        self.now = deadline
        assert self.now <= self._limit, "the loop ran past the test's end without stopping"
        return False

    @property
    def elapsed(self) -> float:
        return self.now - START


class FakeNode:
    """The agent's own Node in memory, as ``NodePublisher`` reads, writes and clears it, on an API
    server that can be down (``up``). Changes made with ``annotate`` reach the agent as a watch would."""

    def __init__(
        self, clock: FakeClock, labels: Mapping[str, str] | None = None, annotations: Mapping[str, str] | None = None
    ) -> None:
        self.node_name = "gpu-0"
        self.clock = clock
        self.up = True
        self.labels = dict(labels or {})
        self.annotations = dict(annotations or {})
        self.version = 1
        self.calls: list[tuple[str, float, bool]] = []
        """(call, seconds since the start, whether the API answered)"""
        self.watchers: list[Callable[[NodeState], None]] = []

    def _api(self, call: str) -> None:
        self.calls.append((call, self.clock.elapsed, self.up))
        if not self.up:
            raise ApiUnavailable("connection refused")

    def _state(self) -> NodeState:
        return NodeState(dict(self.labels), dict(self.annotations), str(self.version))

    def read(self) -> NodeState:
        self._api("read")
        return self._state()

    def publish(self, labels: Mapping[str, str], report_text: str) -> dict[str, str | None]:
        self._api("publish")
        patch: dict[str, str | None] = {k: v for k, v in labels.items() if self.labels.get(k) != v}
        patch.update({k: None for k in contract.AGENT_LABELS if k not in labels and k in self.labels})
        for key, value in patch.items():
            if value is None:
                del self.labels[key]
            else:
                self.labels[key] = value
        self.annotations[contract.ANNOTATION_PROBE_REPORT] = report_text
        self.version += 1
        return patch

    def clear_reprobe(self, value: str) -> bool:
        self._api("clear")
        if self.annotations.get(contract.ANNOTATION_REPROBE) != value:
            return False
        del self.annotations[contract.ANNOTATION_REPROBE]
        self.version += 1
        return True

    def watch(
        self,
        on_state: Callable[[NodeState], None],
        stop: threading.Event,
        *,
        on_error: Callable[[PublishError], None] | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        stop.wait()  # changes reach the agent through ``annotate``, in the loop's thread

    def annotate(self, key: str, value: str) -> None:
        self.annotations[key] = value
        self.version += 1
        for watcher in self.watchers:
            watcher(self._state())

    def times(self, call: str, answered: bool | None = None) -> list[float]:
        return [t for c, t, ok in self.calls if c == call and (answered is None or ok == answered)]


class Running:
    """An agent with its fake clock and Node; ``run(until)`` runs the loop and stops it at ``until``."""

    def __init__(self, node: FakeNode, hardware: Any, **timing: float) -> None:
        self.node, self.clock = node, node.clock
        config = DaemonConfig(node_name=node.node_name, kubeconfig=None, probe=QUICK, **timing)
        self.agent = Agent(config, hardware, node, AgentMetrics(), Health(60.0), clock=node.clock, jitter=lambda: 0.0)
        node.watchers.append(self.agent.on_node_state)
        self.stop = threading.Event()

    def run(self, until: float) -> int:
        self.clock.after(until, lambda: self.agent.stop(self.stop))
        return self.agent.run(self.stop)

    def probes(self, trigger: str | None = None) -> float:
        registry = self.agent.metrics.registry
        total = 0.0
        for metric in registry.collect():
            for sample in metric.samples:
                if sample.name == "fiar_agent_probes_total" and trigger in (None, sample.labels["trigger"]):
                    total += sample.value
        return total

    def metric(self, name: str, **labels: str) -> float:
        return self.agent.metrics.registry.get_sample_value(name, labels) or 0.0

    def report(self) -> dict[str, Any]:
        doc = report_mod.loads(self.node.annotations.get(contract.ANNOTATION_PROBE_REPORT))
        assert doc is not None
        return doc


def h200x2() -> SimulatedHardware:
    return SimulatedHardware(Path("h200x2-host"))


def h200x1() -> SimulatedHardware:
    """One GPU: no smoke test runs, so a probe takes a tenth of a second."""
    return SimulatedHardware(Path("h200x1-device"))


def test_with_the_api_down_at_start_the_probe_runs_and_its_verdict_is_written_once_the_api_answers() -> None:
    clock = FakeClock()
    node = FakeNode(clock)
    node.up = False
    clock.after(40.0, lambda: setattr(node, "up", True))
    run = Running(node, h200x2(), api_backoff_max_s=60.0)
    assert run.run(until=600.0) == 0

    assert node.labels == H200X2
    assert run.probes() == 1, "the pending verdict was written, not probed again"
    assert node.times("publish", answered=False) == [0.0, 1.0, 3.0, 7.0, 15.0, 31.0], "1 s doubling"
    assert node.times("publish", answered=True) == [63.0]
    assert run.metric("fiar_agent_publish_failures_total", error="ApiUnavailable") == 6
    assert run.metric("fiar_agent_publish_pending") == 0


def test_writes_to_an_api_that_stays_down_back_off_up_to_the_cap_and_the_agent_lives_on() -> None:
    clock = FakeClock()
    node = FakeNode(clock)
    node.up = False
    run = Running(node, h200x1(), api_backoff_max_s=5.0)
    assert run.run(until=40.0) == 0
    attempts = node.times("publish")
    assert [round(b - a, 6) for a, b in itertools.pairwise(attempts)] == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0]
    assert run.metric("fiar_agent_publish_pending") == 1
    assert run.agent.health.healthy(), "an unreachable API server does not make the agent unhealthy"


def _busy(doc: dict[str, Any]) -> None:
    doc["gpus"][1]["compute_processes"] = 1


def test_a_verdict_on_the_node_survives_a_blind_probe_made_while_the_api_was_down(
    host_file: Callable[..., Path],
) -> None:
    earlier = probe(h200x2(), QUICK, environ={})
    clock = FakeClock()
    node = FakeNode(
        clock, labels=earlier.labels, annotations={contract.ANNOTATION_PROBE_REPORT: report_mod.dumps(earlier.report)}
    )
    node.up = False
    clock.after(10.0, lambda: setattr(node, "up", True))
    run = Running(node, SimulatedHardware(host_file("h200x2-host", _busy)))
    assert run.run(until=100.0) == 0

    assert run.probes("start") == 1 and run.probes("previous-report") == 1
    assert node.labels == H200X2, "the verdict was kept, not removed"
    assert run.report()["tests"]["trtllm"]["reused_from"] == earlier.report["probe_time"], "the Node's result"


def test_an_ok_probe_is_repeated_on_the_interval() -> None:
    clock = FakeClock()
    node = FakeNode(clock)
    run = Running(node, h200x1(), interval_s=3600.0, retry_interval_s=60.0)
    assert run.run(until=3 * 3600.0 + 1) == 0
    assert node.times("publish") == [0.0, 3600.0, 7200.0, 10800.0]
    assert run.probes("start") == 1 and run.probes("interval") == 3


def _no_torch(doc: dict[str, Any]) -> None:
    doc["simulate"] = {"software": {"torch": None, "flashinfer": "0.6.13"}}


def test_a_degraded_probe_is_retried_after_the_retry_interval(host_file: Callable[..., Path]) -> None:
    clock = FakeClock()
    node = FakeNode(clock)
    run = Running(
        node, SimulatedHardware(host_file("h200x2-host", _no_torch)), interval_s=3600.0, retry_interval_s=600.0
    )
    assert run.run(until=1801.0) == 0
    assert node.times("publish") == [0.0, 600.0, 1200.0, 1800.0]
    assert run.probes("retry") == 3
    assert contract.LABEL_BACKEND not in node.labels, "an untested node gets no verdict"


def test_a_changed_driver_triggers_one_probe(host_file: Callable[..., Path]) -> None:
    fixture = host_file("h200x1-device")

    def upgrade() -> None:
        doc = json.loads(fixture.read_text())
        doc["driver_version"] = "590.10.01"
        fixture.write_text(json.dumps(doc))

    clock = FakeClock()
    clock.after(100.0, upgrade)
    node = FakeNode(clock)
    run = Running(node, SimulatedHardware(fixture), driver_check_s=60.0)
    assert run.run(until=400.0) == 0
    assert node.times("publish") == [0.0, 120.0], "seen at the first driver check after the change"
    assert run.probes("driver-change") == 1
    assert run.report()["versions"]["driver"] == "590.10.01"


def test_a_reprobe_annotation_triggers_a_probe_and_is_cleared_and_the_same_value_again_is_a_new_request() -> None:
    clock = FakeClock()
    node = FakeNode(clock)
    clock.after(50.0, lambda: node.annotate(contract.ANNOTATION_REPROBE, "prüfen"))
    clock.after(80.0, lambda: node.annotate(contract.ANNOTATION_REPROBE, "prüfen"))
    run = Running(node, h200x1())
    assert run.run(until=100.0) == 0

    assert node.times("publish") == [0.0, 50.0, 80.0]
    assert node.times("clear") == [50.0, 80.0], "cleared right after the verdict it asked for"
    assert contract.ANNOTATION_REPROBE not in node.annotations
    assert run.probes("reprobe") == 2
    assert run.metric("fiar_agent_reprobe_requests_total") == 2


def test_a_reprobe_set_while_the_api_was_down_is_seen_once_it_answers_and_then_cleared() -> None:
    clock = FakeClock()
    node = FakeNode(clock, annotations={contract.ANNOTATION_REPROBE: "now"})
    node.up = False
    clock.after(20.0, lambda: setattr(node, "up", True))
    run = Running(node, h200x1())
    assert run.run(until=100.0) == 0
    assert run.probes("start") == 1 and run.probes("reprobe") == 1
    assert node.times("publish", answered=True) == [31.0, 31.0], "the blind probe's verdict, then the reprobe's"
    assert node.times("clear") == [31.0]
    assert contract.ANNOTATION_REPROBE not in node.annotations


def test_a_reprobe_found_at_start_joins_the_start_up_probe() -> None:
    clock = FakeClock()
    node = FakeNode(clock, annotations={contract.ANNOTATION_REPROBE: "now"})
    run = Running(node, h200x1())
    assert run.run(until=100.0) == 0
    assert run.probes() == 1 and run.probes("reprobe+start") == 1
    assert contract.ANNOTATION_REPROBE not in node.annotations


def test_stop_ends_the_loop_at_once_even_in_the_middle_of_a_backoff() -> None:
    clock = FakeClock()
    node = FakeNode(clock)
    node.up = False
    run = Running(node, h200x1(), interval_s=6 * 3600.0, api_backoff_max_s=600.0)
    assert run.run(until=200.5) == 0
    assert clock.elapsed == 200.5, "no wait after the stop"
    assert run.probes() == 1


class FailingHardware(SimulatedHardware):
    """Simulated hardware whose inventory raises an error nobody expects, the first ``times`` times."""

    def __init__(self, times: int) -> None:
        super().__init__(Path("h200x2-host"))
        self.failures_left = times

    def read_inventory(self, timeout_s: float = 60.0) -> inventory.Inventory:
        if self.failures_left > 0:
            self.failures_left -= 1
            raise RuntimeError("an error the probe does not expect")
        return super().read_inventory(timeout_s)


def test_a_probe_that_fails_unexpectedly_is_retried_with_a_growing_backoff_and_keeps_its_trigger() -> None:
    clock = FakeClock()
    node = FakeNode(clock)
    run = Running(node, FailingHardware(times=3), interval_s=6 * 3600.0)
    assert run.run(until=1000.0) == 0
    assert node.times("publish") == [210.0], "tried at 0, 30, 90 and 210 (30 s doubling)"
    assert run.probes("start") == 1
    assert node.labels == H200X2


def test_a_node_report_with_an_unreadable_test_entry_still_gets_a_verdict() -> None:
    earlier = json.loads(report_mod.dumps(probe(h200x1(), QUICK, environ={}).report))
    earlier["tests"]["trtllm"]["devices"] = [1e999]  # JSON allows it; int() of it raises OverflowError
    clock = FakeClock()
    node = FakeNode(clock, annotations={contract.ANNOTATION_PROBE_REPORT: json.dumps(earlier)})
    run = Running(node, h200x1())
    assert run.run(until=100.0) == 0
    assert node.labels == H200X1
    assert node.times("publish") == [0.0]


def test_a_busy_node_whose_report_has_step_times_that_are_not_numbers_keeps_its_verdict(
    host_file: Callable[..., Path],
) -> None:
    earlier = probe(h200x2(), QUICK, environ={})
    doc = json.loads(report_mod.dumps(earlier.report))
    doc["tests"]["trtllm"]["steps"] = {"import": "soon"}  # reused as it is, it failed every probe's metrics
    clock = FakeClock()
    node = FakeNode(clock, labels=earlier.labels, annotations={contract.ANNOTATION_PROBE_REPORT: json.dumps(doc)})
    run = Running(node, SimulatedHardware(host_file("h200x2-host", _busy)))
    assert run.run(until=100.0) == 0
    assert node.times("publish") == [0.0], "the first probe was published, none failed"
    assert node.labels == H200X2, "the report's verdict is kept; its unreadable test result is not reused"
    assert run.report()["labels_kept_from"] == earlier.report["probe_time"]
