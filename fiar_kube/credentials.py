"""Credentials: where the API server is and how to prove who we are (``Credentials``), and the pod's
service account (``in_cluster``). The in-cluster token (and a kubeconfig's ``tokenFile``) is re-read
whenever its file changes (the kubelet rotates it), so a rotated token is used on the next request.
The kubernetes package is imported only to load a kubeconfig whose user authenticates in a way
``from_kubeconfig`` does not read (``exec`` plugins, auth providers): its client costs 17.7 MiB of
resident memory on import."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from ipaddress import ip_address
from typing import Any, Final

SERVICE_ACCOUNT: Final = "/var/run/secrets/kubernetes.io/serviceaccount"


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
        self.ca_cert_data: str | None = None
        """A CA as PEM text held in memory (a kubeconfig's ``certificate-authority-data``)."""
        self.cert_file: str | None = None
        self.key_file: str | None = None
        self.cert_data: bytes | None = None
        self.key_data: bytes | None = None
        """A client certificate and key held in memory (``client-certificate-data``, ``client-key-data``):
        loaded into each TLS context from memory, never written to a lasting file (``tls_context``)."""
        self.impersonate: tuple[tuple[str, str], ...] = ()
        """Impersonate-* header fields sent with every request (a kubeconfig user's ``as``, ``as-uid``,
        ``as-groups``, ``as-user-extra``), as client-go sends them."""
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


class NotLoaded(Exception):
    """This package's loaders cannot load these credentials (``load_config`` says why, or asks the
    kubernetes package when ``delegate`` is set; ``impersonate`` is then what it hands on itself)."""

    def __init__(self, message: str, delegate: bool = False, impersonate: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.delegate = delegate
        self.impersonate = impersonate


def in_cluster(environ: Mapping[str, str], service_account: str) -> Credentials:
    """The pod's service account: the API server's service address from ``KUBERNETES_SERVICE_HOST``
    and ``_PORT``, its CA and token from ``service_account`` (the token re-read when it changes)."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise NotLoaded("Service host/port is not set.")
    token, ca = os.path.join(service_account, "token"), os.path.join(service_account, "ca.crt")
    if not os.path.isfile(token):
        raise NotLoaded("Service token file does not exist.")
    if not os.path.isfile(ca):
        raise NotLoaded("Service certificate file does not exist.")
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
        raise NotLoaded("Token file exists but empty.")
    cfg.no_proxy = "*"  # in-cluster: the API server's service address, never through a proxy
    return cfg


def authorization(cfg: Any) -> str | None:
    """The Authorization header value (the configuration's refresh hook runs first), or None."""
    token = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    return str(token) if token else None


def impersonation(cfg: Any) -> tuple[tuple[str, str], ...]:
    """The Impersonate-* header fields of a configuration (none for one that impersonates nobody)."""
    return tuple(getattr(cfg, "impersonate", ()) or ())
