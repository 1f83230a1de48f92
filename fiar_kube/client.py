"""JSON requests and watch streams with the credentials of a configuration (``Client``)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, urlencode

from .credentials import authorization
from .deadline import Timeout
from .errors import MAX_ERROR_BODY, Unavailable, error_for, status_message, unavailable
from .http1 import Broken
from .lane import Lane
from .pool import pool_manager
from .watch import MAX_EVENT_BYTES, WatchLines

if TYPE_CHECKING:
    import urllib3

JSON: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"
ERROR_READ: Final = 64 * 1024
"""Bytes of an error answer read at most (its Status message is in the first few hundred)."""


# -- requests ------------------------------------------------------------------------------------
def segment(name: str) -> str:
    """``name`` as one path segment: every character but unreserved ones percent-encoded ("/" too)."""
    return quote(name, safe="")


def url(host: str, path: str, query: Mapping[str, Any] | None = None) -> str:
    """``host`` + ``path`` + the query's non-None parameters."""
    return str(host).rstrip("/") + target(path, query)


def target(path: str, query: Mapping[str, Any] | None = None) -> str:
    """``path`` + the query's non-None parameters."""
    params = {k: str(v) for k, v in (query or {}).items() if v is not None}
    return path + ("?" + urlencode(params) if params else "")


class Client:
    """JSON requests and watch streams with the credentials of a kubernetes ``Configuration``.

    Answers are decoded JSON; failures are the typed errors above (a transport failure is
    ``Unavailable``). Not shared between processes; safe to share between threads (the pool is)."""

    def __init__(
        self,
        cfg: Any,
        *,
        user_agent: str,
        maxsize: int = 4,
        environ: Mapping[str, str] | None = None,
        lane: bool = True,
    ) -> None:
        self.configuration = cfg
        self.user_agent = user_agent
        self._pool = pool_manager(cfg, maxsize=maxsize, environ=environ)
        self._lane = Lane.for_config(cfg, maxsize, environ) if lane else None
        """Where requests go (None: through urllib3, as watch streams always do; ``lane=False`` asks
        for that, to measure one beside the other)."""

    def headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": JSON, "User-Agent": self.user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        token = authorization(self.configuration)
        if token:
            headers["Authorization"] = token
        return headers

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str | None,
        timeout: Timeout,
    ) -> urllib3.BaseHTTPResponse:
        import urllib3

        if isinstance(timeout, tuple):
            limit = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        else:
            limit = urllib3.Timeout(total=timeout)
        try:
            return self._pool.request(  # type: ignore[no-any-return]
                method,
                url(self.configuration.host, path, query),
                body=None if body is None else json.dumps(body).encode(),
                headers=self.headers(content_type or (JSON if body is not None else None)),
                timeout=limit,
                preload_content=False,
                retries=False,
            )
        except urllib3.exceptions.HTTPError as exc:  # the API server is unreachable or slow
            raise unavailable(f"{method} {path}", exc) from exc

    def request(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        *,
        body: Any = None,
        content_type: str | None = None,
        timeout: Timeout = 10.0,
    ) -> Any:
        """One request: the decoded JSON answer (None when empty), or the typed error."""
        status, reason, data = self._exchange(method, path, query, body, content_type, timeout)
        if not 200 <= status <= 299:
            raise error_for(
                status,
                f"{method} {path}: HTTP {status} {status_message(data)}".strip(),
                reason=reason,
                body=data[:MAX_ERROR_BODY].decode(errors="replace"),
            )
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError as exc:  # a 2xx that is not JSON (a proxy's page, a cut answer): transient
            raise Unavailable(f"{method} {path}: the answer is not JSON: {str(exc)[:200]}") from exc

    def _exchange(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str | None,
        timeout: Timeout,
    ) -> tuple[int, str, bytes]:
        """(status, reason, body) of one request, on the lane or through urllib3; an answer outside
        2xx is read up to ``ERROR_READ`` bytes."""
        if self._lane is None:
            return self._through_pool(method, path, query, body, content_type, timeout)
        payload = None if body is None else json.dumps(body).encode()
        headers = self.headers(content_type or (JSON if body is not None else None))
        try:
            return self._lane.request(method, target(path, query), headers, payload, timeout, ERROR_READ)
        except (OSError, Broken) as exc:  # the API server is unreachable, slow, or not speaking HTTP
            raise unavailable(f"{method} {path}", exc) from exc

    def _through_pool(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str | None,
        timeout: Timeout,
    ) -> tuple[int, str, bytes]:
        import urllib3

        response = self._send(method, path, query, body, content_type, timeout)
        ok = 200 <= response.status <= 299
        try:
            data = response.read() if ok else response.read(ERROR_READ)
        except urllib3.exceptions.HTTPError as exc:
            raise unavailable(f"{method} {path}", exc) from exc
        finally:
            response.release_conn() if ok else response.close()
        return response.status, response.reason or "", data

    def stream(
        self,
        path: str,
        query: Mapping[str, Any] | None = None,
        *,
        read_timeout_s: float,
        connect_timeout_s: float = 5.0,
        max_event_bytes: int = MAX_EVENT_BYTES,
    ) -> Iterator[dict[str, Any]]:
        """The JSON events of a watch (``path`` with ``watch=true`` in its query), one per line, until
        the server ends it. ERROR events are handed out as they come (see ``status_error``)."""
        import urllib3

        response = self._send("GET", path, query, None, None, (connect_timeout_s, read_timeout_s))
        ended = False
        try:
            if not 200 <= response.status <= 299:
                data = response.read(64 * 1024)
                raise error_for(
                    response.status,
                    f"watch {path}: HTTP {response.status} {status_message(data)}".strip(),
                    reason=response.reason or "",
                    body=data[:MAX_ERROR_BODY].decode(errors="replace"),
                )
            lines = WatchLines(max_event_bytes)
            for chunk in response.stream(64 * 1024):
                yield from lines.feed(chunk)
            ended = True
        except urllib3.exceptions.HTTPError as exc:
            raise unavailable(f"watch {path}", exc) from exc
        finally:
            # a stream the server ended goes back to the pool; one left early (an ERROR event, a
            # line over the bound, a stop) may hold unread bytes, so its connection is closed
            response.release_conn() if ended else response.close()

    def close(self) -> None:
        self._pool.clear()
        if self._lane is not None:
            self._lane.close()
