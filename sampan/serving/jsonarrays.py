"""The number lists of an all-JSON infer request read by one compiled pass, not as
Python floats: the fast path of `protocol.decode` for ``"data": [n, n, ...]``.

Reading a W5 request (784 float32 values written as ``tolist()`` writes them, 16 KB) costs
orjson ~40 us, most of it making and freeing 784 Python floats, and numpy ~20 us more to
turn them into a float32 array; the rest of the request's JSON is a hundred bytes.
`split(body)` scans the body once (numba): every ``"data"`` key whose value is a flat
list of JSON numbers of at least `MIN_BYTES` bytes has its numbers parsed into a scratch
buffer, and the body comes back with each such list replaced by a placeholder string
(``"\\u0000<k>"``), which orjson reads in a microsecond. `protocol` then takes span
`k`'s values for the input whose ``data`` is placeholder `k`, typed for its datatype.

Values are the ones the slow path gives, or the fast path declines (``None``) and the
request is decoded as before; it never guesses:

- float32: the decimal is computed in float64 with at most four roundings (its
  significand of <= 18 digits times or over exact powers of ten), then rounded to
  float32; a value within 16 float64 ulps of a point halfway between two float32 values
  (where that error could flip the rounding of the correctly rounded float64 the slow
  path casts), a subnormal or overflowing one, or an integer above 2**53 declines;
- float64: only values that one rounding makes exact (significand <= 2**53, power of
  ten <= 22, Clinger's fast path), else declined;
- integers: JSON integers that fit int64 (a fraction or exponent declines, so that the
  slow path gives its 400); the datatype's range is checked by the caller.

A body holding ``\\u0000`` anywhere is left alone (no placeholder can then be mistaken
for a string of the client's), as are lists nested inside lists, lists holding anything
but numbers, numbers JSON does not allow (``01``, ``1.``, ``NaN``) and significands of
more than 18 digits; those lists stay in the JSON for orjson (or `json`) to read.
Without numba (the ``jit`` extra) `split` answers None and every request takes the slow
path.

    >>> # skel, spans = split(body)   # spans.take(k, dtype) -> array | None
"""
from __future__ import annotations

import math
import threading

import numpy as np

from .errors import RequestError

try:
    from numba import njit
except ImportError:         # optional: every request then takes orjson's path
    njit = None

MIN_BYTES = 256             # shorter lists are left to orjson (its call is cheaper)
NOGIL_BYTES = 48 << 10      # text a worker parses with the GIL released (below: held)
MAX_SPANS = 16              # lists replaced per body; later ones stay in the JSON
_SCRATCH_MAX = 1 << 20      # values kept in a thread's scratch between requests

# per-span flags (meta column 4)
F32_OK, F64_OK, INT_OK = 1, 2, 4

_local = threading.local()


if njit is not None:
    _P10 = np.array([10.0 ** k for k in range(23)])     # exact in float64 up to 1e22

    @njit(cache=True, nogil=True)
    def _parse_one(buf, i, n, vals, ints, k0):
        """The flat list of JSON numbers buf[i:n] ('[' ... ']') into vals/ints from
        index k0: (end, count, flags), end -1 when it is not one we take."""
        flags = F32_OK | F64_OK | INT_OK
        j = i + 1
        while j < n and (buf[j] == 32 or buf[j] == 10 or buf[j] == 13 or buf[j] == 9):
            j += 1
        if j < n and buf[j] == 93:          # ']'
            return j + 1, 0, flags
        k = k0
        while True:
            if k >= vals.size or j >= n:
                return -1, 0, 0
            neg = False
            if buf[j] == 45:                 # '-'
                neg = True
                j += 1
                if j >= n:
                    return -1, 0, 0
            c = buf[j]
            m = 0
            nd = 0                           # digits in m (a lone leading 0 not counted)
            if c == 48:                      # '0': no more integer digits
                j += 1
                if j < n and 48 <= buf[j] <= 57:
                    return -1, 0, 0
            elif 49 <= c <= 57:
                while j < n:
                    c = buf[j]
                    if c < 48 or c > 57:
                        break
                    m = m * 10 + (c - 48)
                    nd += 1
                    j += 1
            else:
                return -1, 0, 0
            e10 = 0
            is_int = True
            sig = nd                         # significant digits in m
            if j < n and buf[j] == 46:       # '.'
                is_int = False
                j += 1
                s0 = j
                while j < n:
                    c = buf[j]
                    if c < 48 or c > 57:
                        break
                    m = m * 10 + (c - 48)
                    j += 1
                if j == s0:
                    return -1, 0, 0
                e10 = s0 - j
                sig += j - s0
                if sig > 18 and nd == 0:     # a fraction's leading zeros do not count
                    q = s0
                    while q < j and buf[q] == 48:
                        sig -= 1
                        q += 1
            if sig > 18:                     # m may have wrapped
                return -1, 0, 0
            if j < n and (buf[j] == 101 or buf[j] == 69):      # 'e' 'E'
                is_int = False
                j += 1
                eneg = False
                if j < n and (buf[j] == 43 or buf[j] == 45):
                    eneg = buf[j] == 45
                    j += 1
                if j >= n or not 48 <= buf[j] <= 57:
                    return -1, 0, 0
                ex = 0
                while j < n and 48 <= buf[j] <= 57:
                    if ex < 100000:
                        ex = ex * 10 + (buf[j] - 48)
                    j += 1
                e10 += -ex if eneg else ex
            if is_int:                       # (18 digits always fit)
                ints[k] = -m if neg else m
            else:
                flags &= ~INT_OK
            if m == 0:
                vals[k] = -0.0 if (neg and not is_int) else 0.0
            else:
                if m > 9007199254740992 or e10 > 22 or e10 < -22:
                    flags &= ~F64_OK
                    if is_int:
                        flags &= ~F32_OK
                v = np.float64(m)
                if e10 > 44 or e10 < -44:
                    flags &= ~(F32_OK | F64_OK)
                    v = 0.0
                elif e10 > 22:
                    v = v * _P10[22] * _P10[e10 - 22]
                elif e10 >= 0:
                    v = v * _P10[e10]
                elif e10 >= -22:
                    v = v / _P10[-e10]
                else:
                    v = v / _P10[22] / _P10[-e10 - 22]
                if flags & F32_OK:
                    if v < 1.1754943508222875e-38 or v >= 3.4028234e38:
                        flags &= ~F32_OK
                    else:
                        frac, _ = math.frexp(v)                  # in [0.5, 1)
                        low = np.int64(frac * 9007199254740992.0) & 0x1FFFFFFF
                        if abs(low - 0x10000000) <= 16:          # near a float32 tie
                            flags &= ~F32_OK
                vals[k] = -v if neg else v
            k += 1
            while j < n and (buf[j] == 32 or buf[j] == 10 or buf[j] == 13 or buf[j] == 9):
                j += 1
            if j >= n:
                return -1, 0, 0
            if buf[j] == 44:                 # ','
                j += 1
                while j < n and (buf[j] == 32 or buf[j] == 10 or buf[j] == 13
                                 or buf[j] == 9):
                    j += 1
            elif buf[j] == 93:               # ']'
                return j + 1, k - k0, flags
            else:
                return -1, 0, 0

    @njit(cache=True, nogil=True)
    def _parse(buf, vals, ints):
        """The list that is all of `buf`: (end, count, flags) as `_parse_one`."""
        return _parse_one(buf, 0, buf.size, vals, ints, 0)

    @njit(cache=True, nogil=True)
    def _parse_all(buf, starts, ends, vals, ints, res):
        """The lists buf[starts[s]:ends[s]] one after another into vals/ints, in one
        call (one release of the GIL for a whole batch): res[s] = (first value index or
        -1 when declined, count, flags)."""
        k = 0
        for s in range(starts.size):
            end, cnt, flags = _parse_one(buf, starts[s], ends[s], vals, ints, k)
            if end == ends[s]:
                res[s, 0] = k
                k += cnt
            else:
                res[s, 0] = -1
            res[s, 1] = cnt
            res[s, 2] = flags
        return k

    # the same holding the GIL, for little text: a worker that releases the GIL for a
    # 20 us parse waits for the busy event loop to hand it back (up to the 5 ms switch
    # interval), longer than the loop would have held it
    _parse_all_gil = njit(cache=True)(_parse_all.py_func)


def available() -> bool:
    """Whether the fast path can run (numba is installed)."""
    return njit is not None


def warm() -> None:
    """Compile (or load from numba's cache) the parser now, not on the first request."""
    if available():
        body = b'{"data": [' + b"0.5, " * (MIN_BYTES // 5 + 1) + b'1]}'
        skel, spans = split(body)
        d = spans.deferred(0, "x", None, np.float32, (MIN_BYTES // 5 + 2,))
        resolve_all([{"x": d}])
        buf = np.frombuffer(body[d.start:d.end], np.uint8)
        at = np.zeros(1, np.int64)
        vals, ints = _buffers(buf.size)
        for parse in (_parse_all, _parse_all_gil):      # both, whichever a batch needs
            parse(buf, at, at + buf.size, vals, ints, np.empty((1, 3), np.int64))


def _buffers(n):
    """(float64, int64) scratch of at least `n` values for this thread."""
    vals = getattr(_local, "vals", None)
    if vals is not None and vals.size >= n:
        return vals, _local.ints
    vals, ints = np.empty(max(n, 4096)), np.empty(max(n, 4096), np.int64)
    if n <= _SCRATCH_MAX:
        _local.vals, _local.ints = vals, ints
    return vals, ints


class Deferred:
    """An input whose values are still the JSON text of its list: `shape` and `dtype`
    are checked (the skeleton's), `values()` parses them (in a worker thread, with the
    GIL released) or, where the fast path declines, decodes the whole body the slow
    way (`fallback`, which raises the request's own error)."""
    __slots__ = ("shape", "dtype", "body", "start", "end", "name", "fallback")

    def __init__(self, shape, dtype, body, start, end, name, fallback):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.body, self.start, self.end = body, start, end
        self.name, self.fallback = name, fallback

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return math.prod(self.shape)

    def values(self) -> np.ndarray:
        """The values (parsed, or the slow path's; its `RequestError` raised)."""
        out = resolve_all([{self.name: self}])[0]
        if isinstance(out, Exception):
            raise out
        return out[self.name]


def resolve_all(requests: list) -> list:
    """Each request's inputs dict with its `Deferred` values parsed, all of them in one
    compiled call (the GIL released once: a worker that released and took it back per
    request waited for the busy event loop each time); a request the fast path
    declines is decoded the slow way, and where that refuses it its entry is the
    `RequestError` instead of a dict. Dicts without a `Deferred` come back as they are."""
    ds = [(r, name, d) for r, inputs in enumerate(requests) for name, d in inputs.items()
          if type(d) is Deferred]
    if not ds:
        return list(requests)
    parts, starts, ends, at = [], [], [], 0
    for _, _, d in ds:
        parts.append(memoryview(d.body)[d.start:d.end])
        starts.append(at)
        at += d.end - d.start
        ends.append(at)
    buf = np.frombuffer(b"".join(parts), np.uint8)
    vals, ints = _buffers(at // 2 + 1)
    res = np.empty((len(ds), 3), np.int64)
    parse = _parse_all if at >= NOGIL_BYTES else _parse_all_gil
    total = parse(buf, np.array(starts, np.int64), np.array(ends, np.int64), vals, ints, res)
    touched = {r for r, _, _ in ds}
    out = [dict(inputs) if r in touched else inputs for r, inputs in enumerate(requests)]
    full: dict = {}      # every value of the batch converted once; requests get slices

    def conv(kind):
        a = full.get(kind)
        if a is None:
            a = full[kind] = (vals[:total].astype(np.float32) if kind == F32_OK else
                              vals[:total].copy() if kind == F64_OK else ints[:total].copy())
        return a
    for (r, name, d), (k, cnt, flags) in zip(ds, res.tolist()):
        if isinstance(out[r], Exception):
            continue
        a, dt = None, d.dtype
        if k >= 0 and cnt == d.size:
            if dt == np.float32:
                if flags & F32_OK:
                    a = conv(F32_OK)[k:k + cnt]
            elif dt == np.float64:
                if flags & F64_OK:
                    a = conv(F64_OK)[k:k + cnt]
            elif flags & INT_OK:
                a = conv(INT_OK)[k:k + cnt]
                if dt != np.int64:
                    info = np.iinfo(dt)
                    a = a.astype(dt) if not cnt or (
                        a.min() >= info.min and a.max() <= info.max) else None
        if a is None:
            try:
                a = d.fallback()[name]
            except RequestError as e:
                out[r] = e
                continue
        out[r][name] = a.reshape(d.shape)
    return out


def resolve(inputs: dict) -> dict:
    """`inputs` with every `Deferred` replaced by its values (the same dict when it
    holds none); a request the slow path refuses raises its `RequestError`."""
    if not any(type(v) is Deferred for v in inputs.values()):
        return inputs
    out = resolve_all([inputs])[0]
    if isinstance(out, Exception):
        raise out
    return out


class Spans:
    """The number lists `split` took out of a body, by placeholder index."""
    __slots__ = ("body", "at", "used")

    def __init__(self, body, at):
        self.body, self.at = body, at
        self.used = [False] * len(at)

    def __len__(self):
        return len(self.at)

    def index(self, data):
        """The span index a placeholder string stands for, else None."""
        if isinstance(data, str) and len(data) > 1 and data[0] == "\x00" and \
                data[1:].isdigit():
            k = int(data[1:])
            if k < len(self.at):
                return k
        return None

    def deferred(self, k, name, fallback, dtype, shape):
        """Span `k` as the `Deferred` values of input `name` (None if it was taken
        already, or the datatype is one the fast path does not read)."""
        dtype = np.dtype(dtype)
        if self.used[k] or not (dtype in (np.float32, np.float64) or dtype.kind in "iu"):
            return None
        self.used[k] = True
        s, e = self.at[k]
        return Deferred(shape, dtype, self.body, s, e, name, fallback)

    def all_used(self) -> bool:
        return all(self.used)


_KEY = b'"data"'


def split(body):
    """(skeleton bytes, `Spans`) for an all-JSON `body`, or None when no list was taken
    (or numba is missing): each ``"data"`` followed by ``:`` and a ``[`` whose first
    ``]`` ends at least `MIN_BYTES` later has that ``[...]`` replaced by a placeholder.
    Finding them needs no JSON parse: a ``"data"`` inside a string, or a list holding
    strings or lists, leaves the skeleton invalid JSON or the placeholder where no
    input's data is (the caller then decodes the body the slow way), and a list holding
    anything but numbers is refused by the parser later (the same)."""
    if njit is None or not isinstance(body, bytes) or len(body) < MIN_BYTES:
        return None
    if body.find(b"\\") >= 0 and b"\\u0000" in body:     # (memchr first: `in` is slow)
        return None
    at = []
    i = body.find(_KEY)
    n = len(body)
    while i >= 0 and len(at) < MAX_SPANS:
        j = i + len(_KEY)
        while j < n and body[j] in b" \t\r\n":
            j += 1
        if j < n and body[j] == 58:            # ':'
            j += 1
            while j < n and body[j] in b" \t\r\n":
                j += 1
            if j < n and body[j] == 91:        # '['
                e = body.find(b"]", j)
                if e < 0:
                    break
                if e + 1 - j >= MIN_BYTES:
                    at.append((j, e + 1))
                i = body.find(_KEY, e)
                continue
        i = body.find(_KEY, j)
    if not at:
        return None
    parts, prev = [], 0
    view = memoryview(body)
    for k, (s, e) in enumerate(at):
        parts.append(view[prev:s])
        parts.append(b'"\\u0000%d"' % k)
        prev = e
    parts.append(view[prev:])
    return b"".join(parts), Spans(body, at)
