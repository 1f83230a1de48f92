"""Errors of the node agent.

Callers decide by type, never by message. Everything the agent raises on purpose is an
``AgentError``::

    AgentError                  base class
    ├── ConfigError             invalid configuration: reported at start, exit code 2, never retried
    │   └── FixtureError        a --simulate file that is missing or malformed
    ├── HardwareError           the GPU stack could not be read; the probe degrades with a reason
    │   ├── NvmlUnavailable     no NVIDIA driver or libnvidia-ml on this host
    │   └── NativeProbeFailed   the child process reading NVML/CUDA crashed, hung or printed garbage
    └── PublishError            writing to the Kubernetes API failed (``publish_error``)
        ├── ApiUnavailable      transient (fiar_kube.Unavailable: connection refused, timeout, 5xx,
        │                       429; or an answer that cannot be read): retried with backoff
        ├── NodeNotFound        the agent's own Node does not exist (yet) (fiar_kube.NotFound):
        │                       retried with backoff
        └── PublishRejected     any other refusal (RBAC, validation, a conflict): retried slowly and logged

Smoke-test outcomes (fail, timeout, a crashed rank) are values in the report, not exceptions:
a failing backend is a finding, not an error of the agent.
"""

from __future__ import annotations

import fiar_kube as kube


class AgentError(Exception):
    """Base class of the errors the agent raises on purpose."""


class ConfigError(AgentError):
    """The agent's configuration is invalid; it stops at start with exit code 2."""


class FixtureError(ConfigError):
    """A simulated-host fixture is missing or does not match the recorded-host format."""


class HardwareError(AgentError):
    """The GPU stack could not be read."""


class NvmlUnavailable(HardwareError):
    """NVML (the NVIDIA driver's management library) is not present or did not initialise."""


class NativeProbeFailed(HardwareError):
    """The child process that reads NVML and the CUDA driver crashed, hung or returned garbage."""


class PublishError(AgentError):
    """A write to the Kubernetes API failed."""


class ApiUnavailable(PublishError):
    """The API server could not be reached or answered with a transient error."""


class NodeNotFound(PublishError):
    """The agent's own Node object does not exist."""


class PublishRejected(PublishError):
    """The API server rejected the request (authorization or validation)."""


def publish_error(exc: BaseException) -> PublishError:
    """The agent's error for a failed API call: decided by the type ``fiar_kube`` gave the answer
    (never by a status number here); anything else that broke the call is transient."""
    if isinstance(exc, PublishError):
        return exc
    if isinstance(exc, kube.NotFound):
        return NodeNotFound(str(exc))
    if isinstance(exc, kube.Unavailable):
        return ApiUnavailable(str(exc))
    if isinstance(exc, kube.ApiError):
        return PublishRejected(str(exc))
    return ApiUnavailable(f"{type(exc).__name__}: {str(exc)[:200]}")
