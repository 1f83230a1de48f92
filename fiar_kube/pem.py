"""Inline PEM data (a kubeconfig's ``-data`` fields) loaded into a TLS context from memory: a CA by
``cadata``; a client certificate and key, which ``ssl`` reads only from a file, through an anonymous
memory file (``memfd_create``) that exists only while it loads, else a private temporary file removed
before the load returns. Nothing written outlives the load, whatever ends the process later."""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import ssl
import tempfile


def decode(data: object, what: str) -> bytes:
    """The bytes of a base64 ``-data`` field (ValueError naming ``what`` when it is not base64)."""
    try:
        return base64.b64decode(str(data), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{what} is not base64: {exc}") from exc


def load_chain(context: ssl.SSLContext, certificate: bytes, key: bytes | None) -> None:
    """``context.load_cert_chain`` of a certificate (and key) held in memory."""
    pem = certificate.rstrip(b"\n") + b"\n" + (key or b"")
    try:
        fd = os.memfd_create("fiar-client-certificate", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # not Linux, or memfd refused: a private file, gone before return
        _load_through_file(context, pem)
        return
    try:
        os.write(fd, pem)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def _load_through_file(context: ssl.SSLContext, pem: bytes) -> None:
    fd, path = tempfile.mkstemp(prefix="fiar-client-certificate-")  # mode 0600
    try:
        os.write(fd, pem)
        os.close(fd)
        fd = -1
        context.load_cert_chain(path)
    finally:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
