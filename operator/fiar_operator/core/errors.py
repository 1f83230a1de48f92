"""Errors of the fiar operator.

::

    OperatorError                 base: every error this package raises on purpose
    ├── PolicyError               a FiAllreducePolicy object cannot be used (bad spec)
    ├── ReviewError               an AdmissionReview body is malformed (answered with HTTP 400)
    ├── OverBudget                planning a review passed its work budget (answered unchanged)
    └── ConfigurationError        the operator was started with unusable settings

    ApiError                      a call to the Kubernetes API failed or timed out: the errors of
    ├── Unavailable               fiar_kube, the seam shared with the node agent, re-exported here.
    ├── NotFound                  Each HTTP status is mapped to a type there, once; the operator
    ├── Conflict                  decides by type, never by number. ``fiar-operator`` reports an
    ├── Gone                      ApiError at start like an OperatorError (exit code 2). ApiError is
    │                             not an OperatorError: ``except OperatorError`` does not catch it.
    └── Rejected (Unauthorized, Forbidden, Invalid, any other 4xx)

Webhooks never let an error block a pod: anything that is not a ``ReviewError`` is answered with
``allowed: true`` and no patch, so the pod keeps the policy's fallback backend.
"""

from __future__ import annotations

from fiar_kube import ApiError, Conflict, Forbidden, Gone, Invalid, NotFound, Rejected, Unauthorized, Unavailable

__all__ = [
    "ApiError",
    "ConfigurationError",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "NotFound",
    "OperatorError",
    "OverBudget",
    "PolicyError",
    "Rejected",
    "ReviewError",
    "Unauthorized",
    "Unavailable",
]


class OperatorError(Exception):
    """Base class of every error the operator raises on purpose."""


class PolicyError(OperatorError):
    """A FiAllreducePolicy spec cannot be used; the message names the field and the fix."""


class ReviewError(OperatorError):
    """An AdmissionReview body is malformed; the webhook answers HTTP 400 with this message."""


class ConfigurationError(OperatorError):
    """The operator's settings are unusable (missing TLS files, bad port, ...)."""


class OverBudget(OperatorError):
    """Planning one review passed its work budget (``limits.Budget``); the review is answered allowed
    and unchanged, with a warning, and its thread is free for the next one."""


class NeedsThread(OperatorError):
    """A review begun on the webhook server's event loop reached planning work (``limits.OnLoop``): it
    is answered on a review thread instead, with a whole budget. Not an ``OverBudget``: nothing is
    answered unchanged for it."""
