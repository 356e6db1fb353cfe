"""Fast numpy kernels of the requantising int8 ops (`quant_fused.py`), bit for bit equal to
the exact reference (`_qref.sums` + `_qref.requant`): the numpy runtime's kernels.

The int8/uint8 operands, less their zero points, are small integers that float32 holds
exactly, so a float32 BLAS GEMM gives the exact sums as long as no partial sum can reach
2^24. Any partial sum, in whatever order BLAS adds (FMA included), is a sum of a subset of
the K products of one output, so its magnitude is at most

    K * A * B,   A = max |x - xz| (from x's dtype and xz),  B = max |w - wz[n]| (measured)

and every value the GEMM forms is an integer below 2^24: exact. Adding the int32 bias in
float32 is exact too when K*A*B + max|bias| < 2^24; then float32(acc + bias) * m is the
reference's float32 product, rint is half to even in both, and adding the output zero
point in float32 before clamping changes nothing (|rint(v)| < 2^24 adds exactly, a larger
one saturates the same way). Otherwise the sums run in float64 (exact below 2^53: K below
2^37) and the bias is added in float64 before the one rounding to float32, as the
reference does. A non-finite multiplier runs the reference itself.

`Layer` holds what is prepared once per weight (the float weight less its zero points,
its bound B, its row sums for the dynamic op); a served program prepares it when the node
is bound (`bind`), an eager call per call.
"""
from __future__ import annotations

import numpy as np

from . import _qref

_EXACT = 1 << 24         # float32 holds every integer below this exactly
_F32, _F64 = np.float32, np.float64


def act_bound(dtype, zp) -> int:
    """max |x - zp| over every value of an int8 / uint8 dtype."""
    lo, hi = (0, 255) if np.dtype(dtype) == np.uint8 else (-128, 127)
    return max(abs(lo - int(zp)), abs(hi - int(zp)))


class Weight:
    """An int8 weight (N, K) less its zero points (one per row), for BLAS: float32 rows,
    float64 made when first needed, the bound B = max |w - wz| and the row sums."""

    __slots__ = ("k", "bmax", "w32", "_w64", "rowsum")

    def __init__(self, w, wz):
        n, k = w.shape
        zb = np.broadcast_to(np.asarray(wz, np.int32).reshape(-1), (n,))
        d = w.astype(np.int32)
        if np.any(zb):
            d -= zb[:, None]
        self.k = k
        self.bmax = int(np.abs(d).max()) if d.size else 0
        self.w32 = np.ascontiguousarray(d, _F32)
        self._w64 = None
        self.rowsum = d.sum(1, dtype=np.int64)

    def w64(self):
        if self._w64 is None:
            self._w64 = self.w32.astype(_F64)
        return self._w64


class Epilogue:
    """The per-channel finish of a layer: int32 bias, float32 multiplier, output zero
    point and [qmin, qmax] (out_dtype float32: no rounding, no zero point)."""

    __slots__ = ("bias", "bmax", "mult", "zy", "lo", "hi", "out", "finite", "_shaped")

    def __init__(self, bias, mult, zy, lo, hi, out_dtype):
        self.bias = np.asarray(bias, np.int64)
        self.bmax = int(np.abs(self.bias).max()) if self.bias.size else 0
        self.mult = np.asarray(mult, _F32)
        self.finite = bool(np.isfinite(self.mult).all())
        self.zy, self.lo, self.hi, self.out = int(zy), lo, hi, np.dtype(out_dtype)
        self._shaped = {}

    def _vectors(self, ndim, axis):
        """(bias float32, bias float64, mult) shaped to broadcast along `axis`."""
        key = (ndim, axis)
        hit = self._shaped.get(key)
        if hit is None:
            shape = [1] * ndim
            shape[axis] = -1
            hit = self._shaped[key] = (self.bias.astype(_F32).reshape(shape),
                                       self.bias.astype(_F64).reshape(shape),
                                       self.mult.reshape(shape))
        return hit

    def finish(self, acc, exact32, axis):
        """acc (float32 when `exact32`: exact integers with |acc| + max|bias| < 2^24,
        else float64) finished as `_qref.requant` does."""
        b32, b64, m = self._vectors(acc.ndim, axis)
        if exact32:
            v = acc + b32
        else:
            v = (acc + b64).astype(_F32)
        v *= m
        if self.out == np.float32:
            return v
        np.rint(v, out=v)
        if self.zy:
            v += _F32(self.zy)
        np.maximum(v, _F32(self.lo), out=v)
        np.minimum(v, _F32(self.hi), out=v)
        return v.astype(self.out)


def _operand(x, xz, f):
    a = x.astype(f)
    if xz:
        a -= f(xz)
    return a


def dense(x, xz, wt: Weight, ep: Epilogue):
    """qlinear_dense / qdense over x (M, K) int8 or uint8, bit for bit `_qref`'s."""
    big = wt.k * act_bound(x.dtype, xz) * wt.bmax
    if big < _EXACT:
        acc = _operand(x, xz, _F32) @ wt.w32.T
    else:
        acc = _operand(x, xz, _F64) @ wt.w64().T
    return ep.finish(acc, big + ep.bmax < _EXACT, -1)


def _windows(x, xz, kh, kw, stride, padding, dilation):
    """(float32 image less xz, padded with zeros, as windows (N, C, kh, kw, Ho, Wo))."""
    n, c, h, wd = x.shape
    (s0, s1), (p0, p1), (d0, d1) = stride, padding, dilation
    ho = (h + 2 * p0 - d0 * (kh - 1) - 1) // s0 + 1
    wo = (wd + 2 * p1 - d1 * (kw - 1) - 1) // s1 + 1
    if p0 or p1:
        buf = np.zeros((n, c, h + 2 * p0, wd + 2 * p1), _F32)
        inner = buf[:, :, p0:p0 + h, p1:p1 + wd]
        inner[...] = x
        if xz:
            inner -= _F32(xz)
    else:
        buf = _operand(x, xz, _F32)
    sn, sc, sh, sw = buf.strides
    return np.lib.stride_tricks.as_strided(
        buf, (n, c, kh, kw, ho, wo), (sn, sc, sh * d0, sw * d1, sh * s0, sw * s1),
        writeable=False), ho, wo


def conv(x, xz, groups_w, ep: Epilogue, kh, kw, stride, padding, dilation):
    """qlinear_conv2d over x (N, C, H, W): `groups_w` one `Weight` (O/g, C/g*kh*kw) per
    group; bit for bit `_qref.conv_sums` + `_qref.requant`."""
    k = groups_w[0].k
    big = k * act_bound(x.dtype, xz) * max(g.bmax for g in groups_w)
    if big >= _EXACT:
        return None
    v, ho, wo = _windows(x, xz, kh, kw, stride, padding, dilation)
    n = x.shape[0]
    cg = v.shape[1] // len(groups_w)
    outs = []
    for gi, wt in enumerate(groups_w):
        cols = v[:, gi * cg:(gi + 1) * cg].reshape(n, k, ho * wo)
        outs.append(np.matmul(wt.w32, cols))
    acc = outs[0] if len(outs) == 1 else np.concatenate(outs, axis=1)
    o = sum(wt.w32.shape[0] for wt in groups_w)
    return ep.finish(acc, big + ep.bmax < _EXACT, 1).reshape(n, o, ho, wo)


def conv_weights(w, wz, groups):
    """One `Weight` per group of a conv weight (O, C/g, kh, kw)."""
    o = w.shape[0]
    og = o // groups
    flat = w.reshape(o, -1)
    zb = np.broadcast_to(np.asarray(wz).reshape(-1), (o,))
    return [Weight(flat[g * og:(g + 1) * og], zb[g * og:(g + 1) * og]) for g in range(groups)]


def dynamic(x, wt: Weight, w_scale, row_qparams):
    """qdense_dynamic: x (M, K) float32 quantised per row (`row_qparams`), bit for bit
    the reference's sums less z * rowsum(w), times the row scale and w_scale."""
    q, s, z = row_qparams(x)
    big = wt.k * 255 * wt.bmax
    if big < _EXACT:
        acc = (q.astype(_F32) @ wt.w32.T).astype(_F64)
    else:
        acc = q.astype(_F64) @ wt.w64().T
    acc -= z[:, None].astype(_F64) * wt.rowsum[None, :].astype(_F64)
    return (acc.astype(_F32) * s[:, None]) * w_scale[None, :]


def requant_ref(acc, ep: Epilogue, axis):
    """The reference finish (for a non-finite multiplier)."""
    return _qref.requant(acc, ep.bias, ep.mult, ep.zy, ep.lo, ep.hi, ep.out, axis=axis)
