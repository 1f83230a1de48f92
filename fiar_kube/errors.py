"""The seam's errors: one type per kind of failure, chosen from an HTTP status in one place
(``error_type``); callers decide by type (``NotFound``, ``Conflict``, ``Gone``, ...), never by number."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

MAX_ERROR_BODY: Final = 300
"""Characters of an error answer kept in the error (messages go to logs)."""


class ConfigError(Exception):
    """No usable credentials: the kubeconfig or the in-cluster service account cannot be loaded."""


class ApiError(Exception):
    """A call to the API server failed. ``status`` is the HTTP status (None: no answer, or the
    request was refused before it was sent); ``body`` the start of the answer."""

    def __init__(self, message: str, status: int | None = None, reason: str = "", body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.body = body


class Unavailable(ApiError):
    """Transient: no answer (connection refused or reset, timeout), 429 Too Many Requests, or 5xx."""


class NotFound(ApiError):
    """404: the object (or its kind) does not exist."""


class Conflict(ApiError):
    """409: the object exists already, or changed since the resourceVersion the request named."""


class Gone(ApiError):
    """410: the resourceVersion a watch asked for is too old: list again."""


class Rejected(ApiError):
    """Any other 4xx: the request itself is refused; repeating it unchanged does not help."""


class Unauthorized(Rejected):
    """401: the credentials were not accepted."""


class Forbidden(Rejected):
    """403: authorization (RBAC) or an admission policy refused the request."""


class Invalid(Rejected):
    """422: the object failed validation."""


class Unsendable(Rejected, ValueError):
    """The request cannot be written as HTTP/1.1 and is never sent (``status`` None): a target that is
    not ASCII or holds a control character or space, a header name that is not a token, a header value
    with a line break, a NUL or a character outside Latin-1."""


class EventTooLarge(ValueError):
    """A watch stream sent a line longer than the bound: the stream is abandoned."""


_BY_STATUS: Final[Mapping[int, type[ApiError]]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    408: Unavailable,
    429: Unavailable,
}


def error_type(status: int | None) -> type[ApiError]:
    """The error type of an HTTP status: the one place a status number is interpreted."""
    if status is None or status >= 500:
        return Unavailable
    return _BY_STATUS.get(status, Rejected)


def error_for(status: int | None, message: str, *, reason: str = "", body: str = "") -> ApiError:
    return error_type(status)(message, status, reason, body[:MAX_ERROR_BODY])


def status_message(data: bytes) -> str:
    """The ``message`` of a Status answer, else the start of the body (bounded, one line)."""
    try:
        doc = json.loads(data)
        message = doc.get("message", "") if isinstance(doc, dict) else ""
    except ValueError:
        message = ""
    if not isinstance(message, str) or not message:
        message = data[:200].decode(errors="replace")
    return " ".join(message[:MAX_ERROR_BODY].split())


def status_error(status: Any, what: str = "watch") -> ApiError:
    """The error of a watch ERROR event's object (a Status: ``code``, ``reason``, ``message``)."""
    doc = status if isinstance(status, Mapping) else {}
    code = doc.get("code")
    code = code if isinstance(code, int) and not isinstance(code, bool) else None
    message = str(doc.get("message") or "")[:MAX_ERROR_BODY]
    return error_for(code, f"{what}: {message}".strip(), reason=str(doc.get("reason") or "")[:100])


def unavailable(what: str, exc: BaseException) -> Unavailable:
    """The transient error for a failed exchange: what was asked, then the failure's type and text."""
    return Unavailable(f"{what}: {type(exc).__name__}: {str(exc)[:200]}")
