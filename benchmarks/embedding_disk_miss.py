"""Steady-state miss cost of the disk tier's base: a 4 kB ``pread`` a page (what
``sampan.rec._logstore_kernels._base_find`` does) against the file memory-mapped and read in
place by numba, with and without dropping the mapped pages after each step (the RSS bound).

    python benchmarks/embedding_disk_miss.py [FILE]   # a 1 GB scratch file, removed after

1000 random pages a step (a step's ~1000 misses), 3 interleaved blocks of 20 steps; prints
us a page (medians) and the process' RssFile. Figures: benchmarks/RESULTS.md.
"""
import mmap
import os
import sys
import tempfile
import time

import numpy as np
from numba import njit, types

_pread = types.ExternalFunction(
    "pread", types.int64(types.intc, types.voidptr, types.uint64, types.int64))


@njit(nogil=True)
def by_pread(fd, pages, buf):
    s = np.uint64(0)
    for p in pages:
        _pread(fd, buf.ctypes.data, 4096, p * 4096)
        for k in range(0, 512, 24):   # scan the page's records' key words
            s += buf[k]
    return s

@njit(nogil=True)
def by_map(a, pages):
    s = np.uint64(0)
    for p in pages:
        for k in range(0, 512, 24):
            s += a[p * 512 + k]
    return s


_madv = types.ExternalFunction("madvise", types.intc(types.voidptr, types.uint64, types.intc))

@njit(nogil=True)
def by_map_drop(a, pages):
    """Read in place, then drop each touched 64 kB window (fault-around's) from the map."""
    s = np.uint64(0)
    for p in pages:
        for k in range(0, 512, 24):
            s += a[p * 512 + k]
    base = a.ctypes.data
    last = np.int64(-1)
    for p in pages:
        w = (p * 4096) & ~np.int64(65535)
        if w != last:
            _madv(base + w, 65536, 4)  # MADV_DONTNEED
            last = w
    return s

def rss():
    with open("/proc/self/status") as f:
        return {ln.split(":")[0]: int(ln.split()[1]) // 1024 for ln in f
                if ln.startswith(("VmRSS", "RssFile"))}


path = sys.argv[1] if len(sys.argv) > 1 else \
    os.path.join(tempfile.gettempdir(), "sampan-miss.bin")
n_pages = 1 << 18  # 1 GB
if not os.path.exists(path) or os.path.getsize(path) != n_pages * 4096:
    with open(path, "wb") as f:
        for _ in range(n_pages // 256):
            f.write(np.random.default_rng().integers(0, 1 << 62, 256 * 512)
                    .astype(np.uint64).tobytes())
with open(path, "rb") as f:
    while f.read(1 << 24):  # into the page cache
        pass
fd = os.open(path, os.O_RDONLY)
mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
mm.madvise(mmap.MADV_RANDOM)
a = np.frombuffer(mm, np.uint64)
buf = np.empty(512, np.uint64)
rng = np.random.default_rng(0)
steps = [np.sort(rng.integers(0, n_pages, 1000)) for _ in range(60)]
by_pread(fd, steps[0], buf); by_map(a, steps[0]); mm.madvise(mmap.MADV_DONTNEED)
res = {"pread": [], "mmap+dontneed": [], "mmap+drop touched": [], "mmap (no unmap)": []}
by_map_drop(a, steps[0])
peak = 0
for blk in range(3):  # interleaved blocks
    for name in res:
        t = time.perf_counter()
        for st in steps[blk * 20:(blk + 1) * 20]:
            if name == "mmap+drop touched":
                by_map_drop(a, st)
                peak2 = rss()["RssFile"]
            elif name == "pread":
                by_pread(fd, st, buf)
            else:
                by_map(a, st)
                if name == "mmap+dontneed":
                    mm.madvise(mmap.MADV_DONTNEED)
        res[name].append((time.perf_counter() - t) / 20000 * 1e6)
        peak = max(peak, rss()["RssFile"])
    mm.madvise(mmap.MADV_DONTNEED)
for k, v in res.items():
    print(f"{k}: us/page median {np.median(v):.2f} blocks {[round(x, 2) for x in v]}")
print("RssFile after a drop-touched step MB:", peak2)
print("peak RssFile MB (after the no-unmap blocks):", peak,
      "load", open("/proc/loadavg").read().split()[:3])
os.close(fd)
if len(sys.argv) <= 1:
    os.unlink(path)
