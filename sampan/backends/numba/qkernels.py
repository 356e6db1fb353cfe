"""The numba provider's int8 kernels (the op table's are the numpy reference,
`ops/_qref.py`, which these match exactly): quantise in one pass, and an int8 GEMM that
accumulates in int32 and finishes each output (int32 as it is, float32 dequantised with
the scales, or int8 requantised).

The GEMM takes the weight transposed, (N, K), and has three paths; `choice` times each
once per shape on this machine and keeps the fastest:
- "vnni": the AVX-512 VNNI micro-kernel of `vnni.py` (vpdpbusd, 64 multiply-adds an
  instruction), where the CPU has it; 2.5x single-threaded fp32 BLAS on W1's layers here;
- "loop": a numba loop, one dot of two contiguous int8 rows per output (several times
  slower than fp32 BLAS at batch 64; it wins for a single row, where the others pad);
- "blas": the reference's exact float BLAS (`_qref.gemm`).

Zero points are corrected outside the dot: sum (a - za)(b - zb) = sum ab - za * colsum(b)
- zb * rowsum(a) + K za zb.
"""
from __future__ import annotations

import numpy as np

from ...ops import _qref
from ...ops._nb import HAVE_NUMBA, njit
from ...ops._qref import F32, I32, Q8  # noqa: F401  (the GEMM's modes, named here too)

if HAVE_NUMBA:
    @njit(cache=True, nogil=True, boundscheck=False)
    def _quantize3(x, scale, zp, lo, hi, out):
        """out[o, c, i] = clip(rint(x[o, c, i] / s[c]) + zp[c], lo, hi); NaN -> zp. Clipped
        before the zero point is added, in selects, so the loop vectorises."""
        n0, n1, n2 = x.shape
        for o in range(n0):
            for c in range(n1):
                s = scale[c]
                z = zp[c]
                a = x.dtype.type(lo - z)
                b = x.dtype.type(hi - z)
                for i in range(n2):
                    out[o, c, i] = _quantize1(x[o, c, i], s, z, a, b)

    @njit(inline="always")
    def _quantize1(x, s, z, a, b):
        v = np.rint(x / s)
        # selects, not min/max: numba's builtin min/max ran 1.7x slower here
        v = a if v < a else v  # noqa: FURB136
        v = b if v > b else v  # noqa: FURB136
        v = 0 if np.isnan(v) else v
        return np.int32(v) + z

    @njit(cache=True, nogil=True, boundscheck=False)
    def _quantize_flat(x, s, z, lo, hi, out):
        """`_quantize3` with one scale (of x's type) and zero point, over contiguous
        arrays of any shape: no reshapes or parameter arrays to pass from Python."""
        xf = x.reshape(x.size)
        of = out.reshape(out.size)
        a = x.dtype.type(lo - z)
        b = x.dtype.type(hi - z)
        for i in range(xf.size):
            of[i] = _quantize1(xf[i], s, z, a, b)

    @njit(cache=True, nogil=True, boundscheck=False)
    def _gemm(a, bt, za, zb, mult, zy, lo, hi, mode, out_i, out_f, out_q):
        m, k = a.shape
        n = bt.shape[0]
        rows = np.zeros(m, np.int64)
        for i in range(m):
            s = 0
            for p in range(k):
                s += np.int64(a[i, p])
            rows[i] = s
        for j in range(n):
            cs = np.int64(0)
            for p in range(k):
                cs += np.int64(bt[j, p])
            corr = k * np.int64(za) * np.int64(zb[j]) - np.int64(za) * cs
            for i in range(m):
                s = np.int32(0)
                for p in range(k):
                    s += np.int32(a[i, p]) * np.int32(bt[j, p])
                acc = np.int64(s) + corr - np.int64(zb[j]) * rows[i]
                if mode == 0:
                    out_i[i, j] = acc
                elif mode == 1:
                    out_f[i, j] = np.float32(np.float64(acc) * mult[j])
                else:
                    q = np.rint(np.float64(acc) * mult[j]) + zy
                    out_q[i, j] = max(lo, min(q, hi))


    @njit(cache=True, nogil=True, boundscheck=False)
    def _finish(c, xu, w, zx, zb, mult, zy, lo, hi, mode, out_i, out_f, out_q):
        """The zero-point corrections and output of the VNNI path: c (M', N') holds
        sum_k w[n, k] * xu[m, k] (xu the activations as uint8 with zero point zx)."""
        m, k = xu.shape
        n = w.shape[0]
        rows = np.zeros(m, np.int64)      # int32 sums vectorise; K * 255 fits for K < 2^23
        for i in range(m):
            s = np.int32(0)
            for p in range(k):
                s += np.int32(xu[i, p])
            rows[i] = s
        corr = np.empty(n, np.int64)
        zb64 = np.empty(n, np.int64)
        for j in range(n):
            cs = np.int32(0)
            for p in range(k):
                cs += np.int32(w[j, p])
            zb64[j] = zb[j]
            corr[j] = k * np.int64(zx) * zb64[j] - np.int64(zx) * cs
        if mode == 1:
            for i in range(m):
                for j in range(n):
                    acc = np.int64(c[i, j]) + corr[j] - zb64[j] * rows[i]
                    out_f[i, j] = np.float32(np.float64(acc) * mult[j])
        else:
            for i in range(m):
                for j in range(n):
                    acc = np.int64(c[i, j]) + corr[j] - zb64[j] * rows[i]
                    if mode == 0:
                        out_i[i, j] = acc
                    else:
                        q = np.rint(np.float64(acc) * mult[j]) + zy
                        out_q[i, j] = max(lo, min(q, hi))


def quantize(x, scale, zp, axis, lo, hi, out_dtype):
    """clip(rint(x / scale) + zp, lo, hi) as `out_dtype`; scale and zp are scalars or
    vectors along `axis` of x (ONNX QuantizeLinear; NaN gives the zero point)."""
    x, s, z, shape3 = _qref.quant_operands(x, scale, zp, axis)
    out = np.empty(x.shape, out_dtype)
    if HAVE_NUMBA and x.dtype in (np.float32, np.float64) and x.size:
        _quantize3(x.reshape(shape3), s, z, lo, hi, out.reshape(shape3))
        return out
    return _qref.quantize(x, scale, zp, axis, lo, hi, out_dtype)


def gemm(a, bt, za, zb, mult=None, zy=0, lo=-128, hi=127, mode=I32, out_dtype=np.int8):
    """(M, K) x (N, K)^T in int32, finished as `mode` says (see module doc): by the VNNI
    micro-kernel, the numba loop or BLAS on the exactly representable values, whichever
    measured fastest for this shape on this machine (`choice`)."""
    m, k = a.shape
    n = bt.shape[0]
    zb = np.broadcast_to(np.asarray(zb, np.int32).reshape(-1), (n,))
    mult = (np.ones(n) if mult is None else
            np.broadcast_to(np.asarray(mult, np.float64).reshape(-1), (n,)))
    path = choice(m, k, n, bt.dtype == np.int8) if HAVE_NUMBA and m and n and k else "blas"
    return _PATHS[path](a, bt, za, zb, mult, zy, lo, hi, mode, out_dtype)


def _vnni_gemm(a, bt, za, zb, mult, zy, lo, hi, mode, out_dtype, threads=None):
    """The AVX-512 VNNI micro-kernel (`vnni.py`) on padded, packed operands."""
    from . import vnni as _vnni
    m, k = a.shape
    n = bt.shape[0]
    kp, mp, np_ = -(-k // 4) * 4, -(-m // 32) * 32, -(-n // 4) * 4
    xu, zx = (a.view(np.uint8) ^ np.uint8(0x80), int(za) + 128) if a.dtype == np.int8 \
        else (a, int(za))       # int8 x + 128 as uint8: the zero point moves by 128
    xp = np.ascontiguousarray(xu)
    if (mp, kp) != (m, k):
        xp = np.zeros((mp, kp), np.uint8)
        xp[:m, :k] = xu
    xp = np.ascontiguousarray(xp.view(np.int32).reshape(mp // 16, 16, kp // 4)
                              .transpose(0, 2, 1))
    w = np.ascontiguousarray(bt)
    if np_ != n or kp != k:
        w = np.zeros((np_, kp), np.int8)
        w[:n, :k] = bt
    c = np.empty((mp, np_), np.int32)
    _vnni.run(w, xp, c, kp, mp, threads)
    out_i = np.empty((m, n) if mode == I32 else (1, 1), np.int32)
    out_f = np.empty((m, n) if mode == F32 else (1, 1), np.float32)
    out_q = np.empty((m, n) if mode == Q8 else (1, 1), out_dtype)
    _finish(c, np.ascontiguousarray(xu), np.ascontiguousarray(bt), zx,
            np.ascontiguousarray(zb), np.ascontiguousarray(mult), int(zy), lo, hi, mode,
            out_i, out_f, out_q)
    return (out_i, out_f, out_q)[mode]


def _loop(a, bt, za, zb, mult, zy, lo, hi, mode, out_dtype):
    m, n = a.shape[0], bt.shape[0]
    out_i = np.empty((m, n) if mode == I32 else (1, 1), np.int32)
    out_f = np.empty((m, n) if mode == F32 else (1, 1), np.float32)
    out_q = np.empty((m, n) if mode == Q8 else (1, 1), out_dtype)
    _gemm(np.ascontiguousarray(a), np.ascontiguousarray(bt), int(za),
          np.ascontiguousarray(zb), np.ascontiguousarray(mult), int(zy), lo, hi, mode,
          out_i, out_f, out_q)
    return (out_i, out_f, out_q)[mode]


def _blas(a, bt, za, zb, mult, zy, lo, hi, mode, out_dtype):
    return _qref.gemm(a, bt, za, zb, mult, zy, lo, hi, mode, out_dtype)


_CHOICE: dict = {}
def _vnni_one(*args):
    return _vnni_gemm(*args, threads=1)


_PATHS = {"loop": _loop, "blas": _blas, "vnni": _vnni_gemm, "vnni1": _vnni_one}


def choice(m, k, n, int8_weight=True) -> str:
    """"vnni" (threaded), "vnni1" (one thread), "loop" or "blas" for an (m, k) x (k, n)
    int8 GEMM: each available path is timed once per shape on this machine (a few calls on
    random data) and the fastest is kept (`_CHOICE` records them). Row counts share a
    class per power of two (up to 1024 rows, the size timed), so a new batch size does
    not time again."""
    m = min(1 << max(0, m - 1).bit_length(), 1024)   # rows in power-of-two classes
    key = (m, k, n, bool(int8_weight))
    c = _CHOICE.get(key)
    if c is None:
        import time

        from . import vnni as _vnni
        r = np.random.default_rng(0)
        a = r.integers(-128, 128, (m, k)).astype(np.int8)
        bt = r.integers(-127, 128, (n, k)).astype(np.int8)
        zb, mult = np.zeros(n, np.int32), np.ones(n)
        names = ["loop", "blas"] + (["vnni", "vnni1"] if int8_weight and _vnni.available()
                                    else [])
        best = {}
        for name in names:
            f = _PATHS[name]
            f(a, bt, 0, zb, mult, 0, -128, 127, F32, np.int8)
            t0 = time.perf_counter()
            for _ in range(3):
                f(a, bt, 0, zb, mult, 0, -128, 127, F32, np.int8)
            best[name] = time.perf_counter() - t0
        c = _CHOICE[key] = min(best, key=best.get)
    return c


def bind_quantize(node):
    """`quantize` with a constant per-tensor scale and zero point: the parameters read
    once when the node is compiled, each call one pass of `_quantize_flat` over x (the
    arithmetic of `quantize`, so the same bytes), ~1.5 us less per call at batch 1."""
    import functools
    x, scale, zp = node.inputs
    plain = functools.partial(kernels()["quantize"], **node.attrs)
    if not (HAVE_NUMBA and scale.is_const and zp.is_const and scale.ndim == 0
            and zp.ndim == 0 and x.dtype in (np.float32, np.float64)):
        return plain
    dt = np.dtype(zp.dtype)
    lo, hi = (-128, 127) if dt == np.int8 else (0, 255)
    s = np.asarray(scale.const, x.dtype).reshape(())[()]     # a scalar of x's type
    z = int(np.asarray(zp.const))
    fdt = np.dtype(x.dtype)

    def run(a, *rest):
        if a.dtype != fdt or not a.flags.c_contiguous or not a.size:
            return plain(a, *rest)
        out = np.empty(a.shape, dt)
        _quantize_flat(a, s, z, lo, hi, out)
        return out
    return run


def kernels() -> dict:
    """{op name: kernel} of the int8 ops over these kernels (the numba provider's table):
    the op table's conventions (`ops.quant.int8_kernels`) over this module's GEMM."""
    import sys

    from ...ops.quant import int8_kernels
    from . import qdirect, qdynamic, qlayers  # noqa: F401  (qdirect registers the direct conv)
    return dict(int8_kernels(sys.modules[__name__]), **qlayers.KERNELS, **qdynamic.KERNELS)
