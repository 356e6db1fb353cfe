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
        (n, _, h, wd), (sh, sw), (ph, pw), (dh, _), out_dtype, _, xz, flip, zy, lo, hi = key
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
                            pidx is not None)
        og, esz = self.o // self.groups, np.dtype(out_dtype).itemsize
        rd = poff if pidx is None else pidx
        # one group's serial calls write rows p apart (the kernel writes each row's padded
        # tail before the next row's first block, and the images in order), so the output
        # needs no copy to drop the padding; a later group's last row would spill into
        # the next image's first, written before it
        ldo = p if parts == 1 and self.groups == 1 else pb * 16
        meta = np.array([[g * self.cg, self.cg, ph, pw, xz, int(flip), _ptr(rows), _ptr(corr),
                          _ptr(mult), stride_img, self.o * ldo, og, self.k4, pb, zy, lo,
                          hi, _ptr(poff), _ptr(koff), _ptr(rd), parts, g * og * ldo * esz, ldo]
                         for g, ((rows, _), (corr, mult)) in enumerate(zip(self.parts,
                                                                           params))],
                        np.int64)
        plans = self.__dict__.setdefault("_plans", {})
        if len(plans) >= 64:
            plans.clear()
        plans[key] = plan = (n, ho, wo, p, ldo, call, meta, (params, poff, koff, rd))
        return plan

    def run(self, x, xz, flip, params, zy, lo, hi, out_dtype, stride, padding, dilation):
        key = (x.shape, stride, padding, dilation, out_dtype, id(params), xz, flip, zy, lo,
               hi)
        plan = self.__dict__.get("_plans", {}).get(key) or self._plan(key, params)
        return self._call(plan, x, out_dtype)

    def runner(self, xz, flip, params, zy, lo, hi, out_dtype, stride, padding, dilation):
        """`run` with everything but the input made once (a bound layer): its plans found
        by the input's shape alone."""
        plans = {}
        rest = (stride, padding, dilation, out_dtype, id(params), xz, flip, zy, lo, hi)

        def run(x):
            plan = plans.get(x.shape)
            if plan is None:
                if len(plans) >= 64:
                    plans.clear()
                plan = plans[x.shape] = self._plan((x.shape,) + rest, params)
            return self._call(plan, x, out_dtype)
        return run

    def _call(self, plan, x, out_dtype):
        n, ho, wo, p, ldo, call, meta, _ = plan
        size = n * self.o * ldo
        out = np.empty(size + 16, out_dtype)         # the last row's tail: 16 more
        call(x, out, meta)
        if ldo == p:
            return out[:size].reshape(n, self.o, ho, wo)
        return out[:size].reshape(n, self.o, ldo)[:, :, :p].reshape(n, self.o, ho, wo)


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


def _direct_call(q8, parallel, permute=False):
    """The numba function `call(x, out, meta)` padding the images and calling the direct
    conv kernel (its load-and-permute variant when `permute`) for each group's row of
    `meta` (DirectConv._plan), the images split over `parts` threads of numba's pool when
    `parallel`."""
    key = (q8, parallel, permute)
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

        def call(x, out, meta):
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
        _DIRECT_CALLS[key] = njit(nogil=True, parallel=parallel)(call)
    return _DIRECT_CALLS[key]


_DIRECT_CALLS: dict = {}
_DIRECT["conv"] = DirectConv      # qlayers._conv_layer picks it (no import back)
