"""numba kernels of the feature transforms (``sampan.rec.features``) and the checks that
guard them.

The kernels index without bounds checks, so every one of them is reached only through a
``check_*`` function here that verifies what it assumes (offsets int64, starting at 0,
non-decreasing and within the values; string spans inside their bytes) and raises a
sampan error naming the feature.

The hash (``sampan-hash64``, version 1), identical on every process and platform
(integer arithmetic modulo 2^64, little-endian byte order fixed by the definition)::

    mix(z)     = splitmix64's finaliser: z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
                 z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31
    key(seed)  = mix(seed + 0x9E3779B97F4A7C15)
    content(x) = uint64(x) for an int x; for bytes b: h = 0x9E3779B97F4A7C15, then for
                 each 8-byte word w of b (little-endian, the last one zero-padded)
                 h = mix(h ^ w), and content = mix(h ^ len(b)); a string's bytes are its
                 UTF-8 encoding
    hash(v)    = mix(content(v) ^ key(seed))     (a bijection of an int v for one seed)
    cross      : h = key(seed); for each field's value v, in field order:
                 h = mix(h ^ content(v))
    bucket     : h mod buckets (h unsigned); with no bucket count the 64-bit h as int64

A field's contents are computed once per batch and shared by every feature reading it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sampan.errors import DTypeError, SampanValueError
from sampan.rec.hashtable import _mix  # splitmix64's finaliser, the table's id mix too

GOLDEN = 0x9E3779B97F4A7C15


def seed_key(seed: int) -> np.uint64:
    """``key(seed)`` of the module docstring, for a seed in [0, 2^64)."""
    z = np.array([(int(seed) + GOLDEN) % (1 << 64)], np.uint64)
    with np.errstate(over="ignore"):
        return _mix_np(z)[0]


def _mix_np(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = z ^ (z >> np.uint64(30))
        z = z * np.uint64(0xBF58476D1CE4E5B9)
        z = z ^ (z >> np.uint64(27))
        z = z * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True, inline="always")
def _bucket(h, buckets, out, j):
    if buckets > 0:
        if buckets & (buckets - 1) == 0:  # a power of two: the same remainder, no divide
            out[j] = np.int64(h & np.uint64(buckets - 1))
        else:
            out[j] = np.int64(h % np.uint64(buckets))
    else:
        out[j] = np.int64(h)


@njit(cache=True, nogil=True)
def hash_ints(values, key, buckets, out):
    """``out[j]`` = bucket of ``mix(values[j] ^ key)``: the hash of contents ``values``."""
    if buckets > 0 and buckets & (buckets - 1) == 0:  # one loop a case: it vectorises
        mask = np.uint64(buckets - 1)
        for j in range(values.size):
            out[j] = np.int64(_mix(np.uint64(values[j]) ^ key) & mask)
    elif buckets > 0:
        b = np.uint64(buckets)
        for j in range(values.size):
            out[j] = np.int64(_mix(np.uint64(values[j]) ^ key) % b)
    else:
        for j in range(values.size):
            out[j] = np.int64(_mix(np.uint64(values[j]) ^ key))


@njit(cache=True, nogil=True, inline="always")
def _word(words, p, n):
    """The ``n`` (1..8) bytes at byte ``p`` as a little-endian word, from the bytes viewed
    as little-endian uint64 ``words`` (padded by a word): two loads, not eight."""
    q, r = p >> 3, p & 7
    w = words[q] >> np.uint64(8 * r)
    if r:
        w |= words[q + 1] << np.uint64(64 - 8 * r)
    if n < 8:
        w &= (np.uint64(1) << np.uint64(8 * n)) - np.uint64(1)
    return w


@njit(cache=True, nogil=True)
def content_strings(words, starts, ends, out):
    """``out[j]`` = content of the bytes ``starts[j]:ends[j]`` of ``words`` (see
    ``padded_words``), as int64."""
    for j in range(starts.size):
        s, e = starts[j], ends[j]
        h = np.uint64(GOLDEN)
        p = s
        while p < e:
            h = _mix(h ^ _word(words, p, min(e - p, 8)))
            p += 8
        out[j] = np.int64(_mix(h ^ np.uint64(e - s)))


def padded_words(data: np.ndarray) -> np.ndarray:
    """The bytes as little-endian uint64 words, zero-padded by at least one word."""
    buf = np.zeros((data.size + 15) // 8 * 8, np.uint8)
    buf[:data.size] = data
    return buf.view("<u8")


@njit(cache=True, nogil=True)
def bucketize(values, bounds, out):
    """``out[j]`` = how many ``bounds`` are <= ``values[j]``; NaN ->
    ``len(bounds) + 1``."""
    n = bounds.size
    for j in range(values.size):
        v = values[j]
        if v != v:
            out[j] = n + 1
            continue
        if n <= 64:  # a branch-free count beats a mispredicted binary search here
            c = 0
            for k in range(n):
                c += bounds[k] <= v
            out[j] = c
            continue
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) >> 1
            if bounds[mid] <= v:
                lo = mid + 1
            else:
                hi = mid
        out[j] = lo


@njit(cache=True, nogil=True)
def cross_count(offs, out_offs):
    """Row ``i`` of the cross has the product of its fields' lengths entries."""
    k, n = offs.shape[0], offs.shape[1] - 1
    out_offs[0] = 0
    for i in range(n):
        c = 1
        for f in range(k):
            c *= offs[f, i + 1] - offs[f, i]
        out_offs[i + 1] = out_offs[i] + c


@njit(cache=True, nogil=True)
def cross_fill(offs, values, key, buckets, out_offs, out):
    """The cartesian product of each row's fields, the first field outermost; ``values``
    holds every field's 64-bit hashes (as int64), field f's row i at
    ``values[offs[f, i]:offs[f, i + 1]]`` (offsets absolute into the concatenation)."""
    k, n = offs.shape[0], offs.shape[1] - 1
    pos = np.zeros(k, np.int64)
    for i in range(n):
        if out_offs[i + 1] == out_offs[i]:
            continue
        for f in range(k):
            pos[f] = offs[f, i]
        for j in range(out_offs[i], out_offs[i + 1]):
            h = key
            for f in range(k):
                h = _mix(h ^ np.uint64(values[pos[f]]))
            _bucket(h, buckets, out, j)
            f = k - 1  # odometer: the last field turns fastest
            while f >= 0:
                pos[f] += 1
                if pos[f] < offs[f, i + 1]:
                    break
                pos[f] = offs[f, i]
                f -= 1


@njit(cache=True, nogil=True)
def cross_rows(contents, key, buckets, out):
    """The cross of fields with one value a row: ``contents`` is (fields, rows)."""
    for i in range(contents.shape[1]):
        h = key
        for f in range(contents.shape[0]):
            h = _mix(h ^ np.uint64(contents[f, i]))
        _bucket(h, buckets, out, i)


@njit(cache=True, nogil=True)
def sequence(offs, values, length, keep_last, out):
    """Row i's first (or last) ``length`` values into ``out[i]``, the rest left as padded."""
    for i in range(offs.size - 1):
        s, e = offs[i], offs[i + 1]
        m = min(e - s, length)
        if keep_last:
            s = e - m
        for j in range(m):
            out[i, j] = values[s + j]


# ------------------------------------------------------------------------ the checks
def _err(cls, feature: str, got: str, expected: str) -> Exception:
    return cls(f"feature {feature!r}: got {got}; expected {expected}")


def check_csr(feature: str, offsets, n_values: int, n_rows: int | None = None) -> np.ndarray:
    """Offsets as contiguous int64, after checking they start at 0, never decrease, end
    within ``n_values`` and (when given) describe ``n_rows`` rows."""
    o = np.asarray(offsets)
    if o.dtype.kind not in "iu" or o.ndim != 1 or o.size < 1:
        raise _err(DTypeError, feature, f"offsets {o.dtype}{list(o.shape)}",
                   "1-D integer offsets of length rows + 1")
    o = np.ascontiguousarray(o, np.int64)
    if n_rows is not None and o.size != n_rows + 1:
        raise _err(SampanValueError, feature, f"{o.size} offsets for {n_rows} rows",
                   f"{n_rows + 1} offsets")
    if o[0] != 0:
        raise _err(SampanValueError, feature, f"offsets starting at {int(o[0])}",
                   "offsets starting at 0")
    d = np.diff(o)
    if d.size and d.min() < 0:
        i = int(np.argmin(d))
        raise _err(SampanValueError, feature, f"offsets decreasing at row {i} "
                   f"({int(o[i])} -> {int(o[i + 1])})", "non-decreasing offsets")
    if o[-1] > n_values:
        raise _err(SampanValueError, feature, f"offsets ending at {int(o[-1])} with "
                   f"{n_values} values", "offsets within the values")
    return o


def check_spans(feature: str, data, starts, ends) -> tuple:
    """String spans ``data[starts[j]:ends[j]]`` checked to lie inside the bytes."""
    data = np.ascontiguousarray(data, np.uint8)
    starts = np.ascontiguousarray(starts, np.int64)
    ends = np.ascontiguousarray(ends, np.int64)
    if starts.shape != ends.shape or starts.ndim != 1:
        raise _err(SampanValueError, feature, f"string starts {list(starts.shape)} and ends "
                   f"{list(ends.shape)}", "1-D spans of one length")
    if starts.size and (starts.min() < 0 or (ends < starts).any() or ends.max() > data.size):
        raise _err(SampanValueError, feature, "string spans outside their bytes",
                   f"0 <= start <= end <= {data.size}")
    return data, starts, ends
