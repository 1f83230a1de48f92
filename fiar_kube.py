"""The one seam to the Kubernetes API, shared by the operator and the node agent (neither imports the other).

Both components talk raw JSON: requests on kept connections of this module's own (``Lane``: a
request costs less than half what it costs through urllib3), watch streams over a urllib3 pool.
Objects stay plain dicts. The kubernetes package is imported only to load a kubeconfig whose user
authenticates in a way ``from_kubeconfig`` does not read (``exec`` plugins, auth providers): its
client costs 17.7 MiB of resident memory on import.
Nothing is imported at module level but the standard library: urllib3 and PyYAML are loaded when a
component first talks to the API.

Each rule is stated once here:

* credentials: ``load_config`` (kubeconfig, else in-cluster, else optionally the default kubeconfig),
  as ``Credentials``; the in-cluster token (and a kubeconfig's ``tokenFile``) is re-read whenever its
  file changes (the kubelet rotates it), so a rotated token is used on the next request;
* the authorization header: ``authorization`` (the refresh hook of the configuration runs first);
* the pool: ``pool_manager`` with the configuration's TLS settings, and the proxy of the kubeconfig or
  the environment (``HTTPS_PROXY``), except for hosts that ``NO_PROXY`` names (``bypasses_proxy``);
  the lane makes the same TLS settings (``_tls_context``) and carries requests only where no proxy
  is used (``Lane.for_config``).
  In-cluster the API server is always reached directly: its service address is only routable inside
  the cluster, so a proxy set for egress must never carry the API traffic;
* errors: ``error_for`` maps an HTTP status (or a watch ERROR event's Status) to a type, once;
  callers decide by type (``NotFound``, ``Conflict``, ``Gone``, ...), never by number;
* watch streams: ``WatchLines`` splits the byte stream into JSON events, each line bounded;
* retries: ``Backoff`` / ``backoff_delay``; urllib3 never retries on its own, and the lane sends
  again only a GET whose kept connection turned out closed before any byte of an answer.

The transport is synchronous: both components call the API from threads (the operator's webhooks
hand their few reads to a thread pool), so there is one transport, not a sync and an async one.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from ipaddress import ip_address, ip_network
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, urlencode, urlsplit

if TYPE_CHECKING:
    import urllib3

JSON: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"

SERVICE_ACCOUNT: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
MAX_EVENT_BYTES: Final = 16 * 1024 * 1024
"""Longest watch event line accepted: well above the API server's largest object (its request limit
is 3 MiB), far below what an endless line would take."""
MAX_ERROR_BODY: Final = 300
"""Characters of an error answer kept in the error (messages go to logs)."""
ERROR_READ: Final = 64 * 1024
"""Bytes of an error answer read at most (its Status message is in the first few hundred)."""


# -- errors --------------------------------------------------------------------------------------
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


# -- backoff -------------------------------------------------------------------------------------
def backoff_delay(
    attempt: int,
    *,
    initial: float,
    cap: float,
    factor: float = 2.0,
    jitter: tuple[float, float] = (-0.2, 0.2),
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """``min(cap, initial * factor**attempt)``, scaled by ``1 + uniform(*jitter)``."""
    try:
        base = min(cap, initial * factor**attempt)
    except OverflowError:  # after about a thousand attempts factor**attempt leaves the floats
        base = cap
    low, high = jitter
    return base * (1.0 + (uniform(low, high) if low != high else low))


@dataclass
class Backoff:
    """Exponential backoff with jitter: ``initial * factor**n`` capped at ``cap`` seconds, each delay
    scaled by a random factor in ``1 + jitter`` (by default 0.8 to 1.2)."""

    initial: float = 1.0
    cap: float = 60.0
    factor: float = 2.0
    jitter: tuple[float, float] = (-0.2, 0.2)
    attempts: int = field(default=0, init=False)

    def next_delay(self) -> float:
        delay = backoff_delay(self.attempts, initial=self.initial, cap=self.cap, factor=self.factor, jitter=self.jitter)
        self.attempts += 1
        return delay

    def reset(self) -> None:
        self.attempts = 0


# -- credentials ---------------------------------------------------------------------------------
class TokenFile:
    """The refresh hook of an in-cluster configuration: re-reads the service-account token whenever
    its file changed (one ``stat`` per request). An unreadable or empty file keeps the last token."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None

    def __call__(self, cfg: Any) -> None:
        try:
            st = os.stat(self.path)
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen == self._seen:
                return
            with open(self.path) as f:
                token = f.read(64 * 1024).strip()
        except OSError:
            return
        if token:
            cfg.api_key["BearerToken"] = f"Bearer {token}"
            cfg.api_key_prefix.pop("BearerToken", None)
            self._seen = seen


class Credentials:
    """Where the API server is and how to prove who we are: the attributes of a kubernetes
    ``Configuration`` that this module reads (``pool_manager``, ``authorization``, kopf's login), and
    nothing else. ``load_config`` makes one for the in-cluster service account and for a kubeconfig
    whose user has a client certificate, a token or a token file, without importing the kubernetes
    package: its client costs 17.7 MiB of resident memory on import (BENCHMARKS.md, "Memory")."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.ssl_ca_cert: str | None = None
        self.cert_file: str | None = None
        self.key_file: str | None = None
        self.verify_ssl = True
        self.tls_server_name: str | None = None  # the optional settings ``pool_manager`` asks for by getattr
        self.proxy: str | None = None
        self.no_proxy: str | None = None
        self.api_key: dict[str, str] = {}
        self.api_key_prefix: dict[str, str] = {}
        self.refresh_api_key_hook: Callable[[Any], None] | None = None

    def get_api_key_with_prefix(self, identifier: str) -> str | None:
        """The key named ``identifier`` with its prefix (the refresh hook runs first), as kubernetes'
        ``Configuration`` answers it."""
        if self.refresh_api_key_hook is not None:
            self.refresh_api_key_hook(self)
        key = self.api_key.get(identifier)
        if not key:
            return None
        prefix = self.api_key_prefix.get(identifier)
        return f"{prefix} {key}" if prefix else key


class _NotLoaded(Exception):
    """This module's loaders cannot load these credentials (``load_config`` says why, or asks the
    kubernetes package when ``delegate`` is set)."""

    def __init__(self, message: str, delegate: bool = False) -> None:
        super().__init__(message)
        self.delegate = delegate


def in_cluster(environ: Mapping[str, str], service_account: str) -> Credentials:
    """The pod's service account: the API server's service address from ``KUBERNETES_SERVICE_HOST``
    and ``_PORT``, its CA and token from ``service_account`` (the token re-read when it changes)."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise _NotLoaded("Service host/port is not set.")
    token, ca = os.path.join(service_account, "token"), os.path.join(service_account, "ca.crt")
    if not os.path.isfile(token):
        raise _NotLoaded("Service token file does not exist.")
    if not os.path.isfile(ca):
        raise _NotLoaded("Service certificate file does not exist.")
    try:
        literal = ip_address(host)
    except ValueError:
        literal = None
    cfg = Credentials(
        f"https://[{host}]:{port}" if literal is not None and literal.version == 6 else f"https://{host}:{port}"
    )
    cfg.ssl_ca_cert = ca
    cfg.refresh_api_key_hook = TokenFile(token)
    cfg.refresh_api_key_hook(cfg)
    if not cfg.api_key.get("BearerToken"):
        raise _NotLoaded("Token file exists but empty.")
    cfg.no_proxy = "*"  # in-cluster: the API server's service address, never through a proxy
    return cfg


KUBECONFIG_MAX: Final = 4 * 1024 * 1024
"""Bytes of a kubeconfig file read at most."""


def _named(doc: Mapping[str, Any], section: str, name: Any) -> Mapping[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            inner = entry.get(section[:-1])
            return inner if isinstance(inner, Mapping) else {}
    raise _NotLoaded(f"{section[:-1]} {name!r} is not in the kubeconfig")


def _file(value: Any, folder: str) -> str:
    path = os.path.expanduser(str(value))
    return path if os.path.isabs(path) else os.path.join(folder, path)


def _data_file(data: Any, suffix: str) -> str:
    """Inline base64 ``data`` in a file of this process's own (mode 0600, removed at exit): the TLS
    library reads certificates and keys from files."""
    import atexit
    import base64
    import tempfile

    try:
        raw = base64.standard_b64decode(str(data))
    except ValueError as exc:
        raise _NotLoaded(f"{suffix} data is not base64: {exc}") from exc
    fd, path = tempfile.mkstemp(prefix="fiar-kubeconfig-", suffix=f".{suffix}")
    with os.fdopen(fd, "wb") as out:
        out.write(raw)
    atexit.register(_remove, path)
    return path


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def from_kubeconfig(path: str) -> Credentials:
    """The current context of the kubeconfig ``path``: its cluster's server, CA (file or data), TLS
    server name, insecure flag and proxy URL; its user's client certificate and key (files or data),
    token or token file (re-read when it changes). Paths are relative to the kubeconfig's folder, as
    kubectl reads them. Users of other kinds (``exec``, ``auth-provider``, basic auth) raise
    ``_NotLoaded`` with ``delegate`` set."""
    import yaml

    with open(path, "rb") as f:
        text = f.read(KUBECONFIG_MAX + 1)
    if len(text) > KUBECONFIG_MAX:
        raise _NotLoaded(f"the kubeconfig is over {KUBECONFIG_MAX} bytes")
    doc = yaml.safe_load(text)
    if not isinstance(doc, Mapping):
        raise _NotLoaded("the kubeconfig is not a YAML mapping")
    current = doc.get("current-context")
    if not current:
        raise _NotLoaded("the kubeconfig names no current-context")
    context = _named(doc, "contexts", current)
    cluster = _named(doc, "clusters", context.get("cluster"))
    user: Mapping[str, Any] = {}
    if context.get("user"):
        user = _named(doc, "users", context.get("user"))
    if any(user.get(k) for k in ("exec", "auth-provider", "username", "password", "as", "impersonate")):
        raise _NotLoaded("the kubeconfig's user authenticates another way", delegate=True)
    server = cluster.get("server")
    if not server:
        raise _NotLoaded(f"cluster {context.get('cluster')!r} has no server")
    folder = os.path.dirname(os.path.abspath(path))
    cfg = Credentials(str(server).rstrip("/"))
    if cluster.get("certificate-authority-data"):
        cfg.ssl_ca_cert = _data_file(cluster["certificate-authority-data"], "crt")
    elif cluster.get("certificate-authority"):
        cfg.ssl_ca_cert = _file(cluster["certificate-authority"], folder)
    cfg.verify_ssl = not cluster.get("insecure-skip-tls-verify")
    if cluster.get("tls-server-name"):
        cfg.tls_server_name = str(cluster["tls-server-name"])
    if cluster.get("proxy-url"):
        cfg.proxy = str(cluster["proxy-url"])
    for key, attribute, suffix in (("client-certificate", "cert_file", "crt"), ("client-key", "key_file", "key")):
        if user.get(f"{key}-data"):
            setattr(cfg, attribute, _data_file(user[f"{key}-data"], suffix))
        elif user.get(key):
            setattr(cfg, attribute, _file(user[key], folder))
    if user.get("token"):
        cfg.api_key["authorization"] = f"Bearer {user['token']}"
    elif user.get("tokenFile"):
        cfg.refresh_api_key_hook = TokenFile(_file(user["tokenFile"], folder))
        cfg.refresh_api_key_hook(cfg)
    return cfg


def _kubeconfig(path: str | None) -> Any:
    """``path`` (None: ``$KUBECONFIG``, else ``~/.kube/config``), by ``from_kubeconfig``, else by the
    kubernetes package's loader (a user of another kind, or ``$KUBECONFIG`` naming several files)."""
    chosen = path or os.environ.get("KUBECONFIG") or "~/.kube/config"
    if os.pathsep not in chosen:
        try:
            return from_kubeconfig(os.path.expanduser(chosen))
        except _NotLoaded as exc:
            if not exc.delegate:
                raise
    from kubernetes import client, config

    cfg = client.Configuration()
    cfg.no_proxy = None  # read from the process's environment by the client; ``proxy_for`` decides
    config.load_kube_config(config_file=path, client_configuration=cfg)
    return cfg


def load_config(
    kubeconfig: str | None,
    *,
    default_kubeconfig: bool = False,
    environ: Mapping[str, str] | None = None,
    service_account: str = SERVICE_ACCOUNT,
) -> Any:
    """Credentials (``Credentials``, or a kubernetes ``Configuration`` for a kubeconfig user this module
    does not load): from ``kubeconfig`` when given, else the in-cluster service account
    (``KUBERNETES_SERVICE_HOST``/``_PORT`` and ``service_account``'s token and CA), else, with
    ``default_kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``. ``ConfigError`` when none loads.
    ``environ`` (default: the process's) is where those variables are read."""
    try:
        if kubeconfig:
            return _kubeconfig(kubeconfig)
        try:
            return in_cluster(os.environ if environ is None else environ, service_account)
        except _NotLoaded:
            if not default_kubeconfig:
                raise
            default = None if environ is None else environ.get("KUBECONFIG", "~/.kube/config")
            return _kubeconfig(default)
    except Exception as exc:  # _NotLoaded, OSError, yaml errors, the kubernetes loader's errors
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster service account"
        if not kubeconfig and default_kubeconfig:
            where += " or ~/.kube/config"
        raise ConfigError(f"cannot load {where}: {exc}") from exc


def authorization(cfg: Any) -> str | None:
    """The Authorization header value (the configuration's refresh hook runs first), or None."""
    token = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    return str(token) if token else None


# -- the pool ------------------------------------------------------------------------------------
def bypasses_proxy(url: str, no_proxy: str | None) -> bool:
    """Whether ``NO_PROXY`` (comma-separated: ``*``, host names with their subdomains, ``.suffix``,
    ``host:port``, IP addresses and CIDR ranges) names the host of ``url``."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host:
        return True
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        address = ip_address(host)
    except ValueError:
        address = None
    for raw in (no_proxy or "").split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if address is not None:
            try:
                if address in ip_network(entry.strip("[]"), strict=False):
                    return True
            except ValueError:
                pass
        if entry.startswith("["):  # [IPv6]:port
            name, _, rest = entry[1:].partition("]")
            entry_port = rest[1:] if rest.startswith(":") else ""
        elif entry.count(":") == 1:  # host:port
            name, _, entry_port = entry.partition(":")
        else:
            name, entry_port = entry, ""
        if entry_port and entry_port != str(port):
            continue
        name = name.lstrip(".")
        if name and (host == name or host.endswith("." + name)):
            return True
    return False


def proxy_for(cfg: Any, environ: Mapping[str, str] | None = None) -> str | None:
    """The proxy URL for the configuration's API server, or None to connect directly."""
    found = proxies(os.environ if environ is None else environ)
    host = str(cfg.host)
    explicit = getattr(cfg, "proxy", None)
    if explicit:  # a kubeconfig's proxy-url is used as given (as client-go does: NO_PROXY is not read)
        return str(explicit)
    proxy = found.get(urlsplit(host).scheme) or found.get("all")
    if not proxy:
        return None
    no_proxy = getattr(cfg, "no_proxy", None)
    return None if bypasses_proxy(host, no_proxy if no_proxy is not None else found.get("no")) else str(proxy)


def proxies(environ: Mapping[str, str]) -> dict[str, str]:
    """``{"https": ..., "no": ...}`` from ``*_proxy`` variables; a lowercase name wins (as in urllib)."""
    found: dict[str, str] = {}
    for key, value in environ.items():
        name = key.lower()
        if value and name.endswith("_proxy") and (key.islower() or name[:-6] not in found):
            found[name[:-6]] = value
    return found


def pool_manager(cfg: Any, maxsize: int, num_pools: int = 4, environ: Mapping[str, str] | None = None) -> Any:
    """A urllib3 pool with the configuration's TLS settings, through its proxy unless bypassed."""
    import ssl

    import urllib3

    args: dict[str, Any] = {
        "num_pools": num_pools,
        "maxsize": maxsize,
        "cert_reqs": ssl.CERT_REQUIRED if cfg.verify_ssl else ssl.CERT_NONE,
        "ca_certs": cfg.ssl_ca_cert,
        "cert_file": cfg.cert_file,
        "key_file": cfg.key_file,
    }
    optional = {
        "ca_cert_data": "ca_cert_data",
        "assert_hostname": "assert_hostname",
        "server_hostname": "tls_server_name",
        "socket_options": "socket_options",
    }
    for arg, attribute in optional.items():
        value = getattr(cfg, attribute, None)
        if value is not None:
            args[arg] = value
    proxy = proxy_for(cfg, environ)
    if proxy is None:
        return urllib3.PoolManager(**args)
    headers = getattr(cfg, "proxy_headers", None)
    if urlsplit(proxy).scheme.lower().startswith("socks"):
        try:
            from urllib3.contrib.socks import SOCKSProxyManager
        except ImportError as exc:  # PySocks is not installed
            raise ConfigError(f"the proxy {proxy} needs PySocks: {exc}") from exc
        return SOCKSProxyManager(proxy, headers=headers, **args)
    return urllib3.ProxyManager(proxy, proxy_headers=headers, **args)


Timeout = float | tuple[float, float] | None
"""A total in seconds, or (connect, read) seconds, or None for no limit."""


# -- kept connections ----------------------------------------------------------------------------
MAX_HEAD_BYTES: Final = 64 * 1024
"""Bytes of an answer's status line and headers at most (the API server sends about 300)."""
KEPT_IDLE_S: Final = 60.0
"""Seconds a kept connection may sit idle and still be used: below the API server's own 90 s
(``IdleTimeout`` of k8s.io/apiserver's secure serving), so that no request is sent on a connection
the server is closing."""
_CONTROL: Final = re.compile(r"[\x00-\x20\x7f]")
_BREAK: Final = re.compile(r"[\r\n\x00]")
_SAFE_AGAIN: Final = frozenset({"GET", "HEAD"})
"""Methods sent again on a new connection when a kept one turns out closed before any answer."""


class _Broken(Exception):
    """The server's answer was not HTTP/1.x as this module reads it, or ended early."""


class _Closed(_Broken):
    """The connection ended before any byte of an answer (a kept connection the server closed)."""


class Lane:
    """HTTP/1.1 requests to the API server on kept connections, written on ``socket`` and ``ssl``.

    An Event POST through urllib3 costs this process 542-667 µs of CPU on the development machine,
    most of it in urllib3's and ``http.client``'s Python (``email`` parses each answer's headers);
    on this lane 235-283 µs, a GET 168-221 µs against 451-543 (``bench/operator_python_floor.py``,
    BENCHMARKS.md). It carries ``Client.request``. Watch streams stay on urllib3: read on this lane,
    an event cost as much (131-153 µs, most of it TLS and ``json.loads``). ``for_config`` gives None
    for what it does not reproduce exactly (a proxy, a name to check the certificate against that is
    not the server's), and urllib3 carries those requests too.

    Answers are framed by Content-Length, chunked encoding, or the end of the connection; a kept
    connection is used again only when its answer was read whole, the server did not ask to close
    it, no byte is waiting on it, and it was idle less than ``KEPT_IDLE_S``. Thread-safe: each
    request holds its connection alone; at most ``maxsize`` are kept."""

    def __init__(self, cfg: Any, maxsize: int, clock: Callable[[], float] = time.monotonic) -> None:
        parts = urlsplit(str(cfg.host))
        self.tls = parts.scheme == "https"
        self.hostname = parts.hostname or ""
        self.address = (self.hostname, parts.port or (443 if self.tls else 80))
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        self.authority = f"{host}:{parts.port}" if parts.port else host
        """The Host header: host and port only (never a ``user:password@`` of the URL)."""
        self.prefix = parts.path.rstrip("/")
        self.server_hostname = getattr(cfg, "tls_server_name", None) or self.hostname
        self.maxsize = maxsize
        self.socket_options: list[tuple[int, int, int]] | None = getattr(cfg, "socket_options", None)
        self.cfg, self.clock = cfg, clock
        self._kept: list[tuple[Any, float]] = []
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def for_config(cls, cfg: Any, maxsize: int, environ: Mapping[str, str] | None = None) -> Lane | None:
        """The lane for ``cfg``, or None where urllib3 must carry its requests."""
        scheme = urlsplit(str(cfg.host)).scheme
        if scheme not in ("http", "https") or proxy_for(cfg, environ) is not None:
            return None
        if isinstance(getattr(cfg, "assert_hostname", None), str):
            return None
        return cls(cfg, maxsize)

    def request(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None, timeout: Timeout, limit: int
    ) -> tuple[int, str, bytes]:
        """(status, reason, body) of one request; a body of an answer outside 2xx is read up to
        ``limit`` bytes. ``OSError`` or ``_Broken`` when the exchange fails."""
        connect_s, read_s, deadline = _limits(timeout)
        sock, reader, (status, reason, fields, keep) = self._exchange(
            method, target, headers, body, connect_s, read_s, deadline
        )
        try:
            answer, whole = _body(reader, method, status, fields, _UNBOUNDED if 200 <= status <= 299 else limit)
        except BaseException:
            sock.close()
            raise
        self._give(sock) if keep and whole and not reader.buffer else sock.close()
        return status, reason, answer

    def _exchange(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        connect_s: float | None,
        read_s: float | None,
        deadline: float | None,
    ) -> tuple[Any, _Reader, tuple[int, str, dict[str, str], bool]]:
        """Send the request and read its answer's head: (connection, its reader, the head). A target
        or a header value with a control character is a ValueError, as in ``http.client``."""
        if _CONTROL.search(target) or any(_BREAK.search(v) for v in headers.values()):
            raise ValueError(f"a request target or header value with a control character: {target[:100]!r}")
        lines = [f"{method} {self.prefix}{target} HTTP/1.1", f"Host: {self.authority}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
        while True:
            sock, kept = self._take(connect_s, deadline)
            reader = _Reader(sock, read_s, deadline)
            try:
                sock.settimeout(_within(reader.read_s, deadline))
                sock.sendall(data)
                return sock, reader, _head(reader)
            except (_Closed, BrokenPipeError, ConnectionResetError):
                sock.close()
                if kept and method in _SAFE_AGAIN:  # the server closed it as it was taken
                    continue
                raise
            except BaseException:
                sock.close()
                raise

    def _take(self, connect_s: float | None, deadline: float | None) -> tuple[Any, bool]:
        now = self.clock()
        while True:
            with self._lock:
                if not self._kept:
                    break
                sock, since = self._kept.pop()
            poll = select.poll()
            poll.register(sock, select.POLLIN)
            waiting = poll.poll(0) or (self.tls and sock.pending())  # bytes on the socket, or decrypted
            if now - since < KEPT_IDLE_S and not waiting:
                return sock, True
            sock.close()  # the server closed it, sent what nobody asked for, or it sat idle too long
        return self._connect(connect_s, deadline), False

    def _connect(self, connect_s: float | None, deadline: float | None) -> Any:
        """A new connection; its TLS settings are read from the configuration's files each time, as
        urllib3 does (a rotated client certificate is used on the next connection)."""
        sock = socket.create_connection(self.address, timeout=_within(connect_s, deadline))
        try:
            for option in self.socket_options if self.socket_options is not None else _NODELAY:
                sock.setsockopt(*option)
            if self.tls:
                sock.settimeout(_within(connect_s, deadline))  # the handshake gets what time is left
                sock = _tls_context(self.cfg).wrap_socket(sock, server_hostname=self.server_hostname)
        except BaseException:
            sock.close()
            raise
        return sock

    def _give(self, sock: Any) -> None:
        with self._lock:
            if not self._closed and len(self._kept) < self.maxsize:
                self._kept.append((sock, self.clock()))
                return
        sock.close()

    def close(self) -> None:
        """Close the kept connections; one still in use is closed when its request ends."""
        with self._lock:
            self._closed = True
            kept, self._kept = self._kept, []
        for sock, _ in kept:
            sock.close()


_NODELAY: Final = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
"""urllib3's default socket options: a request is one write, its answer not held back."""


def _tls_context(cfg: Any) -> ssl.SSLContext:
    """The TLS settings urllib3 makes of the same configuration (``pool_manager``): TLS 1.2 or later,
    the configuration's CA (else the system's), its client certificate, the server's name checked
    against the certificate's subject alternative names (never its CN) unless verification is off
    or ``assert_hostname`` is False."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.hostname_checks_common_name = False  # a name only in the subject's CN is no match (urllib3 2)
    context.options |= ssl.OP_NO_TICKET
    context.set_alpn_protocols(["http/1.1"])
    if not cfg.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        ca_file, ca_data = cfg.ssl_ca_cert, getattr(cfg, "ca_cert_data", None)
        if ca_file or ca_data:
            context.load_verify_locations(cafile=ca_file or None, cadata=ca_data or None)
        else:
            context.load_default_certs()
        if getattr(cfg, "assert_hostname", None) is False:
            context.check_hostname = False
    if cfg.cert_file:
        context.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    return context


def _limits(timeout: Timeout) -> tuple[float | None, float | None, float | None]:
    """(connect seconds, seconds per read, deadline) of a ``Timeout``: a total bounds both by one deadline."""
    if isinstance(timeout, tuple):
        return timeout[0], timeout[1], None
    if timeout is None:
        return None, None, None
    return timeout, timeout, time.monotonic() + timeout


def _within(seconds: float | None, deadline: float | None) -> float | None:
    if deadline is None:
        return seconds
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the request's time is up")
    return left if seconds is None else min(seconds, left)


class _Reader:
    """An answer's bytes from one connection, read as they are asked for."""

    def __init__(self, sock: Any, read_s: float | None, deadline: float | None) -> None:
        self.sock, self.read_s, self.deadline = sock, read_s, deadline
        self.buffer = bytearray()
        self.scratch = bytearray(_RECEIVE)
        self.view = memoryview(self.scratch)
        self.received = 0

    def fill(self) -> bool:
        """Read what has come; False at the end of the connection."""
        self.sock.settimeout(_within(self.read_s, self.deadline))
        count = self.sock.recv_into(self.scratch)
        if not count:
            return False
        self.received += count
        self.buffer += self.view[:count]
        return True

    def until(self, mark: bytes, bound: int) -> bytes:
        """The bytes before ``mark``, consumed with it; ``_Broken`` past ``bound`` bytes."""
        start = 0
        while True:
            found = self.buffer.find(mark, start)
            if found >= 0:
                line = bytes(self.buffer[:found])
                del self.buffer[: found + len(mark)]
                return line
            if len(self.buffer) > bound:
                raise _Broken(f"a line of the answer over {bound} bytes")
            start = max(0, len(self.buffer) - len(mark) + 1)
            if not self.fill():
                raise (_Closed if self.received == 0 else _Broken)("the connection ended before the answer")

    def pieces(self, count: int, to_end: bool) -> Iterator[bytes]:
        """The next ``count`` bytes, in pieces of at most ``_PIECE`` handed out once read whole (a watch
        event is one chunk: one piece); with ``to_end``, fewer when the connection ends first (else
        ``_Broken``)."""
        while count > 0:
            want = min(count, _PIECE)
            while len(self.buffer) < want:
                if not self.fill():
                    if not to_end:
                        raise _Broken("the connection ended inside the answer's body")
                    if self.buffer:
                        yield bytes(self.buffer)
                        self.buffer.clear()
                    return
            piece = bytes(memoryview(self.buffer)[:want])
            del self.buffer[:want]
            count -= want
            yield piece


_PIECE: Final = 1024 * 1024
"""Bytes of a body handed out at most at once."""
_RECEIVE: Final = 64 * 1024
"""Bytes read from a connection at a time (TLS hands out one record of at most 16 KiB per read)."""
_UNBOUNDED: Final = 1 << 62


def _head(reader: _Reader) -> tuple[int, str, dict[str, str], bool]:
    """(status, reason, fields, whether HTTP/1.1 lets the connection be kept) of the first answer that
    is not interim (1xx)."""
    while True:
        lines = reader.until(b"\r\n\r\n", MAX_HEAD_BYTES).split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code, _, reason = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise _Broken(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        fields: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise _Broken(f"not a header line: {line[:80]!r}")
            key, text = name.strip().lower().decode("latin-1"), value.strip().decode("latin-1")
            fields[key] = f"{fields[key]}, {text}" if key in fields else text
        status = int(code)
        if not 100 <= status <= 199:
            keep = version == b"HTTP/1.1" and "close" not in fields.get("connection", "").lower()
            return status, reason.decode("latin-1"), fields, keep


def _length(fields: Mapping[str, str]) -> int | None:
    length = fields.get("content-length")
    if length is None:
        return None
    if not (length.isascii() and length.isdigit()):
        raise _Broken(f"a Content-Length that is not a number: {length[:40]!r}")
    return int(length)


def _body(reader: _Reader, method: str, status: int, fields: Mapping[str, str], bound: int) -> tuple[bytes, bool]:
    """The answer's body, up to ``bound`` bytes; whether it was read whole by its framing (else the
    connection cannot be used again)."""
    if method == "HEAD" or status in (204, 304):
        return b"", True
    coding = fields.get("transfer-encoding")
    if coding is not None and coding.lower().rsplit(",", 1)[-1].strip() != "chunked":
        # a transfer coding this module does not decode (or chunked not last): framed by the end of
        # the connection, as RFC 9112 says, whatever Content-Length says
        return b"".join(reader.pieces(bound, True)), False
    if coding is not None:
        parts: list[bytes] = []
        total = 0
        for piece in _chunks(reader):
            parts.append(piece[: bound - total])
            total += len(parts[-1])
            if total >= bound:
                return b"".join(parts), False
        return b"".join(parts), True
    length = _length(fields)
    if length is None:
        return b"".join(reader.pieces(bound, True)), False
    return b"".join(reader.pieces(min(length, bound), False)), length <= bound


def _chunks(reader: _Reader) -> Iterator[bytes]:
    """The data of a chunked body as it arrives, up to its last chunk and trailers."""
    while True:
        size_text = reader.until(b"\r\n", 1024).split(b";", 1)[0].strip()
        if not size_text or any(c not in _HEX for c in size_text):
            raise _Broken(f"not a chunk size: {size_text[:40]!r}")
        size = int(size_text, 16)
        if size == 0:
            while reader.until(b"\r\n", MAX_HEAD_BYTES):  # trailers, up to the empty line
                pass
            return
        yield from reader.pieces(size, False)
        if reader.until(b"\r\n", 2) != b"":
            raise _Broken("a chunk not followed by CRLF")


_HEX: Final = frozenset(b"0123456789abcdefABCDEF")


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


class WatchLines:
    """Splits a watch stream into its JSON events (one per line); a line over ``limit`` bytes raises
    ``EventTooLarge`` before it is kept whole, a line that is not JSON raises ValueError."""

    def __init__(self, limit: int = MAX_EVENT_BYTES) -> None:
        self.limit = limit
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        self._buffer.extend(chunk)
        events: list[dict[str, Any]] = []
        newline = self._buffer.find(b"\n")
        while newline != -1:
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            if len(line) > self.limit:
                raise EventTooLarge(f"a watch event of {len(line)} bytes (at most {self.limit})")
            if line.strip():
                events.append(_event(line))
            newline = self._buffer.find(b"\n")
        if len(self._buffer) > self.limit:
            raise EventTooLarge(f"a watch event over {self.limit} bytes")
        return events


def _event(line: bytes) -> dict[str, Any]:
    event = json.loads(line)
    if not isinstance(event, dict):
        raise ValueError(f"a watch event that is not an object: {line[:100]!r}")
    return event


def _unavailable(what: str, exc: BaseException) -> Unavailable:
    """The transient error for a failed exchange: what was asked, then the failure's type and text."""
    return Unavailable(f"{what}: {type(exc).__name__}: {str(exc)[:200]}")


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
            raise _unavailable(f"{method} {path}", exc) from exc

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
        except (OSError, _Broken) as exc:  # the API server is unreachable, slow, or not speaking HTTP
            raise _unavailable(f"{method} {path}", exc) from exc

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
            raise _unavailable(f"{method} {path}", exc) from exc
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
            raise _unavailable(f"watch {path}", exc) from exc
        finally:
            # a stream the server ended goes back to the pool; one left early (an ERROR event, a
            # line over the bound, a stop) may hold unread bytes, so its connection is closed
            response.release_conn() if ended else response.close()

    def close(self) -> None:
        self._pool.clear()
        if self._lane is not None:
            self._lane.close()
