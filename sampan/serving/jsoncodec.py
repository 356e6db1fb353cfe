"""The JSON of request and response bodies: orjson when it is installed (the ``serve``
extra), else the standard library, with the standard library's results either way.

    loads(data)         a JSON document (bytes/str) -> Python objects, exactly as
                        ``json.loads`` gives them (NaN/Infinity literals included)
    loads_request(model, body)   the same, a bad body raising the protocol's 400
    dumps(obj)          bytes of compact JSON; numpy arrays (and numpy scalars) in `obj`
                        are written as their ``tolist()``; non-finite floats as the
                        standard library writes them (NaN, Infinity, -Infinity)

Where the two libraries differ, the standard library decides: orjson refuses NaN and
Infinity literals and UTF-16/32 bodies, which `json` reads, so a document orjson refuses
is read again by `json` (which gives its own error when it refuses it too); orjson
reads an integer beyond 64 bits as a float, which no datatype of the protocol accepts as
an integer, so a request the protocol refuses is decoded again with `json`
(`decode_checked`) to refuse it with the same message. orjson writes a non-finite
float as ``null``: an output holding ``null`` is written again by `json` (a response
has no nulls of its own). Numbers come
out as the same values: orjson writes a float32 or float16 array's elements in their own
shortest form (``0.1``, not float64's ``0.10000000149011612``), which parses back to the
same float32/float16 values.

    >>> loads(b'{"data": [1, NaN]}')["data"][1] != loads(b'[NaN]')[0]   # NaN != NaN
    True
    >>> dumps({"a": [1.5]})
    b'{"a":[1.5]}'
"""
from __future__ import annotations

import json

import numpy as np

from .errors import RequestError

try:
    import orjson as _orjson
except ImportError:     # optional: the standard library serves alone
    _orjson = None

_backend = _orjson


def backend() -> str:
    """The library in use: ``"orjson"`` or ``"json"``."""
    return "orjson" if _backend is not None else "json"


def set_backend(name: str) -> str:
    """Use ``"orjson"`` (when installed) or ``"json"``; returns the one used before (for
    tests and benchmarks that compare them)."""
    global _backend
    prev = backend()
    if name == "orjson":
        if _orjson is None:
            raise ImportError("serving: orjson is not installed (pip install orjson, or "
                              "the sampan[serve] extra)")
        _backend = _orjson
    elif name == "json":
        _backend = None
    else:
        raise ValueError(f"serving: JSON backend must be 'orjson' or 'json'; got {name!r}")
    return prev


def loads(data, std=False):
    """`data` parsed as ``json.loads(data)`` parses it (module doc; `std`: with the
    standard library only)."""
    if _backend is not None and not std:
        try:
            return _backend.loads(data)
        except ValueError:
            pass            # NaN, Infinity, huge ints, UTF-16 ...: json decides
    if isinstance(data, memoryview):
        data = bytes(data)
    return json.loads(data)


def loads_request(model, body, std=False):
    """`body` parsed; a body that is not JSON raises `RequestError` 400 naming `model`."""
    try:
        return loads(body, std)
    except (ValueError, UnicodeDecodeError) as e:
        msg = f"the request body is not valid JSON: {e}"
    except RecursionError:
        msg = "the request's JSON is nested too deeply"
    raise RequestError(f"model {model.name!r}: {msg}", 400)


def decode_checked(decode, *args):
    """``decode(*args, std=False)``, and when it refuses the request (a `RequestError`
    400) with orjson in use, ``decode(*args, std=True)``: the one case where orjson and
    the standard library read a document to different values is an integer beyond 64
    bits (orjson gives a float), which the protocol refuses either way, and a refused
    request then gets the standard library's message."""
    try:
        return decode(*args, std=False)
    except RequestError as e:
        if _backend is None or e.status != 400:
            raise
    return decode(*args, std=True)


def _plain(o):
    """`json`'s default=: numpy arrays and scalars as Python lists and numbers."""
    if isinstance(o, (np.ndarray, np.generic)):
        return o.tolist()
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _std(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=_plain).encode()


def dumps(obj) -> bytes:
    """`obj` as compact JSON bytes (module doc)."""
    if _backend is not None:
        try:
            out = _backend.dumps(obj, default=_plain, option=_backend.OPT_SERIALIZE_NUMPY)
        except TypeError:       # non-native byte order, an unsupported dtype: json writes it
            return _std(obj)
        if b"null" not in out:
            return out
    return _std(obj)
