"""The TLS settings of a configuration, made in one place for both transports (the lane and the
urllib3 pool)."""

from __future__ import annotations

import ssl
from typing import Any


def tls_context(cfg: Any) -> ssl.SSLContext:
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
