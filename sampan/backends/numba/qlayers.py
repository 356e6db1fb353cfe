"""The numba provider's kernels of the requantising int8 layers (`ops/quant_fused.py`):
`qlinear_dense`, `qdense` and `qlinear_conv2d` on the AVX-512 VNNI kernels of
`vnni.packed_kernel`, the epilogue (zero point, bias, per-channel scale, clamp) inside.

- dense: the weight (N, K) is packed once, (N/16, K/4, 16, 4), with its column sums; the
  activations (uint8, or int8 moved to uint8 by x ^ 0x80 and the zero point by 128) are
  read in place, row by row, when their rows hold K rounded up to 4 readable bytes (the
  padded outputs of the layer before do).
- conv (`qdirect.DirectConv`, width not dilated): the image is copied once padded with
  the zero point, each kernel row's taps padded to 4, and the kernel reads 4 adjacent
  image bytes per output position straight into its operand (a load and a byte permute,
  or a gather; once per group of 64 positions, into a scratch buffer every weight row
  block reads); the weight rows are broadcast and the result comes out NCHW. A dilated
  width unfolds the image into the packed layout first (`Conv`, `_im2col`).

Outputs are padded to 16 columns (the view returned drops the padding). A weight with a
nonzero zero point, a CPU without VNNI, or sums that could overflow int32 run the exact
reference of the op table. `bind(node)` packs a constant weight (and the epilogue's
constants) once, when the node is compiled; an eager call packs per call.
"""
from __future__ import annotations

import numpy as np

from ...ops._nb import HAVE_NUMBA, njit
from ...ops.quant_fused import pool_2x2, bounds, multiplier
from ...ops.registry import OPS
from . import vnni

_BIG = 1 << 20          # multiply-adds from which a call is split over threads


def conv_split_size() -> int:
    """Multiply-adds from which an int8 convolution splits its images over threads:
    `_BIG` where OpenMP workers spin after a region (a hand-off costs a few us), 2^24
    under a passive wait policy (sampan's default), where each split wakes a sleeping
    worker: LeNet's int8 convolutions at batch 64 (15-22 M multiply-adds) ran W5's batch
    at 172k against 118k samples/s unsplit (quiet 2-core Zen 4, 2026-12-02)."""
    from ..._threads import openmp_wait_policy
    return 1 << 24 if "PASSIVE" in (openmp_wait_policy() or "").upper() else _BIG


def _ptr(a):
    return a.ctypes.data


def pack_dense(w):
    """(packed (NB, K4, 16, 4) int8, column sums (NB*16,) int64) of weight w (N, K)."""
    n, k = w.shape
    nb, k4 = -(-n // 16), -(-k // 4)
    wp = np.zeros((nb * 16, k4 * 4), np.int8)
    wp[:n, :k] = w
    colsum = wp.astype(np.int64).sum(1)
    return np.ascontiguousarray(wp.reshape(nb, 16, k4, 4).transpose(0, 2, 1, 3)), colsum


def pack_conv(w, groups):
    """Per group: (rows (O/g, K4*4) int8 zero-padded, row sums int64)."""
    o = w.shape[0]
    og = o // groups
    flat = w.reshape(o, -1)
    k = flat.shape[1]
    k4 = -(-k // 4)
    rows = np.zeros((o, k4 * 4), np.int8)
    rows[:, :k] = flat
    sums = rows.astype(np.int64).sum(1)
    return [(np.ascontiguousarray(rows[g * og:(g + 1) * og]), sums[g * og:(g + 1) * og])
            for g in range(groups)]


def _epilogue(colsum, bias, xz, mult, width):
    """(corr int32, mult float32), each padded to `width`: corr = bias - xz * colsum."""
    n = mult.shape[0]
    corr = np.zeros(width, np.int32)
    corr[:n] = np.asarray(bias, np.int64) - int(xz) * colsum[:n]
    m = np.zeros(width, np.float32)
    m[:n] = mult
    return corr, m


def _as_u8(x, xz):
    """x as uint8 and its zero point (int8 moves by 128)."""
    if x.dtype == np.int8:
        return x.view(np.uint8) ^ np.uint8(0x80), int(xz) + 128
    return x, int(xz)


def _rows(x, k4):
    """x (M, K) uint8 as rows the kernel reads K4*4 bytes of: (array, row stride). In
    place when x is contiguous with K % 4 == 0, or a view of whole rows of a contiguous
    buffer (the padded output of the layer before) that holds those bytes."""
    m = x.shape[0]
    need = 4 * k4
    if x.flags.c_contiguous and x.shape[1] == need:
        return x, need
    base = x.base
    if (m and type(base) is np.ndarray and x.strides[1] == 1 and base.ndim == 2
            and base.flags.c_contiguous and base.shape[0] == m
            and x.strides[0] == base.strides[0]):
        off = x.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        if 0 <= off and off + need <= x.strides[0]:
            return x, x.strides[0]
    xp = np.zeros((m, need), np.uint8)
    xp[:, :x.shape[1]] = x
    return xp, need


def _split(total, work, parts_max, big=None):
    """Ranges of [0, total) for the threads (one range below `big`, default _BIG,
    multiply-adds)."""
    from ..._threads import get_num_threads
    big = _BIG if big is None else big
    parts = min(total, parts_max, max(1, int(get_num_threads())), max(1, work // big))
    return [(total * i // parts, total * (i + 1) // parts) for i in range(max(parts, 1))]


def _run_parts(fn, ranges):
    if len(ranges) == 1:
        fn(*ranges[0])
        return
    futures = [vnni._pool(len(ranges) - 1).submit(fn, *r) for r in ranges[1:]]
    fn(*ranges[0])
    for f in futures:
        f.result()


class Dense:
    """A dense int8 layer with its weight packed: `run(x, xz, corr, mult, zy, lo, hi,
    out_dtype)` (out_dtype float32: `qdense`)."""

    def __init__(self, w):
        self.n, self.k = w.shape
        self.wp, self.colsum = pack_dense(w)
        self.nb, self.k4 = self.wp.shape[0], self.wp.shape[1]

    def params(self, bias, xz, mult):
        return _epilogue(self.colsum, bias, xz, mult, self.nb * 16)

    def run(self, xu, corr, mult, zy, lo, hi, out_dtype):
        q8 = np.dtype(out_dtype) != np.float32
        xr, lds = _rows(xu, self.k4)
        m = xu.shape[0]
        out = np.empty((m, self.nb * 16), out_dtype)
        ldo = self.nb * 16
        if m * ldo * self.k4 * 4 < _BIG:       # one call, through numba: ~0.5 us, not 8
            _calls(q8)(xr, self.wp, out, corr, mult, 1, 0, 0, m, lds, self.k4, self.nb,
                       ldo, zy, lo, hi)
            return out if self.n == ldo else out[:, :self.n]
        parts = len(_split(self.nb, m * ldo * self.k4 * 4, self.nb))
        # numba's thread pool: a thread hand-off costs a few us, a future's tens under load
        _par_calls(q8)(xr, self.wp, out, corr, mult, m, lds, self.k4, self.nb, ldo, zy, lo,
                       hi, parts)
        return out if self.n == ldo else out[:, :self.n]

    def runner(self, corr, mult, zy, lo, hi, out_dtype):
        """`run` with what the output type decides made once: contiguous rows of K4*4
        bytes below the threading size (a batch-1 call) go straight to the kernel, its
        constant arguments (addresses of the packed weight and epilogue, sizes) in one
        int64 row, ~1.5 us less Python and unboxing per call; any other input through
        `run`."""
        dt = np.dtype(out_dtype)
        call = _fast_calls(dt != np.float32)
        n, k4, nb = self.n, self.k4, self.nb
        ldo, need = nb * 16, 4 * k4
        small = _BIG // (ldo * need)            # rows below the threading size
        keep = (self.wp, corr, mult)            # the addresses in `meta` stay valid
        meta = np.array([_ptr(a) for a in keep] + [need, k4, nb, ldo, zy, lo, hi], np.int64)

        def run(xu):
            m = xu.shape[0]
            if m >= small or xu.shape[1] != need or not xu.flags.c_contiguous:
                return self.run(xu, corr, mult, zy, lo, hi, dt)
            out = np.empty((m, ldo), dt)
            call(xu, out, meta)
            return out if n == ldo else out[:, :n]
        run.keep = keep
        return run


_CALLS: dict = {}


def _calls(q8):
    """The numba function calling the dense VNNI kernel (int8 or float32 out; made on
    first use): a ctypes call of the kernel's 16 arguments costs ~8 us from Python (each
    `.ctypes.data` ~1 us), from numba 0.5."""
    if q8 not in _CALLS:
        _CALLS[q8] = _caller(vnni.packed_kernel(True, q8))
    return _CALLS[q8]


_PAR_CALLS: dict = {}


def _par_calls(q8):
    """The numba function splitting the dense VNNI kernel's column blocks over `parts`
    threads (numba's parallel loop)."""
    if q8 not in _PAR_CALLS:
        from numba import prange
        f = vnni.packed_kernel(True, q8)

        def call(x, wp, out, corr, mult, m, lds, k4, nb, ldo, zy, lo, hi, parts):
            esz = out.itemsize
            for t in prange(parts):
                j0 = nb * t // parts
                j1 = nb * (t + 1) // parts
                f(wp.ctypes.data + j0 * k4 * 64, x.ctypes.data,
                  out.ctypes.data + j0 * 16 * esz, corr.ctypes.data + j0 * 64,
                  mult.ctypes.data + j0 * 64, 1, 0, 0, m, lds, k4, j1 - j0, ldo, zy, lo, hi)
        _PAR_CALLS[q8] = njit(nogil=True, parallel=True)(call)
    return _PAR_CALLS[q8]


def _caller(f):
    def call(x, wp, out, corr, mult, nimg, v_img, out_img, rows, lds, k4, nb, ldo, zy, lo,
             hi):
        f(wp.ctypes.data, x.ctypes.data, out.ctypes.data, corr.ctypes.data,
          mult.ctypes.data, nimg, v_img, out_img, rows, lds, k4, nb, ldo, zy, lo, hi)
    return njit(nogil=True)(call)


def int64_args(f, nargs):
    """The ctypes kernel `f` seen as taking `nargs` int64 arguments (its pointers are one
    64-bit register each on x86-64), so numba code can pass addresses kept in int64
    arrays (`.ctypes.data` is unsigned there, and mixing it with int64 gives a float)."""
    import ctypes
    return ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * nargs)(
        ctypes.cast(f, ctypes.c_void_p).value)


_FAST_CALLS: dict = {}


def _fast_calls(q8):
    """`call(x, out, meta)`: the dense VNNI kernel on contiguous rows x with the constant
    arguments read from `meta` (Dense.runner, which keeps the arrays it points to)."""
    if q8 not in _FAST_CALLS:
        f = int64_args(vnni.packed_kernel(True, q8), 16)
        _FAST_CALLS[("keep", q8)] = f

        def call(x, out, meta):
            f(meta[0], np.int64(x.ctypes.data), np.int64(out.ctypes.data), meta[1], meta[2],
              1, 0, 0, x.shape[0], meta[3], meta[4], meta[5], meta[6], meta[7], meta[8],
              meta[9])
        _FAST_CALLS[q8] = njit(nogil=True)(call)
    return _FAST_CALLS[q8]


_CONV_CALLS: dict = {}


def _conv_calls(q8):
    """The numba function unfolding the images and calling the conv VNNI kernel."""
    if q8 not in _CONV_CALLS:
        _CONV_CALLS[q8] = _conv_caller(vnni.packed_kernel(False, q8))
    return _CONV_CALLS[q8]


def _conv_caller(f):
    def call(x, c0, cg, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, xz, flip, cols, rows, out,
             corr, mult, out_img, og, zy, lo, hi):
        _im2col(x, c0, cg, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, xz, flip, cols)
        pb, k4 = cols.shape[1], cols.shape[2]
        f(cols.ctypes.data, rows.ctypes.data, out.ctypes.data, corr.ctypes.data,
          mult.ctypes.data, x.shape[0], pb * k4 * 64, out_img, og, k4 * 4, k4, pb, pb * 16,
          zy, lo, hi)
    return njit(nogil=True)(call)


def _fits(k, bias):
    """Whether the int32 sums and corrections cannot overflow."""
    b = int(np.abs(np.asarray(bias, np.int64)).max()) if np.size(bias) else 0
    return k * 255 * 128 * 2 + b < 2 ** 31


def _dense_ok(x, w, wz, bias):
    return (vnni.packed_kernel(True, True) is not None and not np.any(wz)
            and _fits(w.shape[1], bias) and x.ndim == 2)


def qlinear_dense(x, x_scale, x_zero_point, w, w_scale, w_zero_point, bias, y_scale,
                  y_zero_point, qmin=None, qmax=None):
    if not _dense_ok(x, w, w_zero_point, bias):
        return OPS["qlinear_dense"].kernels["numpy"](
            x, x_scale, x_zero_point, w, w_scale, w_zero_point, bias, y_scale, y_zero_point,
            qmin=qmin, qmax=qmax)
    d = Dense(w)
    xu, xz = _as_u8(x, x_zero_point)
    corr, mult = d.params(bias, xz, multiplier(x_scale, w_scale, y_scale, d.n))
    lo, hi = bounds(y_zero_point, qmin, qmax)
    return d.run(xu, corr, mult, int(y_zero_point), lo, hi, y_zero_point.dtype)


def qdense(x, x_scale, x_zero_point, w, w_scale, w_zero_point, bias):
    if not _dense_ok(x, w, w_zero_point, bias):
        return OPS["qdense"].kernels["numpy"](x, x_scale, x_zero_point, w, w_scale,
                                              w_zero_point, bias)
    d = Dense(w)
    xu, xz = _as_u8(x, x_zero_point)
    corr, mult = d.params(bias, xz, multiplier(x_scale, w_scale, None, d.n))
    return d.run(xu, corr, mult, 0, 0, 0, np.float32)


if HAVE_NUMBA:
    @njit(cache=True, nogil=True, boundscheck=False)
    def _im2col(x, c0, cg, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, xz, flip, out):
        """out[i, p // 16, k // 4, p % 16, k % 4] = window value k of output position p of
        image i (channels c0 .. c0 + cg), the zero point outside the image; `flip`: x is
        int8, stored as x ^ 0x80. Each image is first copied padded with the zero point,
        then every byte is one gather at (offset of p) + (offset of k), no branch: the
        padding lanes and k's read some byte of the image, multiplied by zero weights or
        dropped."""
        n = x.shape[0]
        h, wd = x.shape[2], x.shape[3]
        hp, wp = h + 2 * ph, wd + 2 * pw
        pb, k4 = out.shape[1], out.shape[2]
        kk = cg * kh * kw
        npos = ho * wo
        poff = np.zeros(pb * 16, np.int64)
        for p in range(npos):
            oh = p // wo
            poff[p] = oh * sh * wp + (p - oh * wo) * sw
        koff = np.zeros(k4 * 4, np.int64)
        for k in range(kk):
            c = k // (kh * kw)
            r = k - c * kh * kw
            a = r // kw
            koff[k] = c * hp * wp + a * dh * wp + (r - a * kw) * dw
        zb = np.uint8(xz)
        fl = np.uint8(0x80 if flip else 0)
        img = np.empty(cg * hp * wp, np.uint8)
        for i in range(n):
            img[:] = zb
            for c in range(cg):
                for y in range(h):
                    o = (c * hp + y + ph) * wp + pw
                    for t in range(wd):
                        img[o + t] = np.uint8(x[i, c0 + c, y, t]) ^ fl
            for q in range(pb):
                for kq in range(k4):
                    for lane in range(16):
                        b0 = poff[q * 16 + lane]
                        for kl in range(4):
                            out[i, q, kq, lane, kl] = img[b0 + koff[kq * 4 + kl]]


class Conv:
    """A conv2d int8 layer with its weight packed per group."""

    def __init__(self, w, groups):
        self.o, self.cg, self.kh, self.kw = w.shape
        self.groups = groups
        self.parts = pack_conv(w, groups)
        self.k4 = self.parts[0][0].shape[1] // 4

    def params(self, bias, xz, mult):
        og = self.o // self.groups
        out = []
        for g, (_, sums) in enumerate(self.parts):
            sl = slice(g * og, (g + 1) * og)
            out.append(_epilogue(sums, np.asarray(bias)[sl], xz, mult[sl], og))
        return out

    def run(self, x, xz, flip, params, zy, lo, hi, out_dtype, stride, padding, dilation):
        n, _, h, wd = x.shape
        ho = (h + 2 * padding[0] - dilation[0] * (self.kh - 1) - 1) // stride[0] + 1
        wo = (wd + 2 * padding[1] - dilation[1] * (self.kw - 1) - 1) // stride[1] + 1
        p = ho * wo
        pb = -(-p // 16)
        q8 = np.dtype(out_dtype) != np.float32
        f = vnni.packed_kernel(False, q8)
        out = np.empty((n, self.o, pb * 16), out_dtype)
        esz = out.itemsize
        og = self.o // self.groups
        x = np.ascontiguousarray(x)
        cols = np.empty((n, pb, self.k4, 16, 4), np.uint8)
        vimg = pb * self.k4 * 64
        big = conv_split_size()
        small = n * p * self.o * self.k4 * 4 < big
        for g, ((rows, _), (corr, mult)) in enumerate(zip(self.parts, params)):
            if small:           # one numba call: unfold and multiply
                _conv_calls(q8)(x, g * self.cg, self.cg, self.kh, self.kw, stride[0],
                                stride[1], padding[0], padding[1], dilation[0],
                                dilation[1], ho, wo, xz, flip, cols, rows, out[:, g * og:],
                                corr, mult, self.o * pb * 16, og, zy, lo, hi)
                continue

            def part(i0, i1, g=g, rows=rows, corr=corr, mult=mult):
                _im2col(x[i0:i1], g * self.cg, self.cg, self.kh, self.kw, stride[0],
                        stride[1], padding[0], padding[1], dilation[0], dilation[1], ho, wo,
                        xz, flip, cols[i0:i1])
                f(_ptr(cols) + i0 * vimg, _ptr(rows),
                  _ptr(out) + (i0 * self.o * pb * 16 + g * og * pb * 16) * esz,
                  _ptr(corr), _ptr(mult), i1 - i0, vimg, self.o * pb * 16, og, self.k4 * 4,
                  self.k4, pb, pb * 16, zy, lo, hi)
            if n:
                _run_parts(part, _split(n, n * p * self.o * self.k4 * 4, n, big))
        y = out if p == pb * 16 else out[:, :, :p]
        return y.reshape(n, self.o, ho, wo)


# the direct conv (qdirect.DirectConv, which builds on Conv and imports this module)
# registers itself here when imported; provider.py and qkernels.py import it beside this one
_DIRECT: dict = {}


def _conv_layer(w, groups, dilation):
    """The packed conv layer for this weight: direct where the width is not dilated."""
    direct = _DIRECT.get("conv")
    if (direct is not None and tuple(dilation)[1] == 1
            and vnni.packed_kernel(False, True, direct=True) is not None):
        return direct(w, groups)
    return Conv(w, groups)


def _conv_ok(x, w, wz, bias):
    k = w.shape[1] * w.shape[2] * -(-w.shape[3] // 4) * 4
    return (HAVE_NUMBA and vnni.packed_kernel(False, True) is not None and not np.any(wz)
            and _fits(k, bias))


def qlinear_conv2d(x, x_scale, x_zero_point, w, w_scale, w_zero_point, bias, y_scale,
                   y_zero_point, stride, padding, dilation, groups, qmin=None, qmax=None):
    if not _conv_ok(x, w, w_zero_point, bias):
        return OPS["qlinear_conv2d"].kernels["numpy"](
            x, x_scale, x_zero_point, w, w_scale, w_zero_point, bias, y_scale, y_zero_point,
            stride=stride, padding=padding, dilation=dilation, groups=groups, qmin=qmin,
            qmax=qmax)
    c = _conv_layer(w, groups, dilation)
    flip = x.dtype == np.int8
    xz = int(x_zero_point) + (128 if flip else 0)
    params = c.params(bias, xz, multiplier(x_scale, w_scale, y_scale, c.o))
    lo, hi = bounds(y_zero_point, qmin, qmax)
    return c.run(x, xz, flip, params, int(y_zero_point), lo, hi, y_zero_point.dtype,
                 stride, padding, dilation)


def qlinear_conv2d_pool(x, x_scale, x_zero_point, w, w_scale, w_zero_point, bias, y_scale,
                        y_zero_point, stride, padding, dilation, groups, qmin=None,
                        qmax=None):
    """qlinear_conv2d and its 2x2 stride-2 max-pool: in one call on the direct kernel."""
    args = (x, x_scale, x_zero_point, w, w_scale, w_zero_point, bias, y_scale, y_zero_point)
    geo = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, qmin=qmin,
               qmax=qmax)
    if not _conv_ok(x, w, w_zero_point, bias):
        return OPS["qlinear_conv2d_pool"].kernels["numpy"](*args, **geo)
    c = _conv_layer(w, groups, dilation)
    if not hasattr(c, "runner"):            # the unfolding conv: the pool after it
        return pool_2x2(qlinear_conv2d(*args, **geo))
    flip = x.dtype == np.int8
    xz = int(x_zero_point) + (128 if flip else 0)
    params = c.params(bias, xz, multiplier(x_scale, w_scale, y_scale, c.o))
    lo, hi = bounds(y_zero_point, qmin, qmax)
    return c.run(x, xz, flip, params, int(y_zero_point), lo, hi, y_zero_point.dtype,
                 stride, padding, dilation, pool=True)


KERNELS = {"qlinear_dense": qlinear_dense, "qdense": qdense,
           "qlinear_conv2d": qlinear_conv2d, "qlinear_conv2d_pool": qlinear_conv2d_pool}


_PACKS: dict = {}       # (id(weight const), tag) -> (weakref to it, packed layer)


def _packed(w, make, tag=None):
    """The packed layer of constant weight `w`, made once per array: a program compiled
    again (another batch size, a clone) reuses it. Graph constants are never mutated."""
    import weakref
    key = (id(w), tag)
    hit = _PACKS.get(key)
    if hit is not None and hit[0]() is w:
        return hit[1]
    layer = make(w)
    _PACKS[key] = (weakref.ref(w, lambda _r, key=key: _PACKS.pop(key, None)), layer)
    return layer


def _consts(node):
    """The constant inputs' arrays (None where an input is not a constant)."""
    return [v.const if getattr(v, "is_const", False) else None for v in node.inputs]


def _bind_dense(node):
    """qlinear_dense / qdense with the weight and the epilogue prepared once."""
    import functools
    kern = KERNELS[node.op]
    c = _consts(node)
    plain = functools.partial(kern, **node.attrs) if node.attrs else kern
    if any(a is None for a in c[1:]) or not _dense_ok(np.empty((0, 0)), c[3], c[5], c[6]):
        return plain
    d = _packed(c[3], Dense)
    flip = c[2].dtype == np.int8
    xz = int(c[2]) + (128 if flip else 0)
    q8 = node.op == "qlinear_dense"
    corr, mult = d.params(c[6], xz, multiplier(c[1], c[4], c[7] if q8 else None, d.n))
    zy, lo, hi, dt = 0, 0, 0, np.dtype(np.float32)
    if q8:
        zy = int(c[8])
        lo, hi = bounds(c[8], node.attrs.get("qmin"), node.attrs.get("qmax"))
        dt = c[8].dtype

    fast = d.runner(corr, mult, zy, lo, hi, dt)
    xdt = c[2].dtype

    def run(x, *rest):
        if x.ndim != 2 or x.shape[1] != d.k or x.dtype != xdt:
            return plain(x, *rest)
        return fast(x.view(np.uint8) ^ np.uint8(0x80) if flip else x)
    return run


def _bind_conv(node):
    """qlinear_conv2d (and _pool) with the weight and the epilogue prepared once."""
    import functools
    a = node.attrs
    pool = node.op == "qlinear_conv2d_pool"
    plain = functools.partial(qlinear_conv2d_pool if pool else qlinear_conv2d, **a)
    c = _consts(node)
    if any(v is None for v in c[1:]) or not _conv_ok(None, c[3], c[5], c[6]):
        return plain
    conv = _packed(c[3], lambda w: _conv_layer(w, a["groups"], a["dilation"]),
                   (a["groups"], tuple(a["dilation"])[1] == 1))
    flip = c[2].dtype == np.int8
    xz = int(c[2]) + (128 if flip else 0)
    params = conv.params(c[6], xz, multiplier(c[1], c[4], c[7], conv.o))
    lo, hi = bounds(c[8], a.get("qmin"), a.get("qmax"))
    zy, dt = int(c[8]), c[8].dtype

    geometry = (tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]))
    if hasattr(conv, "runner"):         # DirectConv: its plans found by shape alone
        fast = conv.runner(xz, flip, params, zy, lo, hi, dt, *geometry, pool=pool)
    else:
        def fast(x):
            y = conv.run(x, xz, flip, params, zy, lo, hi, dt, *geometry)
            return pool_2x2(y) if pool else y
    cin, xdt = conv.cg * conv.groups, c[2].dtype

    def run(x, *rest):
        if x.ndim != 4 or x.shape[1] != cin or x.dtype != xdt:
            return plain(x, *rest)
        return fast(x)
    return run


BINDERS = {"qlinear_dense": _bind_dense, "qdense": _bind_dense,
           "qlinear_conv2d": _bind_conv, "qlinear_conv2d_pool": _bind_conv}

