"""JSON requests and watch streams with the credentials of a configuration (``Client``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, urlencode

from .credentials import authorization, impersonation
from .deadline import WATCHDOG, Timeout, limits, within
from .errors import MAX_ERROR_BODY, Unavailable, error_for, status_message, unavailable
from .http1 import Broken, check_request
from .lane import Lane
from .pool import head_by, pool_manager
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

    Answers are decoded JSON; failures are the typed errors of ``errors`` (a transport failure is
    ``Unavailable``, a request that cannot be written ``Unsendable``). Every request ends by its
    deadline on either transport (``Timeout``); a watch stream waits ``read_timeout_s`` at most for a
    byte, and as long at most for the rest of an event once its first byte came. Not shared between
    processes; safe to share between threads (the pool is)."""

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

    def headers(self, content_type: str | None = None) -> list[tuple[str, str]]:
        """The header fields of a request: a list, since Impersonate-Group repeats."""
        headers = [("Accept", JSON), ("User-Agent", self.user_agent)]
        if content_type:
            headers.append(("Content-Type", content_type))
        token = authorization(self.configuration)
        if token:
            headers.append(("Authorization", token))
        return headers + list(impersonation(self.configuration))

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str | None,
        connect_s: float | None,
        read_s: float | None,
        deadline: float | None,
    ) -> urllib3.BaseHTTPResponse:
        """The answer's head through urllib3 (each wait bounded by the time left); its body is read by
        the caller under ``_bounded``."""
        import urllib3

        fields = check_request(
            method, target(path, query), self.headers(content_type or (JSON if body is not None else None))
        )
        headers = urllib3.HTTPHeaderDict()
        for name, value in fields:
            headers.add(name, value)
        try:
            limit = urllib3.Timeout(connect=within(connect_s, deadline), read=within(read_s, deadline))
            with head_by(deadline):
                return self._pool.request(  # type: ignore[no-any-return]
                    method,
                    url(self.configuration.host, path, query),
                    body=None if body is None else json.dumps(body).encode(),
                    headers=headers,
                    timeout=limit,
                    preload_content=False,
                    retries=False,
                )
        except (urllib3.exceptions.HTTPError, TimeoutError) as exc:  # the API server is unreachable or slow
            late = deadline is not None and time.monotonic() >= deadline
            raise unavailable(f"{method} {path}", TimeoutError("the request's time is up") if late else exc) from exc

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

        connect_s, read_s, deadline = limits(timeout)
        response = self._send(method, path, query, body, content_type, connect_s, read_s, deadline)
        ok = 200 <= response.status <= 299
        alarm = None if deadline is None else WATCHDOG.arm(deadline, response.shutdown)
        late = False
        try:
            data = response.read() if ok else response.read(ERROR_READ)
        except urllib3.exceptions.HTTPError as exc:
            late = alarm is not None and alarm.fired
            raise unavailable(f"{method} {path}", TimeoutError("the request's time is up") if late else exc) from exc
        finally:
            if alarm is not None:
                alarm.cancel()
                late = alarm.fired or (deadline is not None and time.monotonic() >= deadline)
            response.release_conn() if ok and not late else response.close()
        if late:  # a body without framing, cut short by the deadline
            raise unavailable(f"{method} {path}", TimeoutError("the request's time is up"))
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
        the server ends it. ERROR events are handed out as they come (see ``status_error``). Each read
        waits ``read_timeout_s`` at most, and an event whose first byte came must end within as long
        (a server trickling one endless line is ``Unavailable``, not a stream held forever)."""
        import urllib3

        head_by = time.monotonic() + connect_timeout_s + read_timeout_s
        response = self._send("GET", path, query, None, None, connect_timeout_s, read_timeout_s, head_by)
        ended, alarm = False, None
        try:
            if not 200 <= response.status <= 299:
                alarm = WATCHDOG.arm(time.monotonic() + read_timeout_s, response.shutdown)
                data = response.read(ERROR_READ)
                raise error_for(
                    response.status,
                    f"watch {path}: HTTP {response.status} {status_message(data)}".strip(),
                    reason=response.reason or "",
                    body=data[:MAX_ERROR_BODY].decode(errors="replace"),
                )
            lines = WatchLines(max_event_bytes)
            while True:
                chunk = response.read1(64 * 1024)  # at most one read of the socket: the line's time is checked
                if not chunk:
                    break
                events = lines.feed(chunk)
                if alarm is not None and (events or not lines.pending):  # the line begun has ended
                    alarm.cancel()
                    alarm = None
                yield from events
                if lines.pending and alarm is None:
                    alarm = WATCHDOG.arm(time.monotonic() + read_timeout_s, response.shutdown)
            if alarm is not None and alarm.fired:
                raise Unavailable(f"watch {path}: an event not ended within {read_timeout_s} s of its first byte")
            ended = True
        except urllib3.exceptions.HTTPError as exc:
            late = alarm is not None and alarm.fired
            cause = TimeoutError(f"an event not ended within {read_timeout_s} s of its first byte") if late else exc
            raise unavailable(f"watch {path}", cause) from exc
        finally:
            if alarm is not None:
                alarm.cancel()
            # a stream the server ended goes back to the pool; one left early (an ERROR event, a
            # line over the bound, a stop) may hold unread bytes, so its connection is closed
            response.release_conn() if ended else response.close()

    def close(self) -> None:
        self._pool.clear()
        if self._lane is not None:
            self._lane.close()
