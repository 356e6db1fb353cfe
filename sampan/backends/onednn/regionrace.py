"""Threads of a oneDNN region: the process's OpenMP threads, or one.

A region of many small primitives (PP-OCR's direction classifier: 74 primitives of
5-40 us in a 1 ms model) pays an OpenMP fork and join per primitive, and under sampan's
passive wait policy a futex wake-up of the sleeping worker, at every one; on a busy
machine the join waits for a descheduled worker's time slice. `fastest(node)` races the
region built on the process's OpenMP threads (`blocked.Region(node)`) against the same
region built and run on one thread (`ThreadedRegion(node, 1)`: oneDNN's kernels take
their thread count when they are created, and the ones that ask at run time see the
calling thread's count, set for the call and restored after it; the count is a
per-thread setting of libgomp, so other threads are not touched) and keeps the faster;
a region whose primitives average more than `RACE_STEP_US` is not raced (a second
thread pays for its join). ppocr_cls on the 2-core Zen 4 VM under load: 0.68 ms on one
thread against 3.1 ms on two.

Example::

    >>> run = fastest(node)            # an engine node compiled for concrete shapes
    >>> run.race                       # {"threads": 1, "parallel_us": ..., "serial_us": ...}
"""
from __future__ import annotations

import ctypes
import time

from . import _lib as L
from .blocked import Region, Unsupported

__all__ = ["ThreadedRegion", "fastest"]

RACE_STEP_US = 150.0     # regions whose primitives average longer keep the process's threads
RACE_ROUNDS = 5          # interleaved rounds of the two builds (best of each decides)


def omp():
    """libgomp with omp_get_max_threads / omp_set_num_threads typed, or None."""
    g = L.gomp()
    if g is None:
        return None
    g.omp_get_max_threads.restype = ctypes.c_int
    g.omp_get_max_threads.argtypes = []
    g.omp_set_num_threads.restype = None
    g.omp_set_num_threads.argtypes = [ctypes.c_int]
    return g


class ThreadedRegion(Region):
    """`blocked.Region` built and run on `threads` OpenMP threads (the calling thread's
    count is set for the build and for each call, and restored after)."""

    def __init__(self, node, threads: int):
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"onednn region: threads={threads!r}; expected a positive int")
        self._omp = omp()
        if self._omp is None:
            raise Unsupported("no OpenMP runtime to set a region's thread count")
        self.threads = threads
        super().__init__(node)

    def _on_threads(self, fn, *args, **kw):
        prev = self._omp.omp_get_max_threads()
        self._omp.omp_set_num_threads(self.threads)
        try:
            return fn(*args, **kw)
        finally:
            self._omp.omp_set_num_threads(prev)

    def _build(self, node):
        return self._on_threads(super()._build, node)

    def __call__(self, *arrays, **kw):
        return self._on_threads(super().__call__, *arrays, **kw)


def _best(fn, args, n):
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t)
    return best


def fastest(node):
    """The faster of `Region(node)` (the process's OpenMP threads) and
    `ThreadedRegion(node, 1)`, measured here on the node's shapes (see the module doc);
    the choice and both times are kept on the region as `race`
    ({"threads", "parallel_us", "serial_us"}; serial_us None where it did not race)."""
    par = Region(node)
    g = omp()
    n = g.omp_get_max_threads() if g is not None else 1
    par.race = {"threads": n, "parallel_us": None, "serial_us": None}
    if n <= 1 or not par.steps:
        return par
    args = par.example_inputs(node)
    par(*args)                                   # warm: first-touch of the buffers
    t_par = _best(par, args, 2)
    par.race["parallel_us"] = round(t_par * 1e6, 1)
    if t_par / len(par.steps) * 1e6 > RACE_STEP_US:
        return par
    try:
        ser = ThreadedRegion(node, 1)
    except (Unsupported, L.OneDNNError):
        return par
    ser(*args)
    t_ser = float("inf")
    for _ in range(RACE_ROUNDS):                 # interleaved: load falls on both alike
        t_par = min(t_par, _best(par, args, 1))
        t_ser = min(t_ser, _best(ser, args, 1))
    win, lose = (ser, par) if t_ser < t_par else (par, ser)
    win.race = {"threads": win.threads or n, "parallel_us": round(t_par * 1e6, 1),
                "serial_us": round(t_ser * 1e6, 1)}
    lose.close()
    return win
