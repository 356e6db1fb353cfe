"""The direct int8 conv of the numba provider (`qlayers._conv_layer` picks it where the
width is not dilated): no unfolded copy. The image is copied once padded with the zero
point, each kernel row's taps padded to 4, and the VNNI kernel reads 4 adjacent image
bytes per output position straight into its operand: one 64-byte load plus a byte
permute per block of 16 positions where the block's windows span at most 64 bytes
(stride-1 rows of small images, on CPUs with AVX-512 VBMI), a hardware gather otherwise.
Everything a call needs besides its arrays (offsets, the caller, one int64 row of
arguments per group) is made once per input shape and bound layer.
"""
from __future__ import annotations

import numpy as np

from ...ops._nb import HAVE_NUMBA, njit
from ...ops.quant_fused import pool_2x2
from . import vnni
from .qlayers import _DIRECT, Conv, _ptr, _split, conv_split_size, int64_args, pack_conv

if HAVE_NUMBA:
    @njit(cache=True, nogil=True, boundscheck=False)
    def _pad_images(x, c0, cg, ph, pw, xz, flip, out):
        """out[i] = channels c0 .. c0 + cg of image i, padded with the zero point (and the
        slack after), as uint8 (`flip`: x is int8, stored as x ^ 0x80)."""
        n, h, wd = x.shape[0], x.shape[2], x.shape[3]
        hp, wp = h + 2 * ph, wd + 2 * pw
        zb = np.uint8(xz)
        fl = np.uint8(0x80 if flip else 0)
        for i in range(n):
            out[i, :] = zb
            for c in range(cg):
                for y in range(h):
                    o = (c * hp + y + ph) * wp + pw
                    for t in range(wd):
                        out[i, o + t] = np.uint8(x[i, c0 + c, y, t]) ^ fl


    @njit(cache=True, nogil=True, boundscheck=False, inline="always")
    def _pool_rows(buf, rows, ho, wo, out, o0):
        """out[o0 + ...] = the 2x2 stride-2 max-pool (floor) of the `rows` channel images
        of buf (ho * wo apart, as the kernel wrote them), flat; unsigned indices (no
        wrap-around checks: the loop vectorises)."""
        u = np.uint64
        h2, w2, wd = u(ho // 2), u(wo // 2), u(wo)
        two = u(2)
        for p in range(u(rows)):
            for y in range(h2):
                r0 = p * u(ho) * wd + two * y * wd
                r1 = r0 + wd
                orow = u(o0) + (p * h2 + y) * w2
                for t in range(w2):
                    q = two * t
                    out[orow + t] = max(max(buf[r0 + q], buf[r0 + q + u(1)]),
                                        max(buf[r1 + q], buf[r1 + q + u(1)]))


_POOL_CHUNK = 1 << 15   # bytes of requantised output a pooled call keeps (L1/L2) per chunk


class DirectConv(Conv):
    """conv2d without an unfolded copy (dilation 1 along the width): each kernel row's
    taps are zero-padded to a multiple of 4, so 4 consecutive k's are 4 adjacent bytes
    of a padded image row, gathered straight into the VNNI operand (16 output positions
    at once, `vnni.packed_kernel(..., direct=True)`)."""

    def __init__(self, w, groups):
        super().__init__(w, groups)
        o, cg, kh, kw = w.shape
        self.kwp = -(-kw // 4) * 4
        wp = np.zeros((o, cg, kh, self.kwp), np.int8)
        wp[..., :kw] = w
        self.parts = pack_conv(wp, groups)
        self.k4 = self.parts[0][0].shape[1] // 4

    permute = True      # read windows by load + byte permute where they fit (tests: off)

    def _plan(self, key, params):
        """What a call of this input shape, geometry, output type and epilogue needs: the
        numba caller and one int64 row of arguments per group (addresses of the packed
        weight, the epilogue and the offsets, kept alive by the plan), made once: the
        per-call Python work and the unboxing of two dozen arguments were most of a
        batch-1 layer's time."""
        (n, _, h, wd), (sh, sw), (ph, pw), (dh, _), out_dtype, _, xz, flip, zy, lo, hi, \
            pool = key
        pool = pool and self.groups == 1
        ho = (h + 2 * ph - dh * (self.kh - 1) - 1) // sh + 1
        wo = (wd + 2 * pw - (self.kw - 1) - 1) // sw + 1
        hp, wp = h + 2 * ph, wd + 2 * pw
        p = ho * wo
        pb = -(-p // 16)
        pos = np.arange(p)
        poff = np.zeros(pb * 16, np.int32)
        poff[:p] = (pos // wo) * sh * wp + (pos % wo) * sw
        kq = np.arange(self.k4)
        j, r = kq % (self.kwp // 4), kq // (self.kwp // 4)
        koff = ((r // self.kh) * hp * wp + (r % self.kh) * dh * wp + 4 * j).astype(np.int32)
        pidx = _permute_index(poff, p) if self.permute else None
        stride_img = -(-(self.cg * hp * wp + self.kwp + 64) // 64) * 64
        work = n * p * self.o * self.k4 * 4
        big = conv_split_size()
        parts = 1 if work < big else len(_split(n, work, n, big))
        call = _direct_call(np.dtype(out_dtype) != np.float32, work >= big,
                            pidx is not None, bool(pool))
        og, esz = self.o // self.groups, np.dtype(out_dtype).itemsize
        rd = poff if pidx is None else pidx
        # one group's serial calls write rows p apart (the kernel writes each row's padded
        # tail before the next row's first block, and the images in order), so the output
        # needs no copy to drop the padding; a later group's last row would spill into
        # the next image's first, written before it
        # (pooled: each part writes its own chunk buffer, serially, so rows p apart too)
        ldo = p if (parts == 1 or pool) and self.groups == 1 else pb * 16
        chunk = max(1, min(n, _POOL_CHUNK // max(1, self.o * ldo * esz)))
        meta = np.array([[g * self.cg, self.cg, ph, pw, xz, int(flip), _ptr(rows), _ptr(corr),
                          _ptr(mult), stride_img, self.o * ldo, og, self.k4, pb, zy, lo,
                          hi, _ptr(poff), _ptr(koff), _ptr(rd), parts, g * og * ldo * esz, ldo,
                          chunk, ho, wo, self.o]
                         for g, ((rows, _), (corr, mult)) in enumerate(zip(self.parts,
                                                                           params))],
                        np.int64)
        plans = self.__dict__.setdefault("_plans", {})
        if len(plans) >= 64:
            plans.clear()
        plans[key] = plan = (n, ho, wo, p, ldo, call, meta, (params, poff, koff, rd), pool,
                             parts * (chunk * self.o * ldo + 16))
        return plan

    def run(self, x, xz, flip, params, zy, lo, hi, out_dtype, stride, padding, dilation,
            pool=False):
        """The requantised conv of x (N, C, H, W), then (`pool`) its 2x2 stride-2 max-pool:
        in the same call, each chunk of images pooled while in cache (one group), or
        after the conv (groups)."""
        key = (x.shape, stride, padding, dilation, out_dtype, id(params), xz, flip, zy, lo,
               hi, bool(pool))
        plan = self.__dict__.get("_plans", {}).get(key) or self._plan(key, params)
        return self._call(plan, x, out_dtype, pool)

    def runner(self, xz, flip, params, zy, lo, hi, out_dtype, stride, padding, dilation,
               pool=False):
        """`run` with everything but the input made once (a bound layer): its plans found
        by the input's shape alone."""
        plans = {}
        rest = (stride, padding, dilation, out_dtype, id(params), xz, flip, zy, lo, hi,
                bool(pool))

        def run(x):
            plan = plans.get(x.shape)
            if plan is None:
                if len(plans) >= 64:
                    plans.clear()
                plan = plans[x.shape] = self._plan((x.shape,) + rest, params)
            return self._call(plan, x, out_dtype, pool)
        return run

    def _call(self, plan, x, out_dtype, want_pool=False):
        n, ho, wo, p, ldo, call, meta, _, pool, nbuf = plan
        if pool:                  # one group: conv, requantise and pool in one call
            out = np.empty(n * self.o * (ho // 2) * (wo // 2), out_dtype)
            call(x, out, meta, np.empty(nbuf, out_dtype))
            return out.reshape(n, self.o, ho // 2, wo // 2)
        size = n * self.o * ldo
        out = np.empty(size + 16, out_dtype)         # the last row's tail: 16 more
        call(x, out, meta, out[:0])
        if ldo == p:
            y = out[:size].reshape(n, self.o, ho, wo)
        else:
            y = out[:size].reshape(n, self.o, ldo)[:, :, :p].reshape(n, self.o, ho, wo)
        return pool_2x2(y) if want_pool else y      # groups: the pool after


def _permute_index(poff, p):
    """The byte indices (64 per block of 16 positions) that turn one 64-byte load at a
    block's first window into its 16 windows' 4-byte groups (`vnni.packed_kernel`'s
    `direct=2`), or None when a block spans more than 64 bytes or this CPU has no VBMI
    kernel (the gathers stay)."""
    if vnni.packed_kernel(False, True, direct=2) is None:
        return None
    blocks = poff.reshape(-1, 16).astype(np.int64)
    valid = (np.arange(blocks.size) < p).reshape(-1, 16)
    rel = np.where(valid, blocks - blocks[:, :1], 0)
    if rel.min() < 0 or rel.max() + 4 > 64:
        return None
    return (rel[:, :, None] + np.arange(4)).reshape(-1).astype(np.uint8)


def _direct_call(q8, parallel, permute=False, pool=False):
    """The numba function `call(x, out, meta, buf)` padding the images and calling the
    direct conv kernel (its load-and-permute variant when `permute`) for each group's row
    of `meta` (DirectConv._plan), the images split over `parts` threads of numba's pool
    when `parallel`. `pool` (one group): the kernel writes `chunk` images at a time into
    the part's share of `buf`, pooled from there into out (N, O, Ho // 2, Wo // 2), flat."""
    key = (q8, parallel, permute, pool)
    if key not in _DIRECT_CALLS:
        from numba import prange
        k = vnni.packed_kernel(False, q8, direct=2 if permute else True)
        f = int64_args(k, 20 if permute else 19)
        _DIRECT_CALLS[("keep",) + key] = f

        if permute:
            def kern(img, out, m, n, scratch):
                f(img, m[6], out, m[7], m[8], n, m[9], m[10], m[11], m[12] * 4, m[12], m[13],
                  m[22], m[14], m[15], m[16], m[17], m[18], scratch, m[19])
        else:
            def kern(img, out, m, n, scratch):
                f(img, m[6], out, m[7], m[8], n, m[9], m[10], m[11], m[12] * 4, m[12], m[13],
                  m[22], m[14], m[15], m[16], m[17], m[18], scratch)
        kern = njit(nogil=True, inline="always")(kern)

        def call_pool(x, out, meta, buf):
            n = x.shape[0]
            m = meta[0]
            parts, chunk, ho, wo, o = m[20], m[23], m[24], m[25], m[26]
            share = buf.shape[0] // parts
            img = np.empty((n, m[9]), np.uint8)
            for t in prange(parts):
                i0 = n * t // parts
                i1 = n * (t + 1) // parts
                _pad_images(x[i0:i1], m[0], m[1], m[2], m[3], m[4], m[5] != 0, img[i0:i1])
                scratch = np.empty(4 * m[12] * 64, np.uint8)
                mine = buf[t * share:(t + 1) * share]
                for j0 in range(i0, i1, chunk):
                    j1 = min(j0 + chunk, i1)
                    kern(np.int64(img[j0:j1].ctypes.data), np.int64(mine.ctypes.data), m,
                         np.int64(j1 - j0), np.int64(scratch.ctypes.data))
                    _pool_rows(mine, (j1 - j0) * o, ho, wo, out,
                               j0 * o * (ho // 2) * (wo // 2))

        def call(x, out, meta, buf):
            n = x.shape[0]
            esz = out.itemsize
            for g in range(meta.shape[0]):
                m = meta[g]
                parts = m[20]
                img = np.empty((n, m[9]), np.uint8)
                for t in prange(parts):
                    i0 = n * t // parts
                    i1 = n * (t + 1) // parts
                    _pad_images(x[i0:i1], m[0], m[1], m[2], m[3], m[4], m[5] != 0,
                                img[i0:i1])
                    scratch = np.empty(4 * m[12] * 64, np.uint8)
                    kern(np.int64(img[i0:i1].ctypes.data),
                         np.int64(out.ctypes.data) + m[21] + i0 * m[10] * esz, m,
                         np.int64(i1 - i0), np.int64(scratch.ctypes.data))
        _DIRECT_CALLS[key] = njit(nogil=True, parallel=parallel)(call_pool if pool else call)
    return _DIRECT_CALLS[key]


_DIRECT_CALLS: dict = {}
_DIRECT["conv"] = DirectConv      # qlayers._conv_layer picks it (no import back)
