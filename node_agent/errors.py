"""Errors of the node agent.

Callers decide by type, never by message. Everything the agent raises on purpose is an
``AgentError``::

    AgentError                  base class
    ├── ConfigError             invalid configuration: reported at start, exit code 2, never retried
    │   └── FixtureError        a --simulate file that is missing or malformed
    ├── HardwareError           the GPU stack could not be read; the probe degrades with a reason
    │   ├── NvmlUnavailable     no NVIDIA driver or libnvidia-ml on this host
    │   └── NativeProbeFailed   the child process reading NVML/CUDA crashed, hung or printed garbage
    └── PublishError            writing to the Kubernetes API failed
        ├── ApiUnavailable      transient (connection refused, timeout, 5xx, 429): retried with backoff
        ├── NodeNotFound        the agent's own Node does not exist (yet): retried with backoff
        └── PublishRejected     any other 4xx (RBAC, validation): retried slowly and logged

Smoke-test outcomes (fail, timeout, a crashed rank) are values in the report, not exceptions:
a failing backend is a finding, not an error of the agent.
"""

from __future__ import annotations


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
