"""The urllib3 pool that carries watch streams (and requests where the lane does not)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from .errors import ConfigError
from .proxy import proxy_for


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
