"""The protocol's ``BYTES`` datatype (KServe v2 / Triton): a tensor of byte strings, which
a model sees as a numpy object array of `bytes` (the shape of the tensor, one `bytes`
an element), as Triton's python backend hands them over.

How each wire carries it:

- HTTP JSON: ``"data"`` holds strings (flat or nested), each written as its UTF-8 bytes;
  an output is written back as strings (a byte string that is not UTF-8 cannot be, and
  asks for the binary form instead).
- HTTP binary extension and gRPC ``raw_input_contents`` / ``raw_output_contents``: the
  elements in row-major order, each a 4-byte little-endian length and then its bytes
  (``binary_data_size`` counts those prefixes too).
- gRPC typed contents: ``contents.bytes_contents``, one entry an element.

A model's output may also be a numpy ``S`` (bytes) or ``U`` (str) array, or an object
array of `str`: str elements are sent as their UTF-8 bytes.

    >>> a = from_elements([b"ab", "c"], (2,))
    >>> serialize(a)
    b'\\x02\\x00\\x00\\x00ab\\x01\\x00\\x00\\x00c'
    >>> deserialize(serialize(a), (2,)).tolist()
    [b'ab', b'c']
"""
from __future__ import annotations

import math
import struct

import numpy as np

OBJECT = np.dtype(object)
_LEN = struct.Struct("<I")


class BytesError(ValueError):
    """A BYTES tensor's bytes or elements are malformed (the caller names the tensor)."""


def is_bytes_dtype(dtype) -> bool:
    """Whether arrays of `dtype` travel as BYTES (object, ``S`` and ``U`` dtypes)."""
    return np.dtype(dtype).kind in "OSU"


def _element(v):
    if isinstance(v, bytes):
        return v
    if isinstance(v, (bytearray, memoryview, np.bytes_)):
        return bytes(v)
    if isinstance(v, str):
        return v.encode("utf-8")
    raise BytesError(f"a BYTES element must be bytes or str; got {type(v).__name__}")


def from_elements(values, shape) -> np.ndarray:
    """An object array of `bytes` of `shape` from a flat sequence of bytes/str."""
    n = math.prod(shape)
    vals = list(values)
    if len(vals) != n:
        raise BytesError(f"shape {list(shape)} needs {n} elements; got {len(vals)}")
    out = np.empty(n, OBJECT)
    out[:] = [_element(v) for v in vals]
    return out.reshape(shape)


def as_bytes_array(a) -> np.ndarray:
    """`a` (an object array of bytes/str, or an ``S``/``U`` array) as an object array of
    `bytes` of the same shape."""
    a = np.asarray(a)
    if a.dtype.kind not in "OSU":
        raise BytesError(f"a BYTES tensor must be an array of bytes or str; got dtype "
                         f"{a.dtype}")
    if a.dtype == OBJECT and all(type(v) is bytes for v in a.ravel().tolist()):
        return a
    return from_elements(a.ravel().tolist(), a.shape)


def serialize(a) -> bytes:
    """The binary form: each element's 4-byte little-endian length, then its bytes."""
    parts = []
    for v in np.asarray(a, OBJECT).ravel().tolist():
        v = _element(v)
        parts.append(_LEN.pack(len(v)))
        parts.append(v)
    return b"".join(parts)


def deserialize(buf, shape) -> np.ndarray:
    """The object array of `shape` that `buf` (the binary form) holds: exactly as many
    length-prefixed elements as the shape has, and nothing after them."""
    mv = memoryview(buf).cast("B")
    n, at, end = math.prod(shape), 0, len(mv)
    out = np.empty(n, OBJECT)
    for i in range(n):
        if at + 4 > end:
            raise BytesError(f"shape {list(shape)} needs {n} elements; the bytes end after "
                             f"{i} (each element: a 4-byte little-endian length, then its "
                             "bytes)")
        k = _LEN.unpack_from(mv, at)[0]
        at += 4
        if at + k > end:
            raise BytesError(f"element {i} says it has {k} bytes; only {end - at} are left")
        out[i] = bytes(mv[at:at + k])
        at += k
    if at != end:
        raise BytesError(f"{end - at} bytes follow the {n} elements of shape {list(shape)}")
    return out.reshape(shape)


def _flat(data, out, depth=0):
    for v in data:
        if isinstance(v, list):
            if depth > 64:
                raise BytesError("'data' is nested too deeply")
            _flat(v, out, depth + 1)
        else:
            out.append(v)


def from_json(data, shape) -> np.ndarray:
    """JSON ``data`` (strings, flat or nested lists) as an object array of `shape`."""
    if not isinstance(data, list):
        raise BytesError(f"'data' must be a list of strings; got {type(data).__name__}")
    flat: list = []
    _flat(data, flat)
    bad = next((v for v in flat if not isinstance(v, str)), None)
    if bad is not None:
        raise BytesError(f"datatype BYTES takes strings in 'data'; got "
                         f"{type(bad).__name__} {bad!r:.40}")
    return from_elements(flat, shape)


def to_strings(a) -> np.ndarray:
    """An object array of `str` (the UTF-8 text of each element) of `a`'s shape, for JSON
    (its ``tolist()`` is the nested form, ``ravel().tolist()`` the flat one)."""
    b = as_bytes_array(a)
    out = np.empty(b.size, OBJECT)
    for i, v in enumerate(b.ravel().tolist()):
        try:
            out[i] = v.decode("utf-8")
        except UnicodeDecodeError:
            raise BytesError(f"element {i} ({v[:20]!r}) is not UTF-8 text, so JSON cannot "
                             "carry it; ask for the output as binary data") from None
    return out.reshape(b.shape)
