"""A kubeconfig read as client-go reads it, and ``load_config``: a kubeconfig, else in-cluster, else
optionally the default kubeconfig.

client-go decodes a kubeconfig into typed fields: a flag is a YAML boolean or a decode error (a quoted
``'false'`` never turns verification off); a CA together with ``insecure-skip-tls-verify`` is refused;
``tokenFile`` is read on each request and ``token`` used only while the file cannot be read; ``as`` with
its ``as-uid``, ``as-groups`` and ``as-user-extra`` become Impersonate-* header fields. The document is
parsed by libyaml where PyYAML has it, bounded in bytes and in YAML events before anything is built."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

from . import pem
from .credentials import SERVICE_ACCOUNT, Credentials, NotLoaded, TokenFile, in_cluster
from .errors import ConfigError

KUBECONFIG_MAX: Final = 4 * 1024 * 1024
"""Bytes of a kubeconfig file read at most."""
KUBECONFIG_EVENTS: Final = 50_000
"""YAML events (scalars, collections, aliases) of a kubeconfig at most: about 4,000 contexts with their
clusters and users, counted by libyaml in well under a second before a Python object is built (the
review's 4 MiB of small mappings cost 44 s and 500 MiB to build even through libyaml)."""
_IMPERSONATE_KEYS: Final = ("as", "as-uid", "as-groups", "as-user-extra")


def _yaml(text: bytes) -> Any:
    """The document, by libyaml (``CSafeLoader``) where PyYAML was built with it, after counting its
    events: past ``KUBECONFIG_EVENTS`` it is refused before any object is made."""
    import yaml

    loader_type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    counter, count = loader_type(text), 0
    try:
        while counter.check_event():
            counter.get_event()
            count += 1
            if count > KUBECONFIG_EVENTS:
                raise NotLoaded(f"the kubeconfig has over {KUBECONFIG_EVENTS} YAML events")
    finally:
        counter.dispose()
    return yaml.load(text, Loader=loader_type)


def _named(doc: Mapping[str, Any], section: str, name: Any) -> Mapping[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            inner = entry.get(section[:-1])
            return inner if isinstance(inner, Mapping) else {}
    raise NotLoaded(f"{section[:-1]} {name!r} is not in the kubeconfig")


def _flag(section: Mapping[str, Any], key: str) -> bool:
    """A boolean field as client-go decodes it into a Go bool: absent is false, a string is an error."""
    value = section.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise NotLoaded(f"{key} is {str(value)[:40]!r}, not a YAML boolean (true or false): client-go refuses it too")
    return value


def _file(value: Any, folder: str) -> str:
    path = os.path.expanduser(str(value))
    return path if os.path.isabs(path) else os.path.join(folder, path)


def _data(section: Mapping[str, Any], key: str) -> bytes:
    try:
        return pem.decode(section[key], key)
    except ValueError as exc:
        raise NotLoaded(str(exc)) from exc


def _impersonation(user: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The Impersonate-* fields of a user, as client-go's transport writes them (one field per group
    and per extra value; an extra's key percent-encoded where a header name may not hold it)."""
    name = user.get("as")
    if not name:
        given = [k for k in _IMPERSONATE_KEYS[1:] if user.get(k)]
        if given:
            raise NotLoaded(f"{given[0]} without as: impersonating groups, a UID or extras needs a user to impersonate")
        return ()
    groups, extra = user.get("as-groups") or [], user.get("as-user-extra") or {}
    if not isinstance(groups, list) or not isinstance(extra, Mapping):
        raise NotLoaded("as-groups must be a list and as-user-extra a mapping of lists")
    fields = [("Impersonate-User", str(name))]
    if user.get("as-uid"):
        fields.append(("Impersonate-Uid", str(user["as-uid"])))
    fields += [("Impersonate-Group", str(group)) for group in groups]
    for key, values in extra.items():
        for value in values if isinstance(values, list) else [values]:
            fields.append((f"Impersonate-Extra-{quote(str(key), safe=_HEADER_SAFE)}", str(value)))
    return tuple(fields)


_HEADER_SAFE: Final = "!#$&'*+-.^_`|~"
"""Characters of a header name besides letters and digits that client-go leaves unescaped (not ``%``)."""


def from_kubeconfig(path: str, context: str | None = None) -> Credentials:
    """The current context (or ``context``) of the kubeconfig ``path``: its cluster's server, CA (file or data), TLS
    server name, insecure flag and proxy URL; its user's client certificate and key (files or data, the
    data kept in memory), token file and token, and whom it impersonates. Paths are relative to the
    kubeconfig's folder, as kubectl reads them. Users of other kinds (``exec``, ``auth-provider``, basic
    auth) raise ``NotLoaded`` with ``delegate`` set, once the cluster's settings were checked."""
    with open(path, "rb") as f:
        text = f.read(KUBECONFIG_MAX + 1)
    if len(text) > KUBECONFIG_MAX:
        raise NotLoaded(f"the kubeconfig is over {KUBECONFIG_MAX} bytes")
    doc = _yaml(text)
    if not isinstance(doc, Mapping):
        raise NotLoaded("the kubeconfig is not a YAML mapping")
    current = context or doc.get("current-context")
    if not current:
        raise NotLoaded("the kubeconfig names no current-context")
    chosen = _named(doc, "contexts", current)
    cluster = _named(doc, "clusters", chosen.get("cluster"))
    user: Mapping[str, Any] = {}
    if chosen.get("user"):
        user = _named(doc, "users", chosen.get("user"))
    server = cluster.get("server")
    if not server:
        raise NotLoaded(f"cluster {chosen.get('cluster')!r} has no server")
    insecure = _flag(cluster, "insecure-skip-tls-verify")
    if insecure and (cluster.get("certificate-authority") or cluster.get("certificate-authority-data")):
        raise NotLoaded(
            "a certificate authority together with insecure-skip-tls-verify: client-go refuses it too "
            "(specifying a root certificates file with the insecure flag is not allowed)"
        )
    impersonate = _impersonation(user)
    if any(user.get(k) for k in ("exec", "auth-provider", "username", "password")):
        raise NotLoaded("the kubeconfig's user authenticates another way", delegate=True, impersonate=impersonate)
    folder = os.path.dirname(os.path.abspath(path))
    cfg = Credentials(str(server).rstrip("/"))
    cfg.verify_ssl = not insecure
    cfg.impersonate = impersonate
    if cluster.get("certificate-authority-data"):
        cfg.ca_cert_data = _data(cluster, "certificate-authority-data").decode("ascii", errors="replace")
    elif cluster.get("certificate-authority"):
        cfg.ssl_ca_cert = _file(cluster["certificate-authority"], folder)
    if cluster.get("tls-server-name"):
        cfg.tls_server_name = str(cluster["tls-server-name"])
    if cluster.get("proxy-url"):
        cfg.proxy = str(cluster["proxy-url"])
    if user.get("client-certificate-data"):
        cfg.cert_data = _data(user, "client-certificate-data")
    elif user.get("client-certificate"):
        cfg.cert_file = _file(user["client-certificate"], folder)
    if user.get("client-key-data"):
        cfg.key_data = _data(user, "client-key-data")
    elif user.get("client-key"):
        cfg.key_file = _file(user["client-key"], folder)
    if user.get("token"):
        cfg.api_key["BearerToken"] = f"Bearer {user['token']}"
    if user.get("tokenFile"):  # read on each request; the token only while the file cannot be read
        cfg.refresh_api_key_hook = TokenFile(_file(user["tokenFile"], folder))
        cfg.refresh_api_key_hook(cfg)
        if not cfg.api_key.get("BearerToken"):
            raise NotLoaded(f"tokenFile {cfg.refresh_api_key_hook.path} cannot be read, or is empty")
    return cfg


def _kubeconfig(path: str | None, context: str | None = None) -> Any:
    """``path`` (None: ``$KUBECONFIG``, else ``~/.kube/config``; several files joined by ``os.pathsep``)
    at its current context or ``context``, by ``from_kubeconfig``, else by the kubernetes package's
    loader (a user of another kind, or several files to merge)."""
    chosen = path or os.environ.get("KUBECONFIG") or "~/.kube/config"
    impersonate: tuple[tuple[str, str], ...] = ()
    if os.pathsep not in chosen:
        try:
            return from_kubeconfig(os.path.expanduser(chosen), context)
        except NotLoaded as exc:
            if not exc.delegate:
                raise
            impersonate = exc.impersonate
    from kubernetes import client, config

    cfg = client.Configuration()
    cfg.no_proxy = None  # read from the process's environment by the client; ``proxy_for`` decides
    config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
    cfg.impersonate = impersonate  # the kubernetes package does not impersonate: the client sends them
    return cfg


def load_config(
    kubeconfig: str | None,
    *,
    context: str | None = None,
    default_kubeconfig: bool = False,
    environ: Mapping[str, str] | None = None,
    service_account: str = SERVICE_ACCOUNT,
) -> Any:
    """Credentials (``Credentials``, or a kubernetes ``Configuration`` for a kubeconfig user this package
    does not load): from ``kubeconfig`` when given, else the in-cluster service account
    (``KUBERNETES_SERVICE_HOST``/``_PORT`` and ``service_account``'s token and CA), else, with
    ``default_kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``. ``ConfigError`` when none loads.
    ``environ`` (default: the process's) is where those variables are read; ``context`` picks a context
    of the kubeconfig other than its current one."""
    try:
        if kubeconfig:
            return _kubeconfig(kubeconfig, context)
        try:
            return in_cluster(os.environ if environ is None else environ, service_account)
        except NotLoaded:
            if not default_kubeconfig:
                raise
            default = None if environ is None else environ.get("KUBECONFIG", "~/.kube/config")
            return _kubeconfig(default, context)
    except Exception as exc:  # NotLoaded, OSError, yaml errors, the kubernetes loader's errors
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster service account"
        if not kubeconfig and default_kubeconfig:
            where += " or ~/.kube/config"
        raise ConfigError(f"cannot load {where}: {exc}") from exc
