"""The numba provider's kernel of `qdense_dynamic` (dynamic int8, issue 31): the
activations quantised per row to uint8 (`_row_quant`, the same float32 arithmetic as the
op table's `ops.quant_fused.row_qparams`), the int8 weight packed once, and the int32
sums finished in the VNNI kernel's epilogue with each row's zero point and scale
(`vnni.packed_kernel(True, False, dyn=True)`).
"""
from __future__ import annotations

import numpy as np

from ...ops._nb import HAVE_NUMBA, njit
from ...ops.registry import OPS
from . import vnni
from .qlayers import Dense, _consts, _fits, _packed, _ptr, _run_parts, _split


if HAVE_NUMBA:
    @njit(cache=True, nogil=True, boundscheck=False)
    def _row_quant(x, out, scale, zp):
        """Each row of x (M, K) float32 to uint8 with its own scale and zero point
        (`ops.quant_fused.row_qparams`, the same float32 arithmetic)."""
        m, k = x.shape
        for i in range(m):
            lo = np.float32(0)
            hi = np.float32(0)
            for j in range(k):
                v = x[i, j]
                lo = v if v < lo else lo
                hi = v if v > hi else hi
            s = (hi - lo) / np.float32(255)
            if not s > 0:
                s = np.float32(1)
            z = np.rint(-lo / s)
            z = 0.0 if z < 0 else (255.0 if z > 255 else z)
            scale[i] = s
            zp[i] = np.int32(z)
            for j in range(k):
                q = np.rint(x[i, j] / s) + z
                q = 0.0 if q < 0 else (255.0 if q > 255 else q)
                out[i, j] = np.uint8(q)


class DynamicDense(Dense):
    """A dense layer with int8 weights whose activations are quantised per row when it
    runs (`qdense_dynamic`)."""

    def __init__(self, w, w_scale):
        super().__init__(w)
        width = self.nb * 16
        self.cs = np.zeros(width, np.int32)
        self.cs[:self.n] = self.colsum[:self.n]
        self.ws = np.zeros(width, np.float32)
        self.ws[:self.n] = w_scale

    def run_dynamic(self, x):
        m = x.shape[0]
        need = 4 * self.k4
        xq = np.zeros((m, need), np.uint8) if need != self.k else np.empty((m, need),
                                                                             np.uint8)
        sx, zx = np.empty(m, np.float32), np.empty(m, np.int32)
        _row_quant(np.ascontiguousarray(x, np.float32), xq[:, :self.k] if need != self.k
                   else xq, sx, zx)
        ldo = self.nb * 16
        out = np.empty((m, ldo), np.float32)
        f = vnni.packed_kernel(True, False, True)
        kstep = self.k4 * 64

        def part(j0, j1):
            f(_ptr(self.wp) + j0 * kstep, _ptr(xq), _ptr(out) + j0 * 64,
              _ptr(self.cs) + j0 * 64, _ptr(self.ws) + j0 * 64, 1, 0, 0, m, need, self.k4,
              j1 - j0, ldo, _ptr(zx), _ptr(sx), 0)
        if m:
            _run_parts(part, _split(self.nb, m * ldo * need, self.nb))
        return out if self.n == ldo else out[:, :self.n]


def _dyn_ok(x, w):
    return (HAVE_NUMBA and vnni.packed_kernel(True, False, True) is not None
            and _fits(w.shape[1], 0) and x.ndim == 2)


def qdense_dynamic(x, w, w_scale):
    if not _dyn_ok(x, w):
        return OPS["qdense_dynamic"].kernels["numpy"](x, w, w_scale)
    return DynamicDense(w, w_scale).run_dynamic(x)


def _bind_dynamic(node):
    c = _consts(node)
    if c[1] is None or c[2] is None or not _dyn_ok(np.empty((0, 0)), c[1]):
        return qdense_dynamic
    d = _packed(c[1], lambda w: DynamicDense(w, c[2]), "dynamic")

    def run(x, w, w_scale):
        if x.ndim != 2 or x.shape[1] != d.k or x.dtype != np.float32:
            return qdense_dynamic(x, w, w_scale)
        return d.run_dynamic(x)
    return run


KERNELS = {"qdense_dynamic": qdense_dynamic}
BINDERS = {"qdense_dynamic": _bind_dynamic}
