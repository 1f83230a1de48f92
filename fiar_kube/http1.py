"""HTTP/1.1 answers read from a socket (RFC 9112): the status line and header fields, and a body framed
by Content-Length, chunked encoding, or the end of the connection."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from .deadline import within
from .errors import Unsendable

MAX_HEAD_BYTES: Final = 64 * 1024
"""Bytes of an answer's status line and headers at most (the API server sends about 300)."""


_TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""A field name (RFC 9110, 5.1: a token)."""
_FORBIDDEN_IN_VALUE: Final = re.compile(rb"[\x00\r\n]")
_TARGET: Final = re.compile(r"[\x21-\x7e]+")
"""A request target: visible ASCII only (no space, no control character, nothing past 0x7e)."""

Headers = Mapping[str, str] | Iterable[tuple[str, str]]
"""Request header fields: a mapping, or pairs (a name may repeat, as Impersonate-Group does)."""


def pairs(headers: Headers) -> list[tuple[str, str]]:
    return list(headers.items() if isinstance(headers, Mapping) else headers)


def check_request(method: str, target: str, headers: Headers) -> list[tuple[str, str]]:
    """The header fields of a request that can be written as HTTP/1.1, else ``Unsendable``: the one
    check both transports make before a byte is sent."""
    fields = pairs(headers)
    if not _TARGET.fullmatch(target):
        raise Unsendable(f"{method} {target[:100]!r}: a request target must be visible ASCII (percent-encode it)")
    for name, value in fields:
        if not name.isascii() or not _TOKEN.fullmatch(name.encode("ascii")):
            raise Unsendable(f"{method} {target[:100]}: a header name that is not a token: {name[:40]!r}")
        if "\r" in value or "\n" in value or "\x00" in value or (not value.isascii() and max(value) > "\xff"):
            raise Unsendable(f"{method} {target[:100]}: header {name} has a line break, NUL or non-Latin-1 value")
    return fields


def request_head(method: str, target: str, authority: str, fields: list[tuple[str, str]], length: int | None) -> bytes:
    """The request line and header fields of a checked request (``check_request``)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {authority}", *(f"{k}: {v}" for k, v in fields)]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Broken(Exception):
    """The server's answer was not HTTP/1.x as this module reads it, or ended early."""


class Closed(Broken):
    """The connection ended before any byte of an answer (a kept connection the server closed)."""


class Reader:
    """An answer's bytes from one connection, read as they are asked for."""

    def __init__(self, sock: Any, read_s: float | None, deadline: float | None) -> None:
        self.sock, self.read_s, self.deadline = sock, read_s, deadline
        self.buffer = bytearray()
        self.scratch = bytearray(_RECEIVE)
        self.view = memoryview(self.scratch)
        self.received = 0

    def fill(self) -> bool:
        """Read what has come; False at the end of the connection."""
        self.sock.settimeout(within(self.read_s, self.deadline))
        count = self.sock.recv_into(self.scratch)
        if not count:
            return False
        self.received += count
        self.buffer += self.view[:count]
        return True

    def until(self, mark: bytes, bound: int) -> bytes:
        """The bytes before ``mark``, consumed with it; ``Broken`` past ``bound`` bytes."""
        start = 0
        while True:
            found = self.buffer.find(mark, start)
            if found >= 0:
                line = bytes(self.buffer[:found])
                del self.buffer[: found + len(mark)]
                return line
            if len(self.buffer) > bound:
                raise Broken(f"a line of the answer over {bound} bytes")
            start = max(0, len(self.buffer) - len(mark) + 1)
            if not self.fill():
                raise (Closed if self.received == 0 else Broken)("the connection ended before the answer")

    def pieces(self, count: int, to_end: bool) -> Iterator[bytes]:
        """The next ``count`` bytes, in pieces of at most ``_PIECE`` handed out once read whole (a watch
        event is one chunk: one piece); with ``to_end``, fewer when the connection ends first (else
        ``Broken``)."""
        while count > 0:
            want = min(count, _PIECE)
            while len(self.buffer) < want:
                if not self.fill():
                    if not to_end:
                        raise Broken("the connection ended inside the answer's body")
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
UNBOUNDED: Final = 1 << 62


def read_head(reader: Reader) -> tuple[int, str, dict[str, str], bool]:
    """(status, reason, fields, whether the connection may be kept) of the first answer that is not
    interim (1xx), read strictly as RFC 9112 asks: a field name is a token followed at once by its
    colon (whitespace before it, or a folded line, is refused), a value holds no NUL or bare CR/LF. An
    answer framed by both Transfer-Encoding and Content-Length is read by its Transfer-Encoding and
    its connection closed after it (6.3: such a message may be an attempt at response smuggling)."""
    while True:
        lines = reader.until(b"\r\n\r\n", MAX_HEAD_BYTES).split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code, _, reason = rest.partition(b" ")
        if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
            raise Broken(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        fields: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not _TOKEN.fullmatch(name):
                raise Broken(f"not a header field: {line[:80]!r}")
            if _FORBIDDEN_IN_VALUE.search(value):
                raise Broken(f"a header value with NUL, CR or LF: {line[:80]!r}")
            key, text = name.lower().decode("ascii"), value.strip(b" \t").decode("latin-1")
            fields[key] = f"{fields[key]}, {text}" if key in fields else text
        status = int(code)
        if not 100 <= status <= 199:
            keep = version == b"HTTP/1.1" and "close" not in fields.get("connection", "").lower()
            if "transfer-encoding" in fields and ("content-length" in fields or version != b"HTTP/1.1"):
                keep = False
            return status, reason.decode("latin-1"), fields, keep


def _length(fields: Mapping[str, str]) -> int | None:
    length = fields.get("content-length")
    if length is None:
        return None
    if not (length.isascii() and length.isdigit()):
        raise Broken(f"a Content-Length that is not a number: {length[:40]!r}")
    return int(length)


def read_body(reader: Reader, method: str, status: int, fields: Mapping[str, str], bound: int) -> tuple[bytes, bool]:
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
        for piece in chunks(reader):
            parts.append(piece[: bound - total])
            total += len(parts[-1])
            if total >= bound:
                return b"".join(parts), False
        return b"".join(parts), True
    length = _length(fields)
    if length is None:
        return b"".join(reader.pieces(bound, True)), False
    return b"".join(reader.pieces(min(length, bound), False)), length <= bound


def chunks(reader: Reader) -> Iterator[bytes]:
    """The data of a chunked body as it arrives, up to its last chunk and trailers."""
    while True:
        size_text = reader.until(b"\r\n", 1024).split(b";", 1)[0].strip()
        if not size_text or any(c not in _HEX for c in size_text):
            raise Broken(f"not a chunk size: {size_text[:40]!r}")
        size = int(size_text, 16)
        if size == 0:
            while reader.until(b"\r\n", MAX_HEAD_BYTES):  # trailers, up to the empty line
                pass
            return
        yield from reader.pieces(size, False)
        if reader.until(b"\r\n", 2) != b"":
            raise Broken("a chunk not followed by CRLF")


_HEX: Final = frozenset(b"0123456789abcdefABCDEF")
