"""numba kernels of the log store (:mod:`sampan.rec.logstore`): record checksums, the
search of a base page chain (``pread`` from the kernel: no memory map, so no file pages
in the process' RSS), applying sorted records to a window of pages, and reading records.

Every kernel checks what it indexes against the arrays it was given (a chain that runs
past its buffer returns a code, a short read returns a code): callers turn codes into
errors. Layout: 512-word pages, word 0 the header (bit 0: overflowed), then ``P = 511 //
R`` records of ``R`` words; word ``N_META`` of a record holds its state in its low byte.
"""

from __future__ import annotations

import os

import numpy as np
from numba import njit, types

from sampan.errors import SampanError
from sampan.rec.hashtable import META_FIELDS, _mix

N_META = len(META_FIELDS)
PAGE_WORDS = 512
TAIL = 64  # overflow-only pages after the last home page: a chain never wraps around
LOAD = 0.75  # most records per base slot before the base is rebuilt larger
MAGIC = 0x53504C4F47303031  # "SPLOG001"
HEAD = 7  # words of a log entry header
LIVE, DEAD = 1, 2  # record states (0: an empty slot)
_WINDOW = 256  # pages a merge reads and writes at once at most (1 MB)
FINE = 256  # ranges of home pages a log entry records the starts of (pages >= 256)
INDEX_LOAD = 0.75  # the log index's most load (21 bytes an entry; 0.5 took 32)
BATCH = 1 << 12  # records a merge or rebuild holds at once (~0.8 MB each copy)


class DiskTierError(SampanError, ValueError):
    """A spill store that is damaged, of another table shape, or misused."""


def _err(msg: str) -> DiskTierError:
    return DiskTierError(msg)


def unique_ids(a: np.ndarray) -> np.ndarray:
    """``np.unique`` of int64 ids by sorting: numpy 2.4's hashed unique took 0.5-1.7 ms
    for 4096 table ids (multiples of a large odd constant) against ~20 us sorted."""
    s = np.sort(np.asarray(a, np.int64).ravel())
    keep = np.empty(s.size, np.bool_)
    keep[:1] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


_pread = types.ExternalFunction(
    "pread", types.int64(types.intc, types.voidptr, types.uint64, types.int64))


@njit(cache=True, nogil=True, inline="always")
def _sum_words(w, i, n):
    h = np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(n)
    for k in range(n):
        h = (h ^ w[i + k]) * np.uint64(0x100000001B3)
        h ^= h >> np.uint64(29)
    return _mix(h)


@njit(cache=True, nogil=True)
def _checksums(recs, out):
    """Checksum of each record's words but the last."""
    R = recs.shape[1]
    for j in range(recs.shape[0]):
        out[j] = _sum_words(recs[j], 0, R - 1)


@njit(cache=True, nogil=True)
def _first_bad(recs):
    """Index of the first record whose last word is not its checksum (-1: none)."""
    R = recs.shape[1]
    for j in range(recs.shape[0]):
        if _sum_words(recs[j], 0, R - 1) != recs[j, R - 1]:
            return j
    return -1


@njit(cache=True, nogil=True)
def _base_find(fd, n_pages, keys, homes, out, found, page):
    """Read-only search of the base for ``keys`` (sorted by ``homes``), one page cached.
    Returns 0, or -1 - j where reading a page for key ``j`` failed."""
    R = out.shape[1]
    P = (PAGE_WORDS - 1) // R
    cached = np.int64(-1)
    for j in range(keys.size):
        p = homes[j]
        found[j] = False
        while True:
            if p != cached:
                if _pread(fd, page.ctypes.data, PAGE_WORDS * 8, p * PAGE_WORDS * 8) \
                        != PAGE_WORDS * 8:
                    return -1 - j
                cached = p
            hit = -1
            for s in range(P):
                o = 1 + s * R
                if (page[o + N_META] & np.uint64(0xFF)) == LIVE and \
                        np.int64(page[o]) == keys[j]:
                    hit = o
                    break
            if hit >= 0:
                for k in range(R):
                    out[j, k] = page[hit + k]
                found[j] = True
                break
            if (page[0] & np.uint64(1)) == 0 or p + 1 >= n_pages:
                break
            p += 1
    return 0


@njit(cache=True, nogil=True)
def _apply(buf, first, recs, homes, j0, limit, dirty, counts):
    """Apply records ``j0 ..`` (sorted by home; those with home < ``limit``) to the pages
    ``first .. first + len(buf)`` held in ``buf``: a live record replaces or joins its
    id's slot, a dead one clears it. Returns the next record, or -1 - j where record
    ``j``'s chain runs past the buffer (nothing after it applied). ``counts`` +=
    [inserted, cleared]."""
    R = recs.shape[1]
    P = (PAGE_WORDS - 1) // R
    nb = buf.shape[0]
    j = j0
    while j < recs.shape[0] and homes[j] < limit:
        key = np.int64(recs[j, 0])
        state = recs[j, N_META] & np.uint64(0xFF)
        p = homes[j] - first
        hit_p, hit_o = -1, -1
        while True:  # search the chain
            if p >= nb:
                return -1 - j
            for s in range(P):
                o = 1 + s * R
                if (buf[p, o + N_META] & np.uint64(0xFF)) == LIVE and \
                        np.int64(buf[p, o]) == key:
                    hit_p, hit_o = p, o
                    break
            if hit_p >= 0 or (buf[p, 0] & np.uint64(1)) == 0:
                break
            p += 1
        if hit_p < 0 and state == LIVE:  # first free slot from home, marking full pages
            p = homes[j] - first
            while hit_p < 0:
                if p >= nb:
                    return -1 - j
                for s in range(P):
                    o = 1 + s * R
                    if (buf[p, o + N_META] & np.uint64(0xFF)) != LIVE:
                        hit_p, hit_o = p, o
                        break
                if hit_p < 0:
                    buf[p, 0] |= np.uint64(1)
                    dirty[p] = True
                    p += 1
            counts[0] += 1
        if hit_p >= 0:
            if state == LIVE:
                for k in range(R):
                    buf[hit_p, hit_o + k] = recs[j, k]
            else:
                for k in range(R):
                    buf[hit_p, hit_o + k] = 0
                counts[1] += 1
            dirty[hit_p] = True
        j += 1
    return j


@njit(cache=True, nogil=True)
def _extract(buf, R, out):
    """Copy the live records of ``buf``'s pages to ``out``; returns how many."""
    P = (PAGE_WORDS - 1) // R
    n = 0
    for p in range(buf.shape[0]):
        for s in range(P):
            o = 1 + s * R
            if (buf[p, o + N_META] & np.uint64(0xFF)) == LIVE:
                for k in range(R):
                    out[n, k] = buf[p, o + k]
                n += 1
    return n


@njit(cache=True, nogil=True)
def _read_records(fd, offs, out):
    """``out[j]`` = the record at word offset ``offs[j]`` of the log; 0 or -1 - j."""
    nb = out.shape[1] * 8
    for j in range(offs.size):
        if _pread(fd, out[j].ctypes.data, nb, offs[j] * 8) != nb:
            return -1 - j
    return 0


_POOL = None


# threads reading a batch's base pages (the numba search releases the GIL); 1: the caller's
# thread only. Off by default: 2 threads were 0.83-0.96x of 1 (embedding_disk.py --quick, 3
# A/B pairs), 0.81x at 3x10^6 ids / 64 MB, 0.80x at 10^7 / 256 MB (load 2-3.5, 2 shared cores)
READ_THREADS = max(int(os.environ.get("SAMPAN_LOGSTORE_READ_THREADS", "1")), 1)


def base_find_split(fd, n_pages, keys, homes, out, found, threads: int) -> int:
    """:func:`_base_find` over ``threads`` contiguous runs of the home-sorted keys at once
    (the kernel releases the GIL), each with a page buffer of its own; same return."""
    global _POOL
    if _POOL is None or _POOL._max_workers != threads:
        from concurrent.futures import ThreadPoolExecutor
        _POOL = ThreadPoolExecutor(threads, thread_name_prefix="sampan-logstore")
    cuts = np.linspace(0, keys.size, threads + 1).astype(np.int64)
    jobs = [_POOL.submit(_base_find, fd, n_pages, keys[a:b], homes[a:b], out[a:b],
                         found[a:b], np.empty(PAGE_WORDS, np.uint64))
            for a, b in zip(cuts[:-1], cuts[1:])]
    bad = 0
    for a, j in zip(cuts[:-1], jobs):
        st = j.result()
        if st < 0 and bad == 0:
            bad = st - int(a)
    return bad
