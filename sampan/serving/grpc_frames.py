"""The pieces of gRPC over HTTP/2 that hold no connection state, for the native front end
(`grpc_native.py`): frame types, flags and error codes (RFC 9113), the gRPC status
numbers, frames, the ``grpc-timeout`` reader and ``grpc-message``'s percent-encoding, and
the constant header blocks of an answer (HPACK literals, `grpc_hpack.py`).

    >>> frame(PING, ACK, 0, b"12345678")[:9].hex()
    '000008060100000000'
"""
from __future__ import annotations

import struct
import zlib

from .errors import RequestError
from .grpc_hpack import integer, literal

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, \
    WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 5, 6, 7, 8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 9, 11

MAX_WINDOW = (1 << 31) - 1
MAX_FRAME = 1 << 20               # the largest frame the server accepts (SETTINGS)
MAX_STREAMS = 1024                # concurrent calls a connection may hold open
MAX_HEADER_BLOCK = 64 << 10       # a header block, CONTINUATIONs included
REFILL = 1 << 20                  # connection window topped up each time this much arrived

# gRPC status numbers (grpc/status.h), by the names errors.GRPC_CODES uses
STATUS = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3,
          "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5, "ALREADY_EXISTS": 6,
          "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9,
          "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12, "INTERNAL": 13,
          "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16}
_TIMEOUT_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3,
                  ord("u"): 1e-6, ord("n"): 1e-9}

_FRAME = struct.Struct(">HBBBI")      # 24-bit length as 16 + 8 bits, type, flags, stream
# ":status: 200" (static index 8), "content-type: application/grpc" (a literal not indexed,
# the name static index 31)
RESPONSE_HEADERS = b"\x88" + integer(31, 4) + integer(16, 7) + b"application/grpc"
OK_TRAILERS = literal(b"grpc-status", b"0")
MESSAGE_MAX = 4096                   # grpc-message bytes kept (a header block must fit)


def frame(ftype, flags, sid, payload=b"") -> bytes:
    """One HTTP/2 frame: the 9-byte header and `payload`."""
    n = len(payload)
    return _FRAME.pack(n >> 8, n & 0xFF, ftype, flags, sid) + payload


def grpc_timeout(value: bytes):
    """Seconds of a ``grpc-timeout`` value (``"100m"``, ``"5S"``), None when malformed."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1])
    return None if unit is None else int(value[:-1]) * unit


def percent_encode(msg: str) -> bytes:
    """``grpc-message``'s encoding: UTF-8, bytes outside printable ASCII and ``%`` as %XX;
    cut to `MESSAGE_MAX` bytes (whole escapes), under grpc's 8 KiB metadata limit."""
    b = msg.encode("utf-8", "replace")
    if not all(0x20 <= c <= 0x7E and c != 0x25 for c in b):
        b = b"".join(bytes((c,)) if 0x20 <= c <= 0x7E and c != 0x25 else b"%%%02X" % c
                     for c in b)
    if len(b) > MESSAGE_MAX:
        cut = MESSAGE_MAX
        k = b.rfind(b"%", cut - 2, cut)
        b = b[:k if k >= 0 else cut]
    return b


def error_block(code: int, msg: str, meta=()) -> bytes:
    """The header block of a trailers-only answer: status 200, grpc-status and -message."""
    out = [RESPONSE_HEADERS, literal(b"grpc-status", str(code).encode()),
           literal(b"grpc-message", percent_encode(msg))]
    out += [literal(k.encode("ascii"), v.encode("ascii", "replace")) for k, v in meta]
    return b"".join(out)


class CallError(RequestError):
    """A `RequestError` that names its gRPC status itself (`grpc_code`): the statuses
    with no HTTP twin in `errors.GRPC_CODES` (RESOURCE_EXHAUSTED, UNIMPLEMENTED)."""

    def __init__(self, msg, grpc_code, status=400):
        super().__init__(msg, status)
        self._grpc_code = grpc_code

    @property
    def grpc_code(self) -> str:
        return self._grpc_code


def inflate(encoding, msg: bytes, limit: int) -> bytes:
    """A compressed request message (``grpc-encoding`` gzip or deflate) decompressed, at
    most `limit` bytes of it (a message that inflates past it is RESOURCE_EXHAUSTED)."""
    wbits = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}.get(encoding)
    if wbits is None:
        raise CallError(f"gRPC: a compressed request message with grpc-encoding "
                        f"{encoding!r}; the server reads gzip and deflate", "UNIMPLEMENTED")
    try:
        out = zlib.decompressobj(wbits).decompress(msg, limit + 1)
    except zlib.error as e:
        raise CallError(f"gRPC: the {encoding.decode()} request message does not "
                        f"decompress: {e}", "INTERNAL", 500) from None
    if len(out) > limit:
        raise CallError(f"gRPC: the request message decompresses to more than the "
                        f"server's limit of {limit} bytes", "RESOURCE_EXHAUSTED")
    return out
