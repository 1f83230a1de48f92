"""The TLS settings of a configuration, made in one place (``tls_context``) for both transports: the
lane wraps each new connection with a context of its own, the urllib3 pool is handed one."""

from __future__ import annotations

import ssl
from typing import Any

from . import pem


def tls_context(cfg: Any) -> ssl.SSLContext:
    """TLS 1.2 or later; the configuration's CA (a file, or PEM data in memory), else the system's;
    its client certificate and key (files, or PEM data loaded from memory); the server's name checked
    against the certificate's subject alternative names (never its CN, as urllib3 2) unless
    verification is off or ``assert_hostname`` is False. Files are read when it is called: a rotated
    client certificate is used by the next context."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.hostname_checks_common_name = False
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
    cert_file, key_file = cfg.cert_file, cfg.key_file
    cert_data, key_data = getattr(cfg, "cert_data", None), getattr(cfg, "key_data", None)
    if cert_file and not key_data:
        context.load_cert_chain(cert_file, key_file or None)
    elif cert_file or cert_data:
        pem.load_chain(context, cert_data or _read(cert_file), key_data or (_read(key_file) if key_file else None))
    return context


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(1024 * 1024)
