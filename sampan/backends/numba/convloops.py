"""numba loops for the data movement around convolution GEMMs: im2col and col2im.

The arithmetic of conv2d stays in BLAS (one batched GEMM per call), except the weight
gradient of tiny convolutions (weight_grad_dots, last below). What these loops replace
is the numpy data movement around it, which dominated small convolutions:
- im2col through a strided window view made contiguous cost 0.65-0.78 ms for LeNet's
  layers at batch 64; the loop below writes the same columns in 0.13 ms;
- the input gradient accumulated kh*kw strided slices into the output (25 numpy calls,
  each a pass over the output): 3-4 ms, against ~0.2 ms for one scatter loop over each
  output plane.
Measured directly against the GEMM, a direct (im2col-free) convolution loop lost on
every LeNet layer: rows of 10-28 pixels are too short for the compiler's vector loops.
The loops run serially: in the W2 training step a parallel version was no faster (numba's
OpenMP workers and OpenBLAS's threads spin-wait for the same two cores; some runs were 2x
slower), and a serial loop is safe to call from any thread.

`HAVE_NUMBA` false means callers keep their numpy path.
"""
from __future__ import annotations

import numpy as np

from ...ops._nb import HAVE_NUMBA, njit

if HAVE_NUMBA:

    # Only stride 1 and dilation 1 (most convolutions): every index below is a sum of
    # loop counters, which LLVM can prove non-negative, so numba's negative-index
    # wraparound check drops out and the row copies vectorise. Multiplying a counter by a
    # runtime stride kept the check in the inner loop and ran 6x slower; other strides
    # and dilations take the unsigned-offset loops further down.

    @njit(cache=True, nogil=True)
    def im2col(xp, kh, kw, ho, wo, col):
        """col[b, (c*kh + i)*kw + j, y*wo + x] = xp[b, c, y + i, x + j] for a padded
        input xp (N, C, Hp, Wp) and col (N, C*kh*kw, ho*wo)."""
        n, c = xp.shape[0], xp.shape[1]
        for p in range(n * c):
            b = p // c
            ci = p % c
            for ki in range(kh):
                for kj in range(kw):
                    k = (ci * kh + ki) * kw + kj
                    for y in range(ho):
                        for x in range(wo):
                            col[b, k, y * wo + x] = xp[b, ci, y + ki, x + kj]

    @njit(cache=True, nogil=True)
    def col2im(col, h, wd, kh, kw, buf):
        """The adjoint of im2col: buf (N, C, h + kh - 1, wd + kw - 1), zeroed here, gets
        buf[b, c, y + i, x + j] += col[b, (c*kh + i)*kw + j, y*wd + x]; the caller crops
        the padding."""
        n, c, hb, wb = buf.shape
        for p in range(n * c):
            b = p // c
            ci = p % c
            for y in range(hb):
                for x in range(wb):
                    buf[b, ci, y, x] = 0
            for ki in range(kh):
                for kj in range(kw):
                    k = (ci * kh + ki) * kw + kj
                    for y in range(h):
                        for x in range(wd):
                            buf[b, ci, y + ki, x + kj] += col[b, k, y * wd + x]

    # The same copies for the one-GEMM layout (loops/conv.py's `_one_gemm`): columns (C*kh*kw,
    # N*ho*wo), every sample's pixels side by side in a row, so one GEMM serves the batch.
    # The indices are unsigned flat offsets (products of sizes), which numba indexes
    # without the wraparound check; signed ones kept it and ran ~3x slower.
    _U = np.uint64

    @njit(cache=True, nogil=True)
    def im2col_rows(xp, kh, kw, ho, wo, col):
        """col[(c*kh + i)*kw + j, (b*ho + y)*wo + x] = xp[b, c, y + i, x + j]."""
        n, c, hp, wp = xp.shape
        n, c, hp, wp = _U(n), _U(c), _U(hp), _U(wp)
        kh, kw, ho, wo = _U(kh), _U(kw), _U(ho), _U(wo)
        xf = xp.ravel()
        cf = col.ravel()
        o = _U(0)
        for ci in range(c):
            for ki in range(kh):
                for kj in range(kw):
                    for b in range(n):
                        base = (b * c + ci) * hp * wp + ki * wp + kj
                        for y in range(ho):
                            s = base + y * wp
                            for x in range(wo):
                                cf[o + x] = xf[s + x]
                            o += wo

    @njit(cache=True, nogil=True)
    def col2im_rows(col, h, wd, kh, kw, buf):
        """The adjoint of im2col_rows into buf (N, C, h + kh - 1, wd + kw - 1), zeroed
        here; the caller crops the padding."""
        n, c, hb, wb = buf.shape
        n, c, hb, wb = _U(n), _U(c), _U(hb), _U(wb)
        h, wd, kh, kw = _U(h), _U(wd), _U(kh), _U(kw)
        cf = col.ravel()
        bf = buf.ravel()
        npix = h * wd
        for t in range(n * c * hb * wb):
            bf[t] = 0
        for ci in range(c):
            for ki in range(kh):
                for kj in range(kw):
                    row = ((ci * kh + ki) * kw + kj) * n * npix
                    for b in range(n):
                        d0 = (b * c + ci) * hb * wb + ki * wb + kj
                        s0 = row + b * npix
                        for y in range(h):
                            d = d0 + y * wb
                            s = s0 + y * wd
                            for x in range(wd):
                                bf[d + x] += cf[s + x]

    # Other strides and dilations: the same copies with unsigned flat offsets (numba
    # indexes them without the wraparound check); the strided reads and writes stay
    # scalar. For a stride-2 3x3 layer (64 channels of 56x56, batch 16) the input
    # gradient's 9 strided numpy additions took 53 ms of its 79 ms.

    @njit(cache=True, nogil=True)
    def im2col_strided(xp, kh, kw, ho, wo, sh, sw, dh, dw, col):
        """col[b, (c*kh + i)*kw + j, y*wo + x] = xp[b, c, y*sh + i*dh, x*sw + j*dw]."""
        n, c, hp, wp = xp.shape
        n, c, hp, wp = _U(n), _U(c), _U(hp), _U(wp)
        kh, kw, ho, wo = _U(kh), _U(kw), _U(ho), _U(wo)
        sh, sw, dh, dw = _U(sh), _U(sw), _U(dh), _U(dw)
        xf = xp.ravel()
        cf = col.ravel()
        o = _U(0)
        for p in range(n * c):
            plane = p * hp * wp
            for ki in range(kh):
                for kj in range(kw):
                    base = plane + ki * dh * wp + kj * dw
                    for y in range(ho):
                        s = base + y * sh * wp
                        for x in range(wo):
                            cf[o + x] = xf[s + x * sw]
                        o += wo

    @njit(cache=True, nogil=True)
    def col2im_strided(col, h, wd, kh, kw, sh, sw, dh, dw, buf):
        """The adjoint of im2col_strided into buf (N, C, Hb, Wb), zeroed here:
        buf[b, c, y*sh + i*dh, x*sw + j*dw] += col[b, (c*kh + i)*kw + j, y*wd + x]."""
        n, c, hb, wb = buf.shape
        n, c, hb, wb = _U(n), _U(c), _U(hb), _U(wb)
        h, wd, kh, kw = _U(h), _U(wd), _U(kh), _U(kw)
        sh, sw, dh, dw = _U(sh), _U(sw), _U(dh), _U(dw)
        cf = col.ravel()
        bf = buf.ravel()
        for t in range(n * c * hb * wb):
            bf[t] = 0
        o = _U(0)
        for p in range(n * c):
            plane = p * hb * wb
            for ki in range(kh):
                for kj in range(kw):
                    base = plane + ki * dh * wb + kj * dw
                    for y in range(h):
                        d = base + y * sh * wb
                        for x in range(wd):
                            bf[d + x * sw] += cf[o + x]
                        o += wd

    @njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz"})
    def weight_grad_dots(g, col, zero, out):
        """out[o, k] = sum over b, p of g[b, o, p] * col[k, b*P + p], g (N, O, P) and col
        (C*kh*kw, N*P) from im2col_rows: a weight gradient with few outputs (O*K) and a
        long reduction, which BLAS runs poorly; each image's slice of g and col stays in
        cache across its O*K dot products (conv.py uses it for small images only)."""
        n, o, npix = g.shape
        kk = col.shape[0]
        for a in range(o):
            for b in range(kk):
                out[a, b] = zero
        for s in range(n):
            gs = g[s]
            for b in range(kk):
                cb = col[b, s * npix:(s + 1) * npix]
                for a in range(o):
                    ga = gs[a]
                    acc = zero
                    for t in range(npix):
                        acc += ga[t] * cb[t]
                    out[a, b] += acc
