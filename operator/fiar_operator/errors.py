"""Errors of the fiar operator.

::

    OperatorError                 base: every error this package raises on purpose
    ├── PolicyError               a FiAllreducePolicy object cannot be used (bad spec)
    ├── ReviewError               an AdmissionReview body is malformed (answered with HTTP 400)
    ├── ApiError                  a call to the Kubernetes API failed or timed out
    └── ConfigurationError        the operator was started with unusable settings

Webhooks never let an error block a pod: anything that is not a ``ReviewError`` is answered with
``allowed: true`` and no patch, so the pod keeps the policy's fallback backend.
"""

from __future__ import annotations


class OperatorError(Exception):
    """Base class of every error the operator raises on purpose."""


class PolicyError(OperatorError):
    """A FiAllreducePolicy spec cannot be used; the message names the field and the fix."""


class ReviewError(OperatorError):
    """An AdmissionReview body is malformed; the webhook answers HTTP 400 with this message."""


class ApiError(OperatorError):
    """A Kubernetes API call failed or timed out; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ConfigurationError(OperatorError):
    """The operator's settings are unusable (missing TLS files, bad port, ...)."""
