"""One GEMM thread pool per process.

numpy's OpenBLAS and oneDNN each keep their own worker threads. After a multi-threaded
GEMM, OpenBLAS's workers spin-wait for the next one (for up to 2**28 cycles, about 0.1 s,
unless OPENBLAS_THREAD_TIMEOUT was set before numpy loaded), so a oneDNN call that follows
finds its OpenMP workers sharing a core with a spinner and runs several times slower; on a
2-core machine a step that alternates the two libraries pays that on every switch. Timing
the libraries against each other call by call then measures the switch, not the kernels.

So a process runs its float32 GEMMs and convolutions under one of two pools:

- ``"openblas"``: numpy's OpenBLAS with every thread, as sampan ran before oneDNN was
  there. oneDNN serves only calls numpy has no BLAS for (bfloat16, int8).
- ``"onednn"``: OpenBLAS on one thread (its workers never wake, so they never spin) and
  the threads given to oneDNN's OpenMP pool. Each (op, shape) class then picks numpy
  (one thread) or oneDNN by measurement (`choice.py`), a fair race.

The pool is chosen per machine by a short calibration (a fixed set of GEMM and
convolution shapes of the W1-W3 kind, each timed in blocks of calls under both pools; the
geometric mean of the per-shape ratios decides, without the highest and the lowest ratio,
oneDNN needing to win by `cache.WIN_MARGIN`)
and kept in the kernel choice cache next to the per-class winners, keyed by the same
machine key; a calibration run on a busy machine is provisional like any other choice (it
keeps its load and runs again once the machine is quiet or clearly quieter: `cache.trusted`).
``SAMPAN_GEMM_POOL=openblas|onednn`` or `set_pool` overrides it. Where sampan gave
libgomp its bounded spin (`_threads.sampan_policy`: this CPU's cache held "onednn" when
the process started), the pool is "onednn" without calibrating (`spin_owns_cores`).

bfloat16 is decided apart (`decide("bfloat16")`, record `POOL_KEY_BF16`): the same shapes
in bfloat16, oneDNN's bf16 kernels against the numpy kernel (float32 sgemm on OpenBLAS,
rounded), both on one thread and in CPU time: whether a core's bf16 kernels beat its
float32 sgemm is a property of the core (AMX tiles, Zen 4's bf16 dot products; on an
AVX512-BF16 Xeon without AMX oneDNN's bf16 GEMMs run at 0.6-0.9x sgemm,
`benchmarks/bf16_ceiling.py`), and on two threads of a busy 2-core machine OpenBLAS's
spinning workers made the numpy side 10-800x slower than on one on four of the six shapes,
so the winner followed the load. Forced, its winner serves every bfloat16 GEMM and
convolution of the process, forward and gradients, whatever the float32 pool is;
measured, it serves bf16 matmul under the "openblas" float32 pool (racing the numpy kernel
there wakes OpenBLAS's spinning workers, which slowed the oneDNN calls after it: W3 bf16
ran at 0.47-0.61x its own fp32), and every other bf16 class races per class
(`choice.py`). Only the float32 pool sets thread policy.
``SAMPAN_GEMM_POOL_BF16=openblas|onednn`` or ``set_pool(name, "bfloat16")`` overrides it.

Example::

    >>> from sampan.backends import pool
    >>> pool.current() in (None, "openblas", "onednn")
    True
"""
from __future__ import annotations

import math
import os
import time

import numpy as np

POOLS = ("openblas", "onednn")
PRECISIONS = ("float32", "bfloat16")
# its record's key in the cache (no op class starts so); ":2" since the trimmed mean: a
# record decided by the plain mean is measured again
POOL_KEY = "pool:gemm:2"
# ":1t" since both sides are timed on one thread: a record timed on the process's threads
# is measured again
POOL_KEY_BF16 = "pool:gemm:bfloat16:1t"
BLOCK = 2                     # calls per timed block (one more, untimed, before it)
ROUNDS = 2                    # blocks per (shape, pool); the best block counts
_state = {"pool": None, "forced": None, "bf16": None, "bf16_forced": None}
_CPU = time.process_time      # the bf16 calibration's clock (one thread: its CPU time)


def _shapes():
    """(op name, arrays, attrs) of the calibration: the GEMMs of an MLP and a small
    transformer's step (forward and the two backward products) and a LeNet convolution."""
    r = np.random.default_rng(0)

    def f(*s):
        return r.standard_normal(s).astype(np.float32)
    mm = [((128, 784), (784, 512)), ((128, 512), (512, 512)), ((512, 128), (128, 512)),
          ((1024, 256), (256, 256)), ((32, 128, 64), (32, 64, 128))]
    out = [("matmul", (f(*a), f(*b)), {}) for a, b in mm]
    out.append(("conv2d", (f(64, 6, 14, 14), f(16, 6, 5, 5)),
                {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 1}))
    return out


def _precision(precision):
    if precision not in PRECISIONS:
        from ..errors import SampanError
        raise SampanError(f"pool: unknown precision {precision!r}; expected one of "
                          f"{list(PRECISIONS)}")
    return precision


def current(precision: str = "float32") -> str | None:
    """The pool in force for `precision`, or None before its first GEMM decided it (or
    without oneDNN)."""
    return _state["pool"] if _precision(precision) == "float32" else _state["bf16"]


def forced(precision: str = "float32") -> str | None:
    """The pool `set_pool` or the environment forces for `precision`, else None."""
    if _precision(precision) == "bfloat16":
        name = _state["bf16_forced"] or os.environ.get("SAMPAN_GEMM_POOL_BF16")
    else:
        name = _state["forced"] or os.environ.get("SAMPAN_GEMM_POOL")
    return name if name in POOLS else None


def set_pool(name: str | None, precision: str = "float32") -> None:
    """Run this process's `precision` GEMMs under pool `name` ("openblas" or "onednn"),
    whatever was measured; None goes back to the measured pool. Per-class choices made so
    far are forgotten."""
    from . import cache
    if name is not None and name not in POOLS:
        from ..errors import SampanError
        raise SampanError(f"set_pool: unknown pool {name!r}; expected one of {list(POOLS)}")
    with cache.LOCK:
        if _precision(precision) == "bfloat16":
            _state["bf16_forced"] = name
            _state["bf16"] = None
        else:
            _state["forced"] = name
            _apply(None)
        cache.forget()


def decide(precision: str = "float32") -> str:
    """The pool for this process's `precision` GEMMs: forced, else cached for this
    machine, else calibrated now (a fraction of a second, once per machine and precision).
    float32's applies its thread policy."""
    from . import cache
    if _precision(precision) == "bfloat16":
        return _decide_bf16()
    if _state["pool"] is not None:
        return _state["pool"]
    with cache.LOCK:
        if _state["pool"] is not None:
            return _state["pool"]
        name = _state["forced"] or os.environ.get("SAMPAN_GEMM_POOL")
        if name not in POOLS:
            if not cache.backends():
                name = "openblas"
            else:
                name = "onednn" if spin_owns_cores() else _measured()
        _apply(name)
        return name


def spin_owns_cores() -> bool:
    """Whether sampan gave libgomp a spinning wait policy (`_threads.sampan_policy`: the
    kernel choice cache held the "onednn" pool for this CPU when the process started).
    Its pool is then "onednn" whatever a calibration would say now: OpenBLAS's threads
    beside spinning OpenMP workers are the two pools fighting for the cores (PP-OCR rec
    1.37 -> 4.34x onnxruntime, RESULTS.md). A spin the user set keeps the measured pool."""
    from .. import _threads
    return _threads.spin_by_sampan()


def _decide_bf16() -> str:
    from . import cache
    if _state["bf16"] is not None:
        return _state["bf16"]
    with cache.LOCK:
        if _state["bf16"] is None:
            name = _state["bf16_forced"] or os.environ.get("SAMPAN_GEMM_POOL_BF16")
            if name not in POOLS:
                name = "openblas" if not cache.backends() else _measured(
                    POOL_KEY_BF16, calibrate_bf16)
            _state["bf16"] = name
        return _state["bf16"]


def _measured(key=POOL_KEY, calibration=None) -> str:
    """The winner stored under `key` for this machine, else the one `calibration()`
    (default `calibrate`) measures now, stored with its ratio."""
    from . import cache
    stored = cache.stored(key)
    if stored and stored.get("winner") in POOLS and cache.trusted(stored):
        return stored["winner"]
    machine = cache.conditions()
    times = (calibration or calibrate)()
    ratios = [times["onednn"][i] / times["openblas"][i] for i in range(len(times["openblas"]))]
    gmean = trimmed_gmean(ratios)
    winner = "onednn" if gmean < 1 / cache.WIN_MARGIN else "openblas"
    cache.store(key, {"winner": winner, **machine, "ratio": round(gmean, 4),
                      "times_us": {k: [round(t * 1e6, 1) for t in v]
                                   for k, v in times.items()}})
    return winner


def trimmed_gmean(ratios) -> float:
    """The geometric mean of `ratios` without the highest and the lowest (with at least
    five): one shape timed while the machine stalled cannot decide alone. Measured on a
    2-core Xeon (2026-12-02): one OpenBLAS block of 16 ms against ~0.4 ms for its
    neighbours made a plain mean of 0.63 pick oneDNN, whose pool then ran the W5 MLP's
    batch-64 GEMMs on one OpenBLAS thread at 150 GFLOP/s against 250 on two."""
    r = sorted(ratios)
    if len(r) >= 5:
        r = r[1:-1]
    return math.exp(sum(math.log(x) for x in r) / len(r))


def _best_block(fn, arrays, attrs, clock=time.perf_counter) -> float:
    fn(*arrays, **attrs)
    best = float("inf")
    for _ in range(ROUNDS):
        t = clock()
        for _ in range(BLOCK):
            fn(*arrays, **attrs)
        best = min(best, (clock() - t) / BLOCK)
    return best


def calibrate() -> dict:
    """{pool: [seconds per call of each calibration shape]}; under "onednn" a shape
    counts its faster kernel (numpy on one thread or oneDNN), as the choice will. The
    "openblas" pool is timed last: its spinning workers would slow what follows."""
    from .. import _threads
    from ..ops.registry import OPS, default_kernel
    from .onednn import KERNELS
    from .onednn._lib import OneDNNError
    from .onednn.primitives import Unsupported
    shapes = _shapes()
    out = {"onednn": [], "openblas": []}
    # the pools' thread policies, without making either current (another thread
    # asking for the pool meanwhile waits for the decision on cache.LOCK)
    _threads.cap_blas(1)
    try:
        for op, arrays, attrs in shapes:
            t_np = _best_block(default_kernel(OPS[op].kernels), arrays, attrs)
            try:
                t_dnn = _best_block(KERNELS[op], arrays, attrs)
            except (Unsupported, OneDNNError):
                t_dnn = float("inf")
            out["onednn"].append(min(t_np, t_dnn))
        _threads.cap_blas(None)
        for op, arrays, attrs in shapes:
            out["openblas"].append(_best_block(default_kernel(OPS[op].kernels), arrays, attrs))
    finally:
        _threads.cap_blas(1 if _state["pool"] == "onednn" else None)
    return out


def calibrate_bf16() -> dict:
    """{pool: [seconds per call of each calibration shape in bfloat16]}: "onednn" times
    oneDNN's bf16 kernel, "openblas" the numpy kernel (float32 sgemm, rounded), timed
    last, both on one thread (the module doc says why) and in the process's CPU time (one
    thread's work: a neighbour that deschedules it does not count); a shape oneDNN refuses
    counts the numpy time on both sides."""
    from .. import _threads
    from .. import dtypes as _dt
    from ..ops.registry import OPS
    from .onednn import KERNELS, _lib
    from .onednn._lib import OneDNNError
    from .onednn.primitives import Unsupported
    shapes = [(op, tuple(a.astype(_dt.bfloat16) for a in arrays), attrs)
              for op, arrays, attrs in _shapes()]
    out = {"onednn": [], "openblas": []}
    gomp = _lib.gomp() if _lib.lib() is not None else None     # (loads oneDNN)
    prev = int(gomp.omp_get_max_threads()) if gomp is not None else None
    cap = _threads.blas_cap()
    if gomp is not None:
        gomp.omp_set_num_threads(1)
    _threads.cap_blas(1)
    try:
        for op, arrays, attrs in shapes:
            try:
                out["onednn"].append(_best_block(KERNELS[op], arrays, attrs, _CPU))
            except (Unsupported, OneDNNError):
                out["onednn"].append(None)
        for i, (op, arrays, attrs) in enumerate(shapes):
            t = _best_block(OPS[op].kernels["numpy"], arrays, attrs, _CPU)
            out["openblas"].append(t)
            if out["onednn"][i] is None:
                out["onednn"][i] = t
    finally:
        if gomp is not None:
            gomp.omp_set_num_threads(prev)
        _threads.cap_blas(cap)
    return out


def _apply(name) -> None:
    """Set the thread policy of pool `name` (None: no pool yet, every library its count)."""
    from .. import _threads
    _state["pool"] = name
    _threads.cap_blas(1 if name == "onednn" else None)


def reset() -> None:
    """Forget the pools (tests; the next GEMM decides again)."""
    _state.update(forced=None, bf16=None, bf16_forced=None)
    _apply(None)
