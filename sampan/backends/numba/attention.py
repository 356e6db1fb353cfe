"""The numba kernel of `attention` (ops/attention.py): masked multi-head self-attention,
one (sequence, head) pair a task, the pairs split over numba's threads (`prange`).

A task copies its head's k^T (d, S) and v (S, d) once into arrays of its own (16 KB each
for MiniLM's d = 32, S = 128: they stay in L1/L2 for all S queries), then for each query
row makes the S scores in one row buffer (``(q * scale) @ k^T``, vectorised over the keys),
adds the key mask, takes the row's max, exponentials (mathlib's exp32, as the softmax's
numba loop), the sum and 1 / sum, and accumulates ``p @ v`` into d sums that it writes
to the output's token-major row. Nothing S x S leaves the task, and q, k and v are read
in place from the projections' rows: a (B, S, H) array whose rows have any stride (the
int8 path's q, k and v are column slices of one (B*S, 3H) GEMM output) is read through a
flat view of its buffer with its row stride, not copied.

Each score is the unfused chain's: q scaled first, the bias added to the finished sum,
p = e * (1 / sum); the sums run in this loop's order, not BLAS's, so the results agree
with the unfused chain within float32 rounding (tests: 1e-5), not bit for bit.
float32 only; other dtypes and empty inputs run the op's numpy kernel.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from ...ops import attention as _a
from ...ops._nb import FASTMATH_IEEE, njit
from .mathlib import exp32

_F32 = np.dtype(np.float32)


ROWS = 4          # query rows a step (the loops below are written for 4)


@njit(inline="always", fastmath=FASTMATH_IEEE)
def _softmax_row(sc, r, bias, b, has_bias, s):
    """sc[r] = e**(sc[r] + bias[b] - max) and returns 1 / their sum."""
    if has_bias:
        for j in range(s):
            sc[r, j] = sc[r, j] + bias[b, j]
    m = sc[r, 0]
    for j in range(1, s):
        x = sc[r, j]
        m = x if x > m else m
    tot = np.float32(0.0)
    for j in range(s):
        e = exp32(sc[r, j] - m)
        sc[r, j] = e
        tot += e
    return np.float32(1.0) / tot


@njit(cache=True, nogil=True, parallel=True, fastmath=FASTMATH_IEEE, error_model="numpy",
      boundscheck=False)
def _attn(qf, ldq, kf, ldk, vf, ldv, bias, has_bias, nb, s, nh, d, scale, out):
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
        for j in range(s):
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
                for j in range(s):
                    sc[r, j] = np.float32(0.0)
                for c in range(d):
                    acc[r, c] = np.float32(0.0)
            for c in range(d):
                a0, a1, a2, a3 = qs[0, c], qs[1, c], qs[2, c], qs[3, c]
                for j in range(s):
                    kv = kt[c, j]
                    sc[0, j] += a0 * kv
                    sc[1, j] += a1 * kv
                    sc[2, j] += a2 * kv
                    sc[3, j] += a3 * kv
            for r in range(ROWS):
                inv[r] = _softmax_row(sc, r, bias, b, has_bias, s)
            i0_, i1_, i2_, i3_ = inv[0], inv[1], inv[2], inv[3]
            for j in range(s):
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
    out = np.empty((b, s, h), _F32)
    _attn(qf, ldq, kf, ldk, vf, ldv, bm, bias is not None, b, s, int(heads), h // int(heads),
          np.float32(scale), out.reshape(-1))
    return out


KERNELS = {"attention": attention}
