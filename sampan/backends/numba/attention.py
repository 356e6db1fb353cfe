"""The numba kernels of `attention` (ops/attention.py): masked multi-head self-attention,
one (sequence, head) pair a task, the pairs split over numba's threads (`prange`).

Two variants compute the same thing; `kernel_name()` says which runs.

- ``"blas"`` (`_attn_blas`, where numpy's BLAS is an OpenBLAS that kernels can call:
  `cblas.find`): a task's scores ``scale * q k^T`` come from one sgemm on the
  projections' rows in place into its (S, S) buffer (64 KB at S = 128: in L2), the key
  mask, max and exponentials (mathlib's exp32) row by row there, then ``e @ v`` from a
  second sgemm written straight into the output's token-major rows, each scaled by its
  row's 1 / sum. OpenBLAS runs at one thread meanwhile (`cblas.one_thread`).
- ``"loops"`` (`_attn_loops`, the fallback): the same in numba loops, 4 query rows a step
  over a packed k^T and v; ~1.4-2x slower at W8's shape (B 32, S 128, 12 heads of 32).

Both skip the keys after a sequence's last live one (`live_keys`: padding whose weight
is exactly 0). Neither makes a head-major array or lets anything S x S leave the task: a (B, S, H)
array whose rows have any stride (the int8 path's q, k and v are column slices of one
(B*S, 3H) GEMM output) is read through its buffer with its row stride, not copied.

The sums run in another order than the unfused chain's batched BLAS (and "blas" scales
the product, not q), so the results agree with the chain within float32 rounding (tests:
1e-5), not bit for bit. float32 only; other dtypes and empty inputs run the op's numpy
kernel.
"""
from __future__ import annotations

import os

import numpy as np
from numba import prange

from ...ops import attention as _a
from ...ops._nb import FASTMATH_IEEE, njit
from . import cblas
from .mathlib import exp32

_F32 = np.dtype(np.float32)


ROWS = 4          # query rows a step (the loops below are written for 4)


@njit(inline="always", fastmath=FASTMATH_IEEE)
def _softmax_row(sc, r, bias, b, has_bias, s):
    """sc[r] = e**(sc[r] + bias[b] - max) and returns 1 / their sum."""
    if has_bias:
        for j in range(s):
            sc[r, j] = sc[r, j] + bias[b, j]
    # the max in 8 running maxima: one compare-and-select chain does not vectorise
    # (3.5x slower on a row in L1)
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = sc[r, 0]
    j = 0
    while j + 8 <= s:
        x0, x1, x2, x3 = sc[r, j], sc[r, j + 1], sc[r, j + 2], sc[r, j + 3]
        x4, x5, x6, x7 = sc[r, j + 4], sc[r, j + 5], sc[r, j + 6], sc[r, j + 7]
        a0 = x0 if x0 > a0 else a0
        a1 = x1 if x1 > a1 else a1
        a2 = x2 if x2 > a2 else a2
        a3 = x3 if x3 > a3 else a3
        a4 = x4 if x4 > a4 else a4
        a5 = x5 if x5 > a5 else a5
        a6 = x6 if x6 > a6 else a6
        a7 = x7 if x7 > a7 else a7
        j += 8
    m = max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7)))
    while j < s:
        m = max(m, sc[r, j])
        j += 1
    tot = np.float32(0.0)
    for j in range(s):
        e = exp32(sc[r, j] - m)
        sc[r, j] = e
        tot += e
    return np.float32(1.0) / tot


@njit(cache=True, nogil=True, parallel=True, fastmath=FASTMATH_IEEE, error_model="numpy",
      boundscheck=False)
def _attn_loops(qf, ldq, kf, ldk, vf, ldv, bias, has_bias, keys, nb, s, nh, d, scale, out):
    h = nh * d
    for t in prange(nb * nh):
        b = t // nh
        col = (t - b * nh) * d
        kt = np.empty((d, s), np.float32)
        vv = np.empty((s, d), np.float32)
        qs = np.empty((ROWS, d), np.float32)
        sc = np.empty((ROWS, s), np.float32)
        acc = np.empty((ROWS, d), np.float32)
        inv = np.empty(ROWS, np.float32)
        base = b * s
        n = keys[b]
        for j in range(n):
            rk = (base + j) * ldk + col
            rv = (base + j) * ldv + col
            for c in range(d):
                kt[c, j] = kf[rk + c]
                vv[j, c] = vf[rv + c]
        for i0 in range(0, s, ROWS):
            # ROWS query rows at once: each k^T row and v row loaded serves ROWS sums
            nr = min(ROWS, s - i0)
            for r in range(ROWS):
                rq = (base + min(i0 + r, s - 1)) * ldq + col
                for c in range(d):
                    qs[r, c] = qf[rq + c] * scale
                for j in range(n):
                    sc[r, j] = np.float32(0.0)
                for c in range(d):
                    acc[r, c] = np.float32(0.0)
            for c in range(d):
                a0, a1, a2, a3 = qs[0, c], qs[1, c], qs[2, c], qs[3, c]
                for j in range(n):
                    kv = kt[c, j]
                    sc[0, j] += a0 * kv
                    sc[1, j] += a1 * kv
                    sc[2, j] += a2 * kv
                    sc[3, j] += a3 * kv
            for r in range(ROWS):
                inv[r] = _softmax_row(sc, r, bias, b, has_bias, n)
            i0_, i1_, i2_, i3_ = inv[0], inv[1], inv[2], inv[3]
            for j in range(n):
                p0, p1 = sc[0, j] * i0_, sc[1, j] * i1_
                p2, p3 = sc[2, j] * i2_, sc[3, j] * i3_
                for c in range(d):
                    w = vv[j, c]
                    acc[0, c] += p0 * w
                    acc[1, c] += p1 * w
                    acc[2, c] += p2 * w
                    acc[3, c] += p3 * w
            for r in range(nr):
                ro = (base + i0 + r) * h + col
                for c in range(d):
                    out[ro + c] = acc[r, c]


@njit(cache=True, nogil=True, parallel=True, fastmath=FASTMATH_IEEE, error_model="numpy",
      boundscheck=False)
def _attn_blas(gemm, ilp64, q0, ldq, k0, ldk, v0, ldv, bias, has_bias, keys, nb, s, nh, d,
               scale, out):
    """As `_attn_loops`, the two products by numpy's OpenBLAS (`cblas`: sgemm at address
    `gemm`, OpenBLAS at one thread: `cblas.one_thread`) on the projections' rows in place
    (addresses q0, k0, v0 with row strides ld*; `out` the (B, S, H) output, flat): a
    task's scores are scale * q k^T into its (S, S) buffer, the exponentials row by row
    there, then e @ v written to the output's token-major rows (row stride H) and each
    row scaled by its 1 / sum."""
    h = nh * d
    one, zero = np.float32(1.0), np.float32(0.0)
    o0 = np.int64(out.ctypes.data)
    for t in prange(nb * nh):
        b = t // nh
        col = (t - b * nh) * d
        base = b * s
        n = keys[b]
        sc = np.empty((s, s), np.float32)
        inv = np.empty(s, np.float32)
        pa = np.int64(sc.ctypes.data)
        qa, ka = q0 + 4 * (base * ldq + col), k0 + 4 * (base * ldk + col)
        va, oa = v0 + 4 * (base * ldv + col), o0 + 4 * (base * h + col)
        cblas.sgemm(gemm, ilp64, cblas.NO_TRANS, cblas.TRANS, s, n, d, scale, qa, ldq, ka,
                    ldk, zero, pa, s)
        for i in range(s):
            inv[i] = _softmax_row(sc, i, bias, b, has_bias, n)
        cblas.sgemm(gemm, ilp64, cblas.NO_TRANS, cblas.NO_TRANS, s, d, n, one, pa, s, va,
                    ldv, zero, oa, h)
        for i in range(s):            # 1 / sum on the d outputs of a row, not its s weights
            ro = (base + i) * h + col
            for c in range(d):
                out[ro + c] = out[ro + c] * inv[i]


def kernel_name():
    """The variant `attention` runs: "blas" where numpy's OpenBLAS can be called from the
    kernel (`cblas.find`), else "loops"; ``SAMPAN_ATTENTION_KERNEL=loops|blas`` chooses."""
    want = os.environ.get("SAMPAN_ATTENTION_KERNEL", "")
    if want == "loops" or (want != "blas" and cblas.find() is None):
        return "loops"
    if cblas.find() is None:
        raise RuntimeError("SAMPAN_ATTENTION_KERNEL=blas: numpy's BLAS is not an OpenBLAS "
                           "that numba kernels can call (sampan.backends.numba.cblas.find)")
    return "blas"


DEAD_BIAS = -1e30   # a key whose bias is at most this gets weight exp(score - 1e30 - max) = 0


def live_keys(bias, b, s):
    """Per sequence, the keys the kernels compute: up to its last key whose bias is above
    `DEAD_BIAS` (HF's mask puts float32's most negative number on padding). The keys
    after it are skipped in the products and the softmax: each one's weight is exactly 0
    in float32 (its exponent is below -1e29), so the output is what computing them gives,
    and a batch padded to its longest sequence costs what its real lengths cost. A
    sequence with no live key keeps all S (softmax over equal scores: uniform)."""
    if bias is None:
        return np.full(b, s, np.int64)
    live = ~(bias <= DEAD_BIAS)          # a NaN bias is live: it reaches the output
    last = s - np.argmax(live[:, ::-1], axis=1)
    return np.where(live.any(axis=1), last, s).astype(np.int64)


def _rows(x):
    """(a flat float32 view of x's buffer from its first element, the row stride in
    elements) for x (B, S, H) whose last dim is contiguous and whose batch stride is S
    rows; else those of a contiguous copy."""
    b, s, h = x.shape
    it = x.itemsize
    st = x.strides
    if not (st[2] == it and st[1] % it == 0 and st[1] >= h * it and st[0] == s * st[1]):
        x = np.ascontiguousarray(x)
        st = x.strides
    ld = st[1] // it
    n = (b * s - 1) * ld + h           # the last row's end: inside x's own buffer
    flat = np.lib.stride_tricks.as_strided(x, shape=(n,), strides=(it,), writeable=False)
    return flat, ld


def attention(q, k, v, bias=None, heads=1, scale=1.0):
    """The op's numba kernel (float32); else its numpy kernel."""
    _a._rule(q, k, v, bias, heads=heads, scale=scale)   # shapes checked before the loop
    if q.dtype != _F32 or q.size == 0:
        return _a.attention_reference(q, k, v, bias, heads=heads, scale=scale)
    b, s, h = q.shape
    qf, ldq = _rows(q)
    kf, ldk = _rows(k)
    vf, ldv = _rows(v)
    if bias is None:
        bm = np.zeros((1, 1), _F32)
    else:
        bm = np.ascontiguousarray(bias).reshape(b, s)
    keys = live_keys(bm if bias is not None else None, b, s)
    out = np.empty((b, s, h), _F32)
    nh, d = int(heads), h // int(heads)
    if kernel_name() == "blas":
        lib = cblas.find()
        with cblas.one_thread():
            _attn_blas(np.int64(lib.sgemm), lib.ilp64, np.int64(qf.ctypes.data), ldq,
                       np.int64(kf.ctypes.data), ldk, np.int64(vf.ctypes.data), ldv, bm,
                       bias is not None, keys, b, s, nh, d, np.float32(scale),
                       out.reshape(-1))
    else:
        _attn_loops(qf, ldq, kf, ldk, vf, ldv, bm, bias is not None, keys, b, s, nh, d,
                    np.float32(scale), out.reshape(-1))
    return out


KERNELS = {"attention": attention}
