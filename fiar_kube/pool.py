"""The urllib3 pool that carries watch streams (and requests where the lane does not)."""

from __future__ import annotations

import contextlib
import functools
import socket
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

from .deadline import WATCHDOG
from .errors import ConfigError
from .proxy import proxy_for
from .tls import tls_context


def pool_manager(cfg: Any, maxsize: int, num_pools: int = 4, environ: Mapping[str, str] | None = None) -> Any:
    """A urllib3 pool with the configuration's TLS settings, through its proxy unless bypassed. Each
    new connection makes its own context (``tls_context``, as the lane does): its CA and client
    certificate are read again (a rotated certificate is used next), and no context is shared between
    threads. urllib3 given one context changes it on every connection (``load_cert_chain`` of the
    certificate files, ``verify_mode``, ``check_hostname``) while other threads handshake with it,
    which OpenSSL does not allow: the process died by SIGSEGV when watches started together."""
    import ssl

    import urllib3

    args: dict[str, Any] = {
        "num_pools": num_pools,
        "maxsize": maxsize,
        "cert_reqs": ssl.CERT_REQUIRED if cfg.verify_ssl else ssl.CERT_NONE,
    }
    optional = {"assert_hostname": "assert_hostname", "server_hostname": "tls_server_name"}
    for arg, attribute in optional.items():
        value = getattr(cfg, attribute, None)
        if value is not None:
            args[arg] = value
    if getattr(cfg, "socket_options", None) is not None:
        args["socket_options"] = cfg.socket_options
    proxy = proxy_for(cfg, environ)
    if proxy is None:
        return _own_contexts(urllib3.PoolManager(**args), cfg)
    headers = getattr(cfg, "proxy_headers", None)
    if urlsplit(proxy).scheme.lower().startswith("socks"):
        try:
            from urllib3.contrib.socks import SOCKSProxyManager
        except ImportError as exc:  # PySocks is not installed
            raise ConfigError(f"the proxy {proxy} needs PySocks: {exc}") from exc
        return _own_contexts(SOCKSProxyManager(proxy, headers=headers, **args), cfg, socks=True)
    return _own_contexts(urllib3.ProxyManager(proxy, proxy_headers=headers, **args), cfg)


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


def _own_contexts(manager: Any, cfg: Any, socks: bool = False) -> Any:
    """``manager`` with pools whose connections make their own TLS context from ``cfg`` when they
    connect (and, but through SOCKS, read their answer's head under ``head_by``'s deadline)."""
    manager.pool_classes_by_scheme = _pools(functools.partial(tls_context, cfg), socks)
    return manager


def _pools(make_context: Callable[[], Any], socks: bool) -> dict[str, Any]:
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    base_connections: tuple[type[Any], type[Any]] = (HTTPConnection, HTTPSConnection)
    base_pools: tuple[type[Any], type[Any]] = (HTTPConnectionPool, HTTPSConnectionPool)
    if socks:
        from urllib3.contrib import socks as socks_module

        base_connections = (socks_module.SOCKSConnection, socks_module.SOCKSHTTPSConnection)
        base_pools = (socks_module.SOCKSHTTPConnectionPool, socks_module.SOCKSHTTPSConnectionPool)

    class OwnContext:
        ssl_context: Any

        def connect(self) -> None:
            self.ssl_context = make_context()  # read now; urllib3 changes it on this connection only
            super().connect()  # type: ignore[misc]

    mixins: tuple[type[Any], ...] = () if socks else (TimedHead,)
    connection = type("Connection", (*mixins, base_connections[0]), {})
    tls_connection = type("TLSConnection", (OwnContext, *mixins, base_connections[1]), {})
    return {
        "http": type("Pool", (base_pools[0],), {"ConnectionCls": connection}),
        "https": type("TLSPool", (base_pools[1],), {"ConnectionCls": tls_connection}),
    }


class TimedHead:
    """A connection whose answer's head is read by ``head_by``'s deadline."""

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
