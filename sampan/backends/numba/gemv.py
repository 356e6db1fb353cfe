"""The small-GEMM path: x (M, K) @ w (K, N) for a few rows (M <= MAX_ROWS, batch 1..8 of
a served model) against a constant weight, with the weight packed once as wt = w.T
(N, K), C order, so each output is one dot product over two contiguous rows.

Why not BLAS: at batch 1 numpy's matmul is a GEMV on one OpenBLAS thread, walking w
(K, N) row by row. Measured on the W5 MLP's 784x512 layer (2-core AMD Zen 4, under
load, 2026-12-02): numpy 21.5 us, oneDNN's matmul (with bias and ReLU) 75 us (its
primitive call and OpenMP wake-up), this loop 22 us on one thread and 11.6 us split over
the process's two threads; at 2 rows numpy (a GEMM) took 88 us and this loop 19 us, at 8
rows 88 and 56 us. The numba loop won and is what the Predictor binds.

Rows split over the process's threads (numba's pool, whose count `sampan._threads`
sets) when the product is big enough to repay the fork-join of about 2 us
(PARALLEL_MACS, measured: 400x120 at one row was 2.9 us serial, 3.4 us split; at four
rows 6.9 and 5.6 us); smaller ones run serially. Summation order differs
from BLAS's (rounding of the last bits, as between any two BLAS builds).

The `dense` op (fuse_layers' matmul + bias + ReLU, sampan/ops/dense.py) runs the same
blocks with its epilogue in registers (`bind_dense`, at the end of this file).

Example::

    >>> wt = pack(w); small_matmul(x, wt, out)       # out[...] = x @ w
"""
from __future__ import annotations

import weakref

import numpy as np

from ... import _threads
from ...ops._nb import HAVE_NUMBA, njit

MAX_ROWS = 8             # batch sizes served by this path (GEMV-shaped products)
PARALLEL_MACS = 1 << 17  # multiply-adds from which the rows split over threads
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

if HAVE_NUMBA:
    from numba import prange

    # numba's OpenMP layer may be the first to load libgomp: sampan's wait policy first
    # (its idle workers must not spin beside OpenBLAS's between calls, _threads.py)
    _threads.before_openmp()

    @njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
    def _block(x, wt, out, b, nb):
        """Block `b` of the outputs: four columns at once (blocks below nb: four
        independent dot products share each load of x, which kept the loop at numpy's
        speed on one thread and 1.7x under it on two), then the n % 4 last one by one."""
        m, k = x.shape
        if b < nb:
            j = b * 4
            for r in range(m):
                s0 = x[r, 0] * wt[j, 0]
                s1 = x[r, 0] * wt[j + 1, 0]
                s2 = x[r, 0] * wt[j + 2, 0]
                s3 = x[r, 0] * wt[j + 3, 0]
                for i in range(1, k):
                    xv = x[r, i]
                    s0 += xv * wt[j, i]
                    s1 += xv * wt[j + 1, i]
                    s2 += xv * wt[j + 2, i]
                    s3 += xv * wt[j + 3, i]
                out[r, j] = s0
                out[r, j + 1] = s1
                out[r, j + 2] = s2
                out[r, j + 3] = s3
        else:
            j = nb * 4 + (b - nb)
            for r in range(m):
                s = x[r, 0] * wt[j, 0]
                for i in range(1, k):
                    s += x[r, i] * wt[j, i]
                out[r, j] = s

    @njit(cache=True, nogil=True)
    def _rows_serial(x, wt, out):
        n = wt.shape[0]
        nb = n // 4
        for b in range(nb + n - nb * 4):
            _block(x, wt, out, b, nb)

    @njit(cache=True, nogil=True, parallel=True)
    def _rows_parallel(x, wt, out):
        n = wt.shape[0]
        nb = n // 4
        for b in prange(nb + n - nb * 4):
            _block(x, wt, out, b, nb)


_PACKED: dict = {}       # id(weight) -> (weakref to it, its packed transpose)


def pack(w: np.ndarray) -> np.ndarray:
    """w (K, N) as the (N, K) C-order array the loop reads, made once per weight array
    (kept while the weight lives: a Predictor's clones and its executors for other batch
    sizes share it)."""
    key = id(w)
    hit = _PACKED.get(key)
    if hit is not None and hit[0]() is w:
        return hit[1]
    wt = np.ascontiguousarray(w.T)
    wt.flags.writeable = False
    try:
        ref = weakref.ref(w, lambda _r, k=key, pop=_PACKED.pop: pop(k, None))
    except TypeError:        # not weak-referenceable: packed for this caller only
        return wt
    _PACKED[key] = (ref, wt)
    return wt


def fits(x_shape, w_shape, x_dtype, w_dtype) -> bool:
    """Whether x @ w (2-d, concrete) takes this path."""
    return (HAVE_NUMBA and len(x_shape) == 2 and len(w_shape) == 2
            and all(isinstance(d, int) for d in (*x_shape, *w_shape))
            and 1 <= x_shape[0] <= MAX_ROWS and x_shape[1] == w_shape[0] >= 1
            and w_shape[1] >= 1 and np.dtype(x_dtype) == np.dtype(w_dtype)
            and np.dtype(x_dtype) in DTYPES)


_CHOSEN: dict = {}       # (m, k, n, dtype) -> the loop measured faster in this process


def loop_for(m: int, k: int, n: int, dtype=np.float32):
    """The loop for an (m, k) @ (k, n) product, or None where BLAS ran it faster: below
    PARALLEL_MACS the serial loop (it beat numpy's matmul on every such LeNet/MLP shape
    measured, by its lower call cost); above it the serial loop, the thread-split loop or
    numpy's matmul, whichever ran fastest here (measured once per shape and process, a
    few milliseconds). Whether the split pays depends on how fast the OpenMP workers
    wake: under sampan's passive wait policy (`_threads.WAIT_POLICY`) each split call
    wakes sleeping workers, about 10 us on a loaded 2-core machine, and can lose."""
    if m * k * n < PARALLEL_MACS:
        return _rows_serial
    key = (m, k, n, np.dtype(dtype).str)
    if key not in _CHOSEN:
        _CHOSEN[key] = _fastest(m, k, n, np.dtype(dtype))
    return _CHOSEN[key]


def _blas(x, wt, out):
    np.matmul(x, wt.T, out=out)


def _fastest(m, k, n, dtype, rounds=5, calls=8):
    import time
    r = np.random.default_rng(0)
    x = r.standard_normal((m, k)).astype(dtype)
    w = r.standard_normal((k, n)).astype(dtype)
    wt = pack(w)               # read-only, as the executors get it (one signature)
    out = np.empty((m, n), dtype)
    best = {}
    loops = (_rows_serial, _rows_parallel, _blas)
    for f in loops:
        f(x, wt, out)          # compiled (or loaded from numba's cache), workers started
    for _ in range(rounds):    # interleaved, the best block of each counts
        for f in loops:
            t = time.perf_counter()
            for _ in range(calls):
                f(x, wt, out)
            best[f] = min(best.get(f, float("inf")), time.perf_counter() - t)
    win = min(loops, key=best.__getitem__)
    return None if win is _blas else win


def small_matmul(x, wt, out):
    """out[...] = x @ wt.T for x (M, K) and a packed wt (N, K); returns out."""
    loop = loop_for(x.shape[0], x.shape[1], wt.shape[0], wt.dtype) or _blas
    loop(np.ascontiguousarray(x), wt, out)
    return out


# ----------------------------------------------------------------------------- dense
# The `dense` op (x @ w + bias, ReLU; sampan/ops/dense.py) that the Predictor's
# `fuse_layers` pass writes: the same blocks of four dot products with the epilogue applied
# while the sums are in registers. No `nnan`/`ninf` in the fast-math flags, so a NaN
# reaches the ReLU test and stays NaN (numpy's maximum(y, 0)); `reassoc` is what lets the
# dot products vectorise.
if HAVE_NUMBA:
    _DENSE_MATH = {"reassoc", "contract", "nsz"}

    @njit(cache=True, nogil=True, fastmath=_DENSE_MATH, boundscheck=False)
    def _dense_block(x, wt, bias, relu, out, b, nb):
        m, k = x.shape
        zero = out.dtype.type(0)
        if b < nb:
            j = b * 4
            for r in range(m):
                s0 = x[r, 0] * wt[j, 0]
                s1 = x[r, 0] * wt[j + 1, 0]
                s2 = x[r, 0] * wt[j + 2, 0]
                s3 = x[r, 0] * wt[j + 3, 0]
                for i in range(1, k):
                    xv = x[r, i]
                    s0 += xv * wt[j, i]
                    s1 += xv * wt[j + 1, i]
                    s2 += xv * wt[j + 2, i]
                    s3 += xv * wt[j + 3, i]
                s0 += bias[j]
                s1 += bias[j + 1]
                s2 += bias[j + 2]
                s3 += bias[j + 3]
                if relu:
                    s0 = zero if s0 < zero else s0
                    s1 = zero if s1 < zero else s1
                    s2 = zero if s2 < zero else s2
                    s3 = zero if s3 < zero else s3
                out[r, j] = s0
                out[r, j + 1] = s1
                out[r, j + 2] = s2
                out[r, j + 3] = s3
        else:
            j = nb * 4 + (b - nb)
            for r in range(m):
                s = x[r, 0] * wt[j, 0]
                for i in range(1, k):
                    s += x[r, i] * wt[j, i]
                s += bias[j]
                if relu and s < zero:
                    s = zero
                out[r, j] = s

    @njit(cache=True, nogil=True)
    def _dense_serial(x, wt, bias, relu, out):
        n = wt.shape[0]
        nb = n // 4
        for b in range(nb + n - nb * 4):
            _dense_block(x, wt, bias, relu, out, b, nb)

    @njit(cache=True, nogil=True, parallel=True)
    def _dense_parallel(x, wt, bias, relu, out):
        n = wt.shape[0]
        nb = n // 4
        for b in prange(nb + n - nb * 4):
            _dense_block(x, wt, bias, relu, out, b, nb)

    @njit(cache=True, nogil=True, boundscheck=False)
    def _epilogue(y, bias, relu):
        """y[r, j] = relu?(y[r, j] + bias[j]) in place (after a BLAS or oneDNN GEMM)."""
        m, n = y.shape
        zero = y.dtype.type(0)
        for r in range(m):
            for j in range(n):
                s = y[r, j] + bias[j]
                if relu and s < zero:
                    s = zero
                y[r, j] = s


def _dense_blas(x, wt, bias, relu, out):
    np.matmul(x, wt.T, out=out)
    _epilogue(out, bias, relu)


_DENSE_CHOSEN: dict = {}   # (m, k, n, dtype) -> the dense loop measured fastest here


SERIAL_MACS = 1 << 14     # below: the serial dense loop unmeasured (its call is cheapest)


def dense_loop_for(m: int, k: int, n: int, dtype=np.float32):
    """The loop for dense (m <= MAX_ROWS rows): the serial loop below SERIAL_MACS; up to
    PARALLEL_MACS the serial loop or BLAS and the epilogue, from there also the
    thread-split loop, whichever ran fastest here (measured once per shape and process:
    on the loaded 2-core Xeon BLAS's GEMV ran LeNet's 400x120 layer in 2.5 us, the loop in
    3.0; on Zen 4 the loop won every such shape)."""
    if m * k * n < SERIAL_MACS:
        return _dense_serial
    key = (m, k, n, np.dtype(dtype).str)
    if key not in _DENSE_CHOSEN:
        loops = (_dense_serial, _dense_blas) if m * k * n < PARALLEL_MACS else (
            _dense_serial, _dense_parallel, _dense_blas)
        _DENSE_CHOSEN[key] = _fastest_of(loops, m, k, n, np.dtype(dtype))
    return _DENSE_CHOSEN[key]


def _fastest_of(loops, m, k, n, dtype, rounds=5, calls=8):
    """The fastest of the dense `loops` for the shape, each timed as a served layer runs:
    the calls alternate between two copies of the weight, since between two calls of a
    layer the model's other layers pass their weights through the cache. One copy would
    stay in one core's L2 and hide what splitting the rows over the cores buys: the W5
    MLP's two big weights (1.6 + 1 MB) overflow one core's 2 MB L2 (serial calls then
    stream from L3, measured 65 us for the pair against 22 us for the first alone), while
    each core's half of both fits."""
    import time
    r = np.random.default_rng(0)
    x = r.standard_normal((m, k)).astype(dtype)
    wts = []
    for _ in range(2):
        wt = np.ascontiguousarray(r.standard_normal((n, k)).astype(dtype))
        wt.flags.writeable = False
        wts.append(wt)
    b = r.standard_normal(n).astype(dtype)
    out = np.empty((m, n), dtype)
    best = {}
    for f in loops:
        f(x, wts[0], b, True, out)     # compiled (or loaded from numba's cache), workers up
    for _ in range(rounds):    # interleaved, the best block of each counts
        for f in loops:
            t = time.perf_counter()
            for i in range(calls):
                f(x, wts[i & 1], b, True, out)
            best[f] = min(best.get(f, float("inf")), time.perf_counter() - t)
    return min(loops, key=best.__getitem__)


def bind_dense(node):
    """The numba provider's kernel for a `dense` node: for 1..MAX_ROWS rows against a
    constant weight, the dense loops over the weight packed once (`pack`); for more rows
    the GEMM the kernel choice measured for the class (oneDNN with the bias and ReLU as
    post-ops, or numpy's BLAS and one epilogue loop), or, up to BATCH_LOOP_MACS, the
    same packed loops where they ran faster than BLAS here (`batch_loop_for`, then
    `fastest_call` on the bound pair). Shapes and dtypes other than the node's (and a
    weight that is no constant) run the op's numpy kernel."""
    from ...ops.dense import reference
    x, w, bias = node.inputs
    relu = bool(node.attrs.get("relu", False))
    shape = tuple(x.shape)
    if (not HAVE_NUMBA or w.const is None or bias.const is None
            or not all(isinstance(d, int) for d in (*shape, *w.shape))
            or x.dtype not in DTYPES or w.dtype != x.dtype or bias.dtype != x.dtype
            or len(shape) != 2 or shape[1] != w.shape[0] or shape[1] < 1
            or tuple(bias.shape) != (w.shape[1],)):
        def plain(x, w, bias):
            return reference(x, w, bias, relu)
        return plain
    m, k = shape
    n = w.shape[1]
    dtype = x.dtype
    b = np.ascontiguousarray(bias.const, dtype)
    contiguous, empty = np.ascontiguousarray, np.empty
    from .. import choice
    if 1 <= m <= MAX_ROWS and choice.preferred("matmul") is None:   # no user's backend
        loop = dense_loop_for(m, k, n, dtype)
        wt = pack(w.const)

        def dense_small(x, w, bias):
            if x.shape != shape or x.dtype != dtype:     # what the loop was checked for
                return reference(x, w, bias, relu)
            out = empty((m, n), dtype)
            loop(contiguous(x), wt, b, relu, out)
            return out
        return dense_small
    gemm = _chosen_gemm(shape, w.const)
    wc = np.ascontiguousarray(w.const)
    post = (("relu", 0.0, 0.0),) if relu else ()

    def dense_gemm(x, w, bias):
        if x.shape != shape or x.dtype != dtype:
            return reference(x, w, bias, relu)
        if gemm is not None:
            try:
                return gemm(contiguous(x), wc, b, post)
            except Exception:  # noqa: BLE001 - oneDNN refused this call: numpy's BLAS
                pass
        out = empty((m, n), dtype)
        np.matmul(x, wc, out=out)
        _epilogue(out, b, relu)
        return out
    if gemm is not None or choice.preferred("matmul") is not None:
        return dense_gemm                  # the kernel choice's (or the user's) backend
    cands = [dense_gemm]
    if m * k * n <= BATCH_LOOP_MACS:
        loop = batch_loop_for(m, k, n, dtype)
        if loop is not None:
            wt = pack(w.const)

            def dense_rows(x, w, bias):
                if x.shape != shape or x.dtype != dtype:
                    return reference(x, w, bias, relu)
                out = empty((m, n), dtype)
                loop(contiguous(x), wt, b, relu, out)
                return out
            cands.append(dense_rows)
    if len(cands) == 1:
        return dense_gemm
    zero = np.zeros(shape, dtype)
    return fastest_call(cands, lambda f: f(zero, None, None))


def threads_beside_blas() -> bool:
    """Whether a batch's numba loops may split over OpenMP threads in a program whose
    other layers run BLAS: under a passive wait policy (`_threads.PASSIVE_POLICY`), or
    where OpenBLAS runs on one thread. Where libgomp spins (its default, e.g. when torch
    loaded a libgomp first: the W5 benchmark's process), a worker left spinning after a split loop
    holds the core the next layer's OpenBLAS thread needs (LeNet at batch 64 with one
    layer on oneDNN's OpenMP and the rest on BLAS: p50 28 ms against 0.9 ms, loaded
    2-core Zen 4, 2026-12-02). A race of each node alone cannot see that.
    Under the "onednn" GEMM pool OpenBLAS runs on one thread (no workers of its own to
    starve), so there they split whatever the policy (sampan's bounded spin goes with
    that pool: _threads.py, backends/pool.py)."""
    return not _threads.openmp_spins() or _threads.blas_cap() == 1


def fastest_call(fns, call, rounds=5, budget_s=0.05, margin=1.05):
    """The one of `fns` whose `call(fn)` ran fastest here: one warm call each (compiles
    or loads it, makes primitives, starts threads), then rounds that alternate them, the
    best call of each counting (a busy machine slows them alike); stops after `budget_s`
    once two rounds ran. fns[0] is today's kernel: another must beat it by `margin`.
    Made once per bound node."""
    import time
    best = {}
    for f in fns:
        call(f)
    stop = time.perf_counter() + budget_s
    for r in range(rounds):
        for i, f in enumerate(fns):
            t = time.perf_counter()
            call(f)
            best[i] = min(best.get(i, float("inf")), time.perf_counter() - t)
        if r >= 1 and time.perf_counter() > stop:
            break
    win = min(best, key=best.__getitem__)
    return fns[win] if best[win] * margin < best[0] else fns[0]


# A batch of more rows runs the same loops where they beat BLAS's GEMM and the epilogue:
# small layers, where OpenBLAS's call and thread hand-off cost more than the arithmetic
# (LeNet's 64x400 @ 400x120 at batch 64 on the loaded 2-core Zen 4, 2026-12-02: BLAS
# 0.1-2.7 ms as its two threads waited for each other, the serial loop 0.1 ms). Up to
# this many multiply-adds the loops race BLAS (once per shape and process, `_fastest_of`).
BATCH_LOOP_MACS = 1 << 22
_BATCH_CHOSEN: dict = {}


def batch_loop_for(m: int, k: int, n: int, dtype=np.float32):
    """For dense with m > MAX_ROWS rows: the serial or thread-split loop where one ran
    faster here than BLAS and the epilogue, else None (BLAS). The thread-split loop only
    races where its OpenMP workers sleep after it (`threads_beside_blas`)."""
    key = (m, k, n, np.dtype(dtype).str)
    if key not in _BATCH_CHOSEN:
        loops = (_dense_blas, _dense_serial) + (
            (_dense_parallel,) if threads_beside_blas() else ())
        win = _fastest_of(loops, m, k, n, np.dtype(dtype))
        _BATCH_CHOSEN[key] = None if win is _dense_blas else win
    return _BATCH_CHOSEN[key]


def _chosen_gemm(shape, w):
    """oneDNN's linear (bias and ReLU as post-ops) when the kernel choice runs this
    matmul class on oneDNN (backends/choice.py), else None (numpy's BLAS)."""
    try:
        from ...backends import onednn
        from ...ops.registry import OPS
        pick = getattr(OPS["matmul"].kernel, "pick", None)
        if pick is None or not onednn.available():
            return None
        if pick((np.zeros(shape, w.dtype), np.ascontiguousarray(w))) is None:
            return None
    except Exception:  # noqa: BLE001 - no oneDNN, or it refused: numpy's BLAS
        return None

    def linear(x, w, b, post):
        return onednn.linear(x, w, b, post_ops=post)
    return linear


def dense_kernel(x, w, bias, relu=False):
    """The `dense` op's numba kernel (eager and the jit): the dense loops for a few rows,
    else the op's numpy kernel. The weight is transposed per call, not `pack`ed: an eager
    weight may change in place between calls (`bind_dense` packs a served constant)."""
    from ...ops.dense import reference
    if (not HAVE_NUMBA or not fits(x.shape, w.shape, x.dtype, w.dtype)
            or bias.dtype != x.dtype or bias.shape != (w.shape[1],)):
        return reference(x, w, bias, relu)
    m, k = x.shape
    n = w.shape[1]
    out = np.empty((m, n), x.dtype)
    dense_loop_for(m, k, n, x.dtype)(np.ascontiguousarray(x), np.ascontiguousarray(w.T),
                                     np.ascontiguousarray(bias), bool(relu), out)
    return out


KERNELS = {"dense": dense_kernel}
