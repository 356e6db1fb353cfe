"""The numba provider's kernel of `qdense_dynamic` (dynamic int8, issue 31): the
activations quantised per row to uint8 (`_row_quant`, the same float32 arithmetic as the
op table's `ops.quant_fused.row_qparams`), the int8 weight packed once, and the int32
sums finished with each row's zero point and scale (and the optional bias). Two layers
give the same bytes:

- `DynamicDense`: the VNNI kernel, its epilogue and bias inside
  (`vnni.packed_kernel(True, False, dyn=1 or 2)`), over blocks of rows that sampan's
  threads claim, each quantised (`quant_rows`: `simdrows.quant_kernel` on AVX-512) and
  multiplied by the whole weight while its bytes are in the core's cache;
- `OneDNNDense`: oneDNN's int8 GEMM (`onednn.int8.WeightGemm`, the weight reordered once;
  AMX tiles on Sapphire Rapids and later), over blocks of rows that sampan's threads
  claim, each quantised, multiplied and finished (`_finish_one`) while its sums are in L2.

A bound node (`_bind_dynamic`) races the two on its first call of each size class and
keeps the faster; eager calls run the VNNI layer.
"""
from __future__ import annotations

import numpy as np

from ...ops._nb import HAVE_NUMBA, njit
from ...ops.quant_fused import with_bias
from ...ops.registry import OPS
from . import simdrows, vnni
from .claim import run_claimed, threads
from .qlayers import _BIG, Dense, _consts, _fits, _packed, _ptr


if HAVE_NUMBA:
    from numba import prange

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


    def _quant_body(x, lo_r, hi_r, out, scale, zp):
        """Each row of x to uint8 given its range [lo_r, hi_r] (with 0): `_row_quant`'s
        float32 arithmetic after the range."""
        m, k = x.shape
        for i in prange(m):
            lo = min(lo_r[i], np.float32(0))
            hi = max(hi_r[i], np.float32(0))
            s = (hi - lo) / np.float32(255)
            if not s > 0:
                s = np.float32(1)
            z = np.rint(-lo / s)
            z = min(max(z, np.float32(0)), np.float32(255))
            scale[i] = s
            zp[i] = np.int32(z)
            for j in range(k):
                q = np.rint(x[i, j] / s) + z
                out[i, j] = np.uint8(np.int32(min(max(q, np.float32(0)), np.float32(255))))

    _quant_one = njit(cache=True, nogil=True, boundscheck=False)(_quant_body)

    def _finish_body(acc, colsum, w_scale, scale, zp, bias, has_bias, out):
        """out = float32(acc - zp[r] * colsum) * scale[r] * w_scale (+ bias) (the op's
        epilogue, its float32 operations in its order)."""
        m, n = acc.shape
        for i in prange(m):
            z = zp[i]
            s = scale[i]
            if has_bias:
                for j in range(n):
                    out[i, j] = np.float32(acc[i, j] - z * colsum[j]) * s * w_scale[j] + bias[j]
            else:
                for j in range(n):
                    out[i, j] = np.float32(acc[i, j] - z * colsum[j]) * s * w_scale[j]

    _finish_one = njit(cache=True, nogil=True, boundscheck=False)(_finish_body)


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

    def run_dynamic(self, x, bias=None):
        """Blocks of rows that sampan's threads claim (`claim.run_claimed`), each
        quantised and multiplied by the whole weight while its bytes are in the core's
        cache, the epilogue and bias in the kernel; fewer row blocks than threads (a
        few rows): the rows quantised once and the weight's columns split instead."""
        m = x.shape[0]
        need, ldo = 4 * self.k4, self.nb * 16
        out = np.empty((m, ldo), np.float32)
        if m == 0:
            return out[:, :self.n]
        x = np.ascontiguousarray(x, np.float32)
        xq = np.empty((m, need), np.uint8)
        if need != self.k:
            xq[:, self.k:] = 0
        sx, zx = np.empty(m, np.float32), np.empty(m, np.int32)
        bv, post = self._bias(bias)
        f = vnni.packed_kernel(True, False, 1 if bv is None else 2)
        bp = 0 if bv is None else _ptr(bv)
        parts = threads() if m * ldo * need >= _BIG else 1
        rows = max(_ROWS_MIN, -(-m // (_PER_THREAD * parts * 16)) * 16)
        nblk = -(-m // rows)
        xqk = xq if need == self.k else xq[:, :self.k]
        wp, xp, op, cs, ws = _ptr(self.wp), _ptr(xq), _ptr(out), _ptr(self.cs), _ptr(self.ws)
        zp, sp = _ptr(zx), _ptr(sx)

        def call(r0, r1, j0, j1):
            f(wp + j0 * self.k4 * 64, xp + r0 * need, op + (r0 * ldo + j0 * 16) * 4,
              cs + j0 * 64, ws + j0 * 64, 1, 0, 0, r1 - r0, need, self.k4, j1 - j0, ldo,
              zp + 4 * r0, sp + 4 * r0, bp + j0 * 64 if bp else 0)
        if nblk >= parts:
            def block(i, t):
                r0, r1 = i * rows, min(m, (i + 1) * rows)
                quant_rows(x[r0:r1], xqk[r0:r1], sx[r0:r1], zx[r0:r1])
                call(r0, r1, 0, self.nb)
            run_claimed(nblk, block, parts)
        else:
            quant_rows(x, xqk, sx, zx)
            cuts = [self.nb * i // parts for i in range(parts + 1)]
            run_claimed(parts, lambda i, t: call(0, m, cuts[i], cuts[i + 1]), parts)
        out = out if self.n == ldo else out[:, :self.n]
        return out if post is None else with_bias(out, post)

    def _bias(self, bias):
        """(bias padded to the kernel's width, or None; a bias the kernel cannot add,
        for `with_bias` after it)."""
        if bias is None:
            return None, None
        if bias.dtype != np.float32 or bias.shape != (self.n,):
            return None, bias
        bv = np.zeros(self.nb * 16, np.float32)
        bv[:self.n] = bias
        return bv, None


_ROWS_MIN = 64            # rows per block of DynamicDense (a block's call costs ~10 us)
_PER_THREAD = 4           # blocks per thread, for a busy machine's uneven threads


class OneDNNDense:
    """The same layer on oneDNN's int8 GEMM (`onednn.int8.WeightGemm`: the weight
    reordered once into its kernel's layout, AMX tiles where the CPU has them): the rows
    quantised by `_row_quant`, the exact int32 sums from oneDNN, the epilogue in
    `_finish_one`. Raises `Unsupported` where oneDNN has no int8 matmul."""

    def __init__(self, w, w_scale):
        from ..onednn import int8 as _i8
        self.gemm = _i8.WeightGemm(w)
        self.n, self.k = w.shape
        self.cs = w.astype(np.int32).sum(1, dtype=np.int32)
        self.ws = np.ascontiguousarray(w_scale, np.float32)

    def run_dynamic(self, x, bias=None):
        m = x.shape[0]
        x = np.ascontiguousarray(x, np.float32)
        xq = np.empty((m, self.k), np.uint8)
        sx, zx = np.empty(m, np.float32), np.empty(m, np.int32)
        out = np.empty((m, self.n), np.float32)
        b = self.ws if bias is None else np.ascontiguousarray(bias, np.float32)
        # blocks of rows whose int32 sums (~1 MB) stay in the core's L2 between the GEMM
        # and the epilogue (W8's (4096, 1536) sums through memory, and a fresh 25 MB
        # buffer's page faults, cost more than the AMX GEMM itself); sampan's threads
        # claim blocks one at a time, each quantising, multiplying (oneDNN alone on that
        # thread) and finishing its own: one hand-off a call, not an OpenMP region per
        # block, and a helper thread that starts late (a busy machine) finds the blocks
        # done by the others instead of being waited for
        rows = max(32, (_BLOCK // max(self.n, 1)) // 32 * 32)
        nblk = -(-m // rows)
        parts = min(nblk, threads()) if m * self.k >= _PAR_MIN else 1
        has_b = bias is not None
        if m == 0:
            return out
        accs = {}

        def block(i, t):
            acc = accs.get(t)
            if acc is None:
                acc = accs[t] = np.empty((min(rows, m), self.n), np.int32)
            r0, r1 = i * rows, min(m, (i + 1) * rows)
            q = xq[r0:r1]
            quant_rows(x[r0:r1], q, sx[r0:r1], zx[r0:r1])
            a = acc[:r1 - r0]
            self.gemm.run(q, a, t)
            _finish_one(a, self.cs, self.ws, sx[r0:r1], zx[r0:r1], b, has_b, out[r0:r1])
        from ..onednn.int8 import one_thread
        run_claimed(nblk, block, parts, lambda t: one_thread())
        return out


_PAR_MIN = 1 << 16        # elements from which OneDNNDense shares blocks over threads
_BLOCK = 256 * 1024       # int32 sums per block of rows (OneDNNDense)


def quant_rows(x, out, scale, zp):
    """`_row_quant`'s bytes: on AVX-512, `simdrows.quant_kernel` (x's rows contiguous, out's
    rows at any stride); otherwise each row's range by numpy's SIMD min/max reductions
    (numba's loop does not vectorise them: 4x slower on W8's rows), then the rows
    quantised (the caller shares blocks of rows over threads). A NaN row quantises to
    what the loop's would not, as no NaN is given a meaning by the op."""
    m, k = x.shape
    f = simdrows.quant_kernel()
    if (f is not None and x.dtype == np.float32 and x.flags.c_contiguous
            and out.strides[1] == 1 and scale.flags.c_contiguous and zp.flags.c_contiguous
            and scale.dtype == np.float32 and zp.dtype == np.int32):
        if m:
            f(_ptr(x), k, m, k, _ptr(out), out.strides[0] if m > 1 else k, _ptr(scale),
              _ptr(zp))
        return
    if k == 0:
        _row_quant(x, out, scale, zp)
        return
    lo = np.min(x, axis=1)
    hi = np.max(x, axis=1)
    _quant_one(x, lo, hi, out, scale, zp)


def _onednn_layer(w, w_scale):
    """An `OneDNNDense` of w, or None (no oneDNN, no int8 matmul, sums past int32)."""
    if not (HAVE_NUMBA and _fits(w.shape[1], 0)):
        return None
    from ..onednn import available
    from ..onednn.primitives import Unsupported
    if not available():
        return None
    try:
        layer = OneDNNDense(w, w_scale)
        layer.gemm.impl(1)           # builds a primitive: refuses here, not per call
        return layer
    except (Unsupported, Exception):  # noqa: BLE001 - a oneDNN that refuses: the other kernels
        return None


def _race(layers, x, bias, reps=2):
    """The layer that ran x fastest here (each run once to warm up, then `reps` timed):
    the kernels give the same bytes, so the choice moves no number."""
    import time
    best, best_t = layers[0], None
    for layer in layers:
        layer.run_dynamic(x, bias)
        t = min(_timed(layer, x, bias) for _ in range(reps))
        if best_t is None or t < best_t:
            best, best_t = layer, t
    return best


def _timed(layer, x, bias):
    import time
    t = time.perf_counter()
    layer.run_dynamic(x, bias)
    return time.perf_counter() - t


def _dyn_ok(x, w):
    return (HAVE_NUMBA and vnni.packed_kernel(True, False, True) is not None
            and _fits(w.shape[1], 0) and x.ndim == 2)


def qdense_dynamic(x, w, w_scale, bias=None):
    if not _dyn_ok(x, w) or (bias is not None and bias.dtype != np.float32):
        extra = () if bias is None else (bias,)
        return OPS["qdense_dynamic"].kernels["numpy"](x, w, w_scale, *extra)
    return DynamicDense(w, w_scale).run_dynamic(x, bias)


def _bind_dynamic(node):
    """The layer of a constant weight, packed once: the VNNI kernel's and oneDNN's (where
    both exist, raced on the first call of each size class of M, power-of-two buckets,
    and the faster kept for that class)."""
    c = _consts(node)
    if c[1] is None or c[2] is None or (len(c) > 3 and c[3] is None):
        return qdense_dynamic
    layers = []
    if _dyn_ok(np.empty((0, 0)), c[1]):
        layers.append(_packed(c[1], lambda w: DynamicDense(w, c[2]), "dynamic"))
    dn = _packed(c[1], lambda w: _onednn_layer(w, c[2]), "dynamic-onednn")
    if dn is not None:
        layers.append(dn)
    if not layers:
        return qdense_dynamic
    k = c[1].shape[1]
    bias = c[3] if len(c) > 3 else None
    chosen: dict = {}

    def run(x, w, w_scale, *_bias):
        if x.ndim != 2 or x.shape[1] != k or x.dtype != np.float32:
            return qdense_dynamic(x, w, w_scale, bias)
        m = x.shape[0]
        b = m.bit_length()
        layer = chosen.get(b)
        if layer is None:
            layer = chosen[b] = (layers[0] if len(layers) == 1 or m == 0 else
                                 _race(layers, x, bias))
        return layer.run_dynamic(x, bias)
    run.layers = layers
    run.chosen = chosen
    return run


KERNELS = {"qdense_dynamic": qdense_dynamic}
BINDERS = {"qdense_dynamic": _bind_dynamic}
