"""numba row loops of softmax, log-softmax, their gradients and cross-entropy with class
targets (`sampan.ops.rowwise`): one pass per row, float32 rows with mathlib's vectorised
exp32 (as fused jit kernels do), float64 rows with numpy's exp. bfloat16 rows run the same
loops over their bits (loaded to float32, each output rounded once: the ops' rule without
float32 copies of the arrays); float16 computes in float32 arrays and rounds; other calls
go to the ops' numpy kernels."""
from __future__ import annotations

import numpy as np

from .... import dtypes as _dt
from ....ops import rowwise as _r
from ....ops._nb import FASTMATH_IEEE, njit
from ..mathlib import bf16_load, bf16_store
from ..mathlib import exp32 as _exp32

# FASTMATH_IEEE: reassociation lets LLVM vectorise the row sums and maxima (8x faster
# here); no "finite only" flags, so masked (-inf) entries and NaNs keep IEEE semantics
_FM = FASTMATH_IEEE
_BF16 = np.dtype(_dt.bfloat16)


def _run_rows(kern, *arrays, **scalars):
    """`kern(rows of each array..., *scalars, out_rows)` into a new array like arrays[0],
    every array viewed as contiguous (rows, last dim)."""
    x = arrays[0]
    out = np.empty(x.shape, x.dtype)
    c = x.shape[-1]
    kern(*(np.ascontiguousarray(a).reshape(-1, c) for a in arrays), *scalars.values(),
         out.reshape(-1, c))
    return out


@njit(inline="always")
def _same(v):
    return v


# Accumulators start from a zero of the row's own type (`zero` below): `x[r, 0] * 0` is
# float64 in numba for float32 x, and the float64 sums made W3's softmax 2x slower.
# `load` / `store` read and write an element: the identity for float32/float64 rows,
# mathlib's bf16_load / bf16_store for bfloat16 rows held as their uint16 bits (computed
# in float32 and each output rounded once, as the ops' rule says, with no float32 copy
# of the rows made and none rounded back afterwards).
def _row_max_fn(load):
    @njit(inline="always", fastmath=_FM)
    def row_max(x, r):
        # a NaN anywhere still reaches the result: as m here (first element) or through
        # exp(x - m) in the caller's sum; the comparison vectorises where max() did not
        m = load(x[r, 0])
        for c in range(1, x.shape[1]):
            v = load(x[r, c])
            m = v if v > m else m
        return m
    return row_max


_row_max = _row_max_fn(_same)


def _exp_row_fn(expf, zero, load):
    @njit(inline="always", fastmath=_FM)
    def exp_row(x, r, m, buf, br):
        """buf[br] = e**(x[r] - m) for the row's max m; returns the sum."""
        s = zero
        for c in range(x.shape[1]):
            e = expf(load(x[r, c]) - m)
            buf[br, c] = e
            s += e
        return s
    return exp_row


def _row_kernels(expf, zero, load=_same, store=_same, one_buf=False):
    """softmax / log-softmax forward (`fwd(x, log, out, buf, ms)`: the exponentials go to
    `buf`, `out` itself for float rows (`buf` is then not read), one float32 row for
    bfloat16 (`one_buf`); `ms` takes the rows' maxima, float32 for float32 and bfloat16
    rows) and backward."""
    exp_row = _exp_row_fn(expf, zero, load)
    row_max = _row_max_fn(load)
    one = zero + 1

    # the rows' maxima first, into `ms` (nr values of the row type, the caller's): with
    # each row's max before its exponentials, an array allocated in the kernel, a row
    # index of `buf` chosen per call, or the float rows through the identity load/store,
    # LLVM vectorised the loops no more (W8's (32, 12, 128, 128) softmax: 13-16 ms a
    # call on one core, 3.4 ms so)
    if load is _same and store is _same:
        @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
        def fwd(x, log, out, buf, ms, have_ms=False):
            nr, nc = x.shape
            if not have_ms:       # else the caller's (`_maxima`: AVX-512, 3x faster)
                for r in range(nr):
                    ms[r] = row_max(x, r)
            for r in range(nr):
                m = ms[r]
                s = exp_row(x, r, m, out, r)
                if log:
                    ls = np.log(s)
                    for c in range(nc):
                        out[r, c] = (x[r, c] - m) - ls
                else:
                    inv = one / s   # a multiply per element, not a division
                    for c in range(nc):
                        out[r, c] = out[r, c] * inv
    else:
        @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
        def fwd(x, log, out, buf, ms, have_ms=False):
            nr, nc = x.shape
            if not have_ms:
                for r in range(nr):
                    ms[r] = row_max(x, r)
            for r in range(nr):
                br = 0 if one_buf else r
                m = ms[r]
                s = exp_row(x, r, m, buf, br)
                if log:
                    ls = np.log(s)
                    for c in range(nc):
                        out[r, c] = store((load(x[r, c]) - m) - ls)
                else:
                    inv = one / s
                    for c in range(nc):
                        out[r, c] = store(buf[br, c] * inv)

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
    def bwd(y, g, log, out):
        nr, nc = y.shape
        for r in range(nr):
            s = zero
            if log:
                for c in range(nc):
                    s += load(g[r, c])
                for c in range(nc):
                    out[r, c] = store(load(g[r, c]) - expf(load(y[r, c])) * s)
            else:
                for c in range(nc):
                    s += load(g[r, c]) * load(y[r, c])
                for c in range(nc):
                    yc = load(y[r, c])
                    out[r, c] = store(yc * (load(g[r, c]) - s))
    return fwd, bwd


@njit(inline="always")
def _exp64(x):
    return np.exp(x)


_K = {np.dtype(np.float32): _row_kernels(_exp32, np.float32(0)),
      np.dtype(np.float64): _row_kernels(_exp64, np.float64(0))}
_KB = _row_kernels(_exp32, np.float32(0), bf16_load, bf16_store, True)   # bfloat16 bits


PAR_MIN = 1 << 18       # elements from which the rows run over the threads (W8: 6.3M)
_CHUNK = 1 << 16        # elements per block of rows that a thread claims


def _fwd_shared(fwd, x, log, out):
    """`fwd` (the serial loop, nogil) over blocks of rows that sampan's threads claim
    (`claim.run_claimed`): each row exactly the serial arithmetic, so the same bytes."""
    from ..claim import run_claimed, threads
    nr, nc = x.shape
    rows = max(1, _CHUNK // max(nc, 1))
    nblk = -(-nr // rows)

    def block(i, t):
        r0, r1 = i * rows, min(nr, (i + 1) * rows)
        o = out[r0:r1]
        xb = x[r0:r1]
        ms, have = _maxima(xb)
        fwd(xb, log, o, o, ms, have)
    run_claimed(nblk, block, threads())


def _maxima(x):
    """(the maxima of the float32 rows x (contiguous, nonempty rows), True) by
    `simdrows.rowmax_kernel`; else (an empty buffer for them, False): the kernel's loop."""
    ms = np.empty(x.shape[0], x.dtype)
    f = _rowmax() if x.dtype == np.float32 and x.shape[1] else None
    if f is None or not x.flags.c_contiguous:
        return ms, False
    f(x.ctypes.data, x.shape[1], x.shape[0], x.shape[1], ms.ctypes.data)
    return ms, True


def _rowmax():
    from ..simdrows import rowmax_kernel
    return rowmax_kernel()


def bits(a):
    """A bfloat16 array's uint16 bits as rows (rows, last dim), contiguous."""
    return np.ascontiguousarray(a).view(np.uint16).reshape(-1, a.shape[-1])


def is_bf16(*arrays):
    """Whether every array is bfloat16 of the first one's shape, with elements."""
    a = arrays[0]
    return a.size > 0 and all(b.dtype == _BF16 and b.shape == a.shape for b in arrays)


def _softmax_rows(x, log):
    ks = _K.get(x.dtype)
    if ks is not None and x.size:
        out = np.empty(x.shape, x.dtype)
        o = out.reshape(-1, x.shape[-1])
        xr = np.ascontiguousarray(x).reshape(o.shape)
        if x.size >= PAR_MIN and o.shape[0] > 1:
            _fwd_shared(ks[0], xr, log, o)
        else:
            ks[0](xr, log, o, o, *_maxima(xr))
        return out
    return _r._softmax_rows(x, log)


def _softmax_grad_rows(y, g, log):
    ks = _K.get(y.dtype)
    if ks is not None and y.size and g.dtype == y.dtype and g.shape == y.shape:
        return _run_rows(ks[1], y, g, log=log)
    return _r._softmax_grad_rows(y, g, log)


def _softmax_any(x, log):
    if is_bf16(x):
        out = np.empty(x.shape, _BF16)
        xb = bits(x)
        _KB[0](xb, log, bits(out), np.empty((1, x.shape[-1]), np.float32),
               np.empty(xb.shape[0], np.float32))
        return out
    return _r._in_f32(_softmax_rows, (x,), log)


def _softmax_grad_any(y, g, log):
    if is_bf16(y, g):
        out = np.empty(y.shape, _BF16)
        _KB[1](bits(y), bits(g), log, bits(out))
        return out
    return _r._in_f32(_softmax_grad_rows, (y, g), log)


def softmax(x):
    return _softmax_any(x, False)


def log_softmax(x):
    return _softmax_any(x, True)


def softmax_grad(y, g):
    return _softmax_grad_any(y, g, False)


def log_softmax_grad(y, g):
    return _softmax_grad_any(y, g, True)


# cross-entropy (see ops/rowwise.py for the formulas)
def _xent_kernels(expf, zero):
    @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
    def fwd(x, t, ignore, out, lse):
        nr, nc = x.shape
        for r in range(nr):
            m = _row_max(x, r)
            s = zero
            for c in range(nc):
                s += expf(x[r, c] - m)
            lse[r] = np.log(s) + m
            out[r] = zero if t[r] == ignore else lse[r] - x[r, t[r]]

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
    def bwd(x, t, lse, g, h, ignore, out):
        nr, nc = x.shape
        for r in range(nr):
            gr = zero if t[r] == ignore else g[r]
            k = gr + h[r]
            lr = lse[r]
            for c in range(nc):
                out[r, c] = expf(x[r, c] - lr) * k
            if t[r] != ignore:
                out[r, t[r]] -= gr
    return fwd, bwd


_XK = {np.dtype(np.float32): _xent_kernels(_exp32, np.float32(0)),
       np.dtype(np.float64): _xent_kernels(_exp64, np.float64(0))}


def xent(x, t, ignore_index):
    d = x.dtype
    if d.kind != "f" or d.itemsize < 4:
        loss, lse = xent(x.astype(np.float32), t, ignore_index)
        return loss.astype(d), lse.astype(d)
    ks = _XK.get(d)
    if ks is None:
        return _r._xent_kernel(x, t, ignore_index)
    _r._check_targets(x, t, ignore_index)
    out = np.empty(x.shape[0], d)
    lse = np.empty(x.shape[0], d)
    ks[0](np.ascontiguousarray(x), np.ascontiguousarray(t), ignore_index, out, lse)
    return out, lse


def xent_grad(x, t, lse, g, h, ignore_index):
    d = x.dtype
    if d.kind != "f" or d.itemsize < 4:
        f = np.float32
        return xent_grad(x.astype(f), t, lse.astype(f), g.astype(f), h.astype(f),
                         ignore_index).astype(d)
    ks = _XK.get(d)
    if ks is None or g.dtype != d or h.dtype != d or lse.dtype != d:
        return _r._xent_grad_kernel(x, t, lse, g, h, ignore_index)
    _r._check_targets(x, t, ignore_index)   # the loop writes out[r, t[r]] unchecked
    out = np.empty(x.shape, d)
    c = np.ascontiguousarray
    ks[1](c(x), c(t), c(lse), c(g), c(h), ignore_index, out)
    return out


KERNELS = {"softmax": softmax, "log_softmax": log_softmax, "softmax_grad": softmax_grad,
           "log_softmax_grad": log_softmax_grad, "softmax_cross_entropy": xent,
           "softmax_cross_entropy_grad": xent_grad}
