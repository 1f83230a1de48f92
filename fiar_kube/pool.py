"""The urllib3 pool that carries watch streams (and requests where the lane does not)."""

from __future__ import annotations

import contextlib
import functools
import socket
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

from .deadline import WATCHDOG
from .errors import ConfigError
from .proxy import proxy_for
from .tls import tls_context


def pool_manager(cfg: Any, maxsize: int, num_pools: int = 4, environ: Mapping[str, str] | None = None) -> Any:
    """A urllib3 pool with the configuration's TLS settings (``tls_context``, the lane's), through its
    proxy unless bypassed. A client certificate in files is named to urllib3 as well, which loads it
    again on each new connection (a rotated certificate is used next); one in memory is in the context."""
    import ssl

    import urllib3

    args: dict[str, Any] = {
        "num_pools": num_pools,
        "maxsize": maxsize,
        "cert_reqs": ssl.CERT_REQUIRED if cfg.verify_ssl else ssl.CERT_NONE,
    }
    try:
        args["ssl_context"] = tls_context(cfg)
    except (OSError, ValueError):  # an unreadable CA or certificate: urllib3 fails each connection on it
        args["ca_certs"] = cfg.ssl_ca_cert
    if cfg.cert_file and not getattr(cfg, "key_data", None):
        args["cert_file"], args["key_file"] = cfg.cert_file, cfg.key_file
    optional = {"assert_hostname": "assert_hostname", "server_hostname": "tls_server_name"}
    for arg, attribute in optional.items():
        value = getattr(cfg, attribute, None)
        if value is not None:
            args[arg] = value
    if getattr(cfg, "socket_options", None) is not None:
        args["socket_options"] = cfg.socket_options
    proxy = proxy_for(cfg, environ)
    if proxy is None:
        return _timed(urllib3.PoolManager(**args))
    headers = getattr(cfg, "proxy_headers", None)
    if urlsplit(proxy).scheme.lower().startswith("socks"):
        try:
            from urllib3.contrib.socks import SOCKSProxyManager
        except ImportError as exc:  # PySocks is not installed
            raise ConfigError(f"the proxy {proxy} needs PySocks: {exc}") from exc
        return SOCKSProxyManager(proxy, headers=headers, **args)
    return _timed(urllib3.ProxyManager(proxy, proxy_headers=headers, **args))


_HEAD_BY: ContextVar[float | None] = ContextVar("fiar_kube_head_by", default=None)


@contextlib.contextmanager
def head_by(deadline: float | None) -> Iterator[None]:
    """Requests made inside have their answer's head read by ``deadline``: the watchdog shuts the
    connection's socket down then (urllib3 bounds each read of the head, not the whole of it)."""
    token = _HEAD_BY.set(deadline)
    try:
        yield
    finally:
        _HEAD_BY.reset(token)


def _timed(manager: Any) -> Any:
    manager.pool_classes_by_scheme = _timed_pools()
    return manager


@functools.cache
def _timed_pools() -> dict[str, Any]:
    """urllib3's pools, with connections whose answer's head is read under ``head_by``'s deadline."""
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    class TimedHead:
        sock: Any

        def getresponse(self) -> Any:
            deadline, sock = _HEAD_BY.get(), self.sock
            if deadline is None or sock is None:
                return super().getresponse()  # type: ignore[misc]
            alarm = WATCHDOG.arm(deadline, lambda: sock.shutdown(socket.SHUT_RDWR))
            try:
                response = super().getresponse()  # type: ignore[misc]
            finally:
                alarm.cancel()
            if alarm.fired:  # http.client reads the end of a connection as the end of the head
                raise TimeoutError("the answer's head did not end by the request's deadline")
            return response

    class TimedHTTPConnection(TimedHead, HTTPConnection):
        pass

    class TimedHTTPSConnection(TimedHead, HTTPSConnection):
        pass

    class TimedHTTPPool(HTTPConnectionPool):
        ConnectionCls = TimedHTTPConnection

    class TimedHTTPSPool(HTTPSConnectionPool):
        ConnectionCls = TimedHTTPSConnection

    return {"http": TimedHTTPPool, "https": TimedHTTPSPool}
