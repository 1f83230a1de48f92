"""Prometheus metrics of the operator, in a registry of their own (one per running operator)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fiar_operator.core.decide import Decision

LATENCY_BUCKETS: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
"""Seconds; fine-grained below a millisecond, where the binding webhook is meant to answer."""


class Metrics:
    def __init__(
        self,
        sizes: Callable[[], Mapping[str, int]] | None = None,
        index_bytes: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.admissions = Counter(
            "fiar_admission_requests",
            "AdmissionReview requests answered, by webhook and result.",
            ["webhook", "result"],
            registry=self.registry,
        )
        self.decisions = Counter(
            "fiar_decisions",
            "Backend decisions written to pods, by backend, reason and trigger.",
            ["backend", "reason", "trigger"],
            registry=self.registry,
        )
        self.lookups = Counter(
            "fiar_binding_pod_lookups",
            "Where the binding webhook found the bound pod (index, memo, read, unknown, uncovered).",
            ["source"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "fiar_webhook_duration_seconds",
            "Time to answer one AdmissionReview, by webhook.",
            ["webhook"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.index_size = Gauge(
            "fiar_index_objects",
            "Objects held by the in-memory indexes.",
            ["index"],
            registry=self.registry,
        )
        self.reconciled = Counter(
            "fiar_pods_reannotated",
            "Running pods whose backend annotation the reconciler changed, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.conditions_follow_policies = Gauge(
            "fiar_webhook_conditions_follow_policies",
            "1 while the webhooks' matchConditions follow the policies; 0 while the static conditions stand "
            "in for ones the API server cannot hold (every pod the chart's rules name reaches the webhooks).",
            registry=self.registry,
        )
        self.conditions_follow_policies.set(1)
        self.index_bytes = Gauge(
            "fiar_index_bytes",
            "Estimated bytes the pod and node indexes hold (a sample of their records, measured).",
            ["index"],
            registry=self.registry,
        )
        self.scans = Counter(
            "fiar_unconfigured_scans",
            "Scans for pods a policy selects that the pod webhook never configured, by whether they "
            "read every LIST to its end within their budget.",
            ["complete"],
            registry=self.registry,
        )
        self.scan_pods = Counter(
            "fiar_unconfigured_scan_pods_read",
            "Pods the scans' selector-narrowed LISTs returned.",
            registry=self.registry,
        )
        self._sizes = sizes
        self._bytes = index_bytes

    def admission(self, webhook: str, result: str) -> None:
        self.admissions.labels(webhook, result).inc()

    def decision(self, decision: Decision) -> None:
        self.decisions.labels(decision.backend, decision.reason, decision.trigger).inc()

    def lookup(self, source: str) -> None:
        self.lookups.labels(source).inc()

    def indexes(self) -> dict[str, dict[str, int]]:
        """What the indexes hold: objects per index, and the estimated bytes of the pod and node indexes."""
        return {
            "objects": dict(self._sizes()) if self._sizes is not None else {},
            "bytes": dict(self._bytes()) if self._bytes is not None else {},
        }

    def exposition(self) -> bytes:
        if self._sizes is not None:
            for index, size in self._sizes().items():
                self.index_size.labels(index).set(size)
        if self._bytes is not None:
            for index, size in self._bytes().items():
                self.index_bytes.labels(index).set(size)
        return bytes(generate_latest(self.registry))
