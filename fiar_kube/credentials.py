"""Credentials: where the API server is and how to prove who we are (``Credentials``), loaded by
``load_config`` from a kubeconfig, else in-cluster, else optionally the default kubeconfig. The
in-cluster token (and a kubeconfig's ``tokenFile``) is re-read whenever its file changes (the kubelet
rotates it), so a rotated token is used on the next request. The kubernetes package is imported only
to load a kubeconfig whose user authenticates in a way ``from_kubeconfig`` does not read (``exec``
plugins, auth providers): its client costs 17.7 MiB of resident memory on import."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from ipaddress import ip_address
from typing import Any, Final

from .errors import ConfigError

SERVICE_ACCOUNT: Final = "/var/run/secrets/kubernetes.io/serviceaccount"


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
