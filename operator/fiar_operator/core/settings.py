"""Settings of a running operator (from the command line)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fiar_operator.core.errors import ConfigurationError

ALWAYS_EXCLUDED: Final = ("kube-system",)
MAX_READ_TIMEOUT: Final = 0.4
"""Longest ``--read-timeout``: the binding webhook's read must end within the server's deadline for
a review (0.6 s, ``server.WORK_DEADLINE``) with time left to answer; the chart's schema says the same."""
DEFAULT_NODE_SELECTOR: Final = "nvidia.com/gpu.present=true"
"""The nodes the operator watches unless ``--node-selector`` says otherwise: the chart's agent node
selector (fiar's verdict labels live only on the nodes the agent runs on)."""


def excluded_namespaces(environ: Mapping[str, str] = os.environ, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """Namespaces the webhooks never see: kube-system, the operator's own (``POD_NAMESPACE``) and
    ``extra`` (the chart's ``operator.webhook.excludeNamespaces``)."""
    own = environ.get("POD_NAMESPACE", "").strip()
    names = [*ALWAYS_EXCLUDED, own, *(n.strip() for n in extra)]
    return tuple(dict.fromkeys(n for n in names if n))


@dataclass(frozen=True)
class Settings:
    kubeconfig: str | None = None
    """Path of a kubeconfig; None: in-cluster credentials, else the default kubeconfig."""
    webhook_host: str = "0.0.0.0"
    webhook_port: int = 9443
    """HTTPS port of the admission webhooks (the chart's Service targets it)."""
    tls_cert: Path | None = None
    tls_key: Path | None = None
    """Serving certificate and key (PEM files, e.g. a cert-manager Secret); re-read when they change."""
    tls_reload_interval: float = 60.0
    """Seconds between checks of the certificate files for rotation."""
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = 8080
    """Plain-HTTP port for /metrics, /healthz and /readyz (0: any free port; None: not served)."""
    read_timeout: float = 0.3
    """Seconds the binding webhook waits for its last-resort read of a pod it has never seen."""
    status_interval: float = 0.5
    """Seconds between writes of policy statuses (changes are batched)."""
    standalone: bool = False
    """Run without kopf peering (a single replica)."""
    peering: str = "fiar"
    priority: int = 0
    """kopf peering: among replicas, the highest priority reconciles; the others only serve webhooks."""
    liveness: str | None = None
    """kopf's liveness endpoint, e.g. http://0.0.0.0:8081/healthz."""
    webhook_config: str | None = None
    """The MutatingWebhookConfiguration whose matchConditions the leader keeps in step with the
    policies (None: leave every configuration as it is)."""
    excluded_namespaces: tuple[str, ...] = ALWAYS_EXCLUDED
    """Namespaces whose pods the reconciler leaves alone, as the webhooks never see them (besides
    namespaces labelled fiar.io/ignore)."""
    node_selector: str = DEFAULT_NODE_SELECTOR
    """Label selector of the nodes watched ("": every node)."""
    unconfigured_interval: float = 60.0
    """Seconds between scans for pods a policy selects that the pod webhook never configured (a
    policy's or a namespace's change scans at once)."""
    recreate_unconfigured: bool = False
    """Evict the controller-owned pods a policy selects that the pod webhook never configured, so
    that their controller recreates them through the webhook (opt-in)."""

    def check(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigurationError("--tls-cert and --tls-key go together")
        for path in (self.tls_cert, self.tls_key):
            if path is not None and not Path(path).is_file():
                raise ConfigurationError(f"TLS file {path} does not exist (mount the webhook certificate Secret)")
        if not self.unconfigured_interval > 0:
            raise ConfigurationError("--unconfigured-interval must be a positive number of seconds")
        for port in (self.webhook_port, self.metrics_port):
            if port is not None and not 0 <= port <= 65535:
                raise ConfigurationError(f"port {port} is out of range")
        if not 0 < self.read_timeout <= MAX_READ_TIMEOUT:
            raise ConfigurationError(
                f"--read-timeout must be in (0, {MAX_READ_TIMEOUT:g}] seconds (the webhook answers within 0.6 s)"
            )
