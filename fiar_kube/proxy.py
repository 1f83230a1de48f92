"""The route to the API server: the proxy of the kubeconfig or the environment (``HTTPS_PROXY``),
except for hosts that ``NO_PROXY`` names (``bypasses_proxy``). In-cluster the API server is always
reached directly: its service address is only routable inside the cluster, so a proxy set for egress
must never carry the API traffic (``in_cluster`` sets ``no_proxy`` to ``*``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from ipaddress import ip_address, ip_network
from typing import Any
from urllib.parse import urlsplit


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
