"""The numba kernels of `conv2d_block` (sampan/ops/dense.py): a served convolution, its
per-channel bias, ReLU and 2x2 max-pool, as the Predictor's `fuse_layers` pass writes
them for LeNet-style blocks.

The convolution runs the kernel a served program's conv2d gets (`runtime/specialize.py`'s
choice, made here once per bound node: the generated direct kernel for few taps per
output, else the one-GEMM layout with a column buffer of its own, else the op's kernel,
whose choice may be oneDNN); then one loop (`_epilogue_pool`) reads its output once and
writes the block's: bias, ReLU, max over each 2x2 window, in that order per element, so
for the same convolution output it gives the unfused nodes' numbers (NaN kept as numpy's
maximum and the pool loop keep it). Before: a generated kernel pass for bias and ReLU and
a pool kernel pass, two calls at batch 1 of ~1-2 us each. One image on the one-GEMM
layout goes through flat rows (`_flat_one_gemm`), and a stride-1 layer the direct
kernels serve through convgen's "block" kernel, the epilogue inside (`_direct_block`).
Measured at batch 1 on the loaded 2-core Xeon (2026-12-02): LeNet's blocks 8.7 -> 7.8 us
and 11.6 -> 8.6 us.

Example: ``fn = bind_block(node); y = fn(x, w, bias)``
"""
from __future__ import annotations

import numpy as np

from ...ops._nb import HAVE_NUMBA, njit

if HAVE_NUMBA:
    @njit(cache=True, nogil=True, boundscheck=False)
    def _epilogue_pool(y, bias, relu, pool, out):
        """out[b, c] = maxpool2x2?(relu?(y[b, c] + bias[c])) for y (N, C, H, W) of any
        strides and out (N, C, H // 2, W // 2) (pool) or (N, C, H, W); shapes checked by
        the caller."""
        n, c, ho, wo = out.shape
        zero = out.dtype.type(0)
        for b in range(n):
            for ch in range(c):
                bc = bias[ch]
                if not pool:
                    for i in range(ho):
                        for j in range(wo):
                            s = y[b, ch, i, j] + bc
                            if relu and s < zero:
                                s = zero
                            out[b, ch, i, j] = s
                    continue
                for i in range(ho):
                    for j in range(wo):
                        v0 = y[b, ch, 2 * i, 2 * j] + bc
                        v1 = y[b, ch, 2 * i, 2 * j + 1] + bc
                        v2 = y[b, ch, 2 * i + 1, 2 * j] + bc
                        v3 = y[b, ch, 2 * i + 1, 2 * j + 1] + bc
                        if relu:
                            v0 = zero if v0 < zero else v0
                            v1 = zero if v1 < zero else v1
                            v2 = zero if v2 < zero else v2
                            v3 = zero if v3 < zero else v3
                        a = v1 if (v1 > v0) | (v1 != v1) else v0
                        d = v3 if (v3 > v2) | (v3 != v3) else v2
                        out[b, ch, i, j] = d if (d > a) | (d != d) else a


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _out_shape(y_shape, pool):
    n, c, h, w = y_shape
    return (n, c, h // 2, w // 2) if pool else (n, c, h, w)


def _finish(y, bias, relu, pool):
    """The block's output from the convolution's `y` (checked: one float dtype, a bias of
    one value per channel, at least 2x2 under the pool)."""
    out_shape = _out_shape(y.shape, pool)
    if (y.ndim != 4 or y.dtype not in _FLOATS or bias.dtype != y.dtype
            or bias.shape != (y.shape[1],) or (pool and min(y.shape[2:]) < 2)):
        raise ValueError(f"conv2d_block epilogue: conv output {y.dtype}{list(y.shape)}, "
                         f"bias {bias.dtype}{list(bias.shape)}")
    out = np.empty(out_shape, y.dtype)
    _epilogue_pool(y, np.ascontiguousarray(bias), bool(relu), bool(pool), out)
    return out


def block_kernel(x, w, bias, stride, padding, dilation, groups, relu=False, pool=False):
    """The op's numba kernel (eager, the jit): the conv2d op's kernel (numba loops, or the
    measured choice), then the epilogue loop; other dtypes the op's numpy kernel."""
    from ...ops.dense import block_reference
    from ...ops.registry import OPS
    if (not HAVE_NUMBA or x.dtype not in _FLOATS or w.dtype != x.dtype
            or bias.dtype != x.dtype):
        return block_reference(x, w, bias, stride, padding, dilation, groups, relu, pool)
    y = OPS["conv2d"].kernel(x, w, stride=tuple(stride), padding=tuple(padding),
                             dilation=tuple(dilation), groups=int(groups))
    return _finish(y, bias, relu, pool)


def _conv_for(x, w, attrs):
    """A callable x -> the convolution output for the node's concrete x and constant w:
    the kernel a served conv2d gets (see the module doc), or None for the op's kernel."""
    from .loops import conv as _conv
    from . import convloops as _loops
    from ...ops import conv as _c
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    g = int(attrs["groups"])
    stride, dilation = tuple(attrs["stride"]), tuple(attrs["dilation"])
    (ph, pw) = tuple(attrs["padding"])
    ho = (h + 2 * ph - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + 2 * pw - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    dtype = x.dtype
    contiguous = np.ascontiguousarray
    if (_conv._direct(dtype, stride, dilation, cg, o // g, kh, kw)
            or _conv._direct_strided(dtype, stride, dilation, cg, o // g, kh, kw,
                                     _conv.DIRECT_MIN_OUTPUTS)):
        loop = _conv._direct_kernel("forward", dtype, o // g, kh, kw)
        w2 = np.ascontiguousarray(w).reshape(o, -1)
        y = np.empty((n, o, ho, wo), dtype)       # this bound node's scratch
        sh, sw = stride

        def conv_direct(x):
            loop(contiguous(x), w2, y, ph, pw, sh, sw)
            return y
        return conv_direct
    if n == 1 and _conv._one_gemm(dtype, stride, dilation, g, ho * wo) and kh * kw > 1:
        return _flat_one_gemm(w, ph, pw, h, wd, ho, wo)
    if _conv._one_gemm(dtype, stride, dilation, g, ho * wo) and kh * kw > 1:
        w2 = np.ascontiguousarray(w).reshape(o, cg * kh * kw)
        col = np.empty((cg * kh * kw, n * ho * wo), dtype)
        y = np.empty((o, n, ho, wo), dtype)
        cols, pad = _loops.im2col_rows, _c._pad
        yt = y.transpose(1, 0, 2, 3)              # (N, O, Ho, Wo) view: the epilogue reads it
        y2 = y.reshape(o, n * ho * wo)

        def conv_one_gemm(x):
            cols(contiguous(pad(x, ph, pw)), kh, kw, ho, wo, col)
            np.matmul(w2, col, out=y2)
            return yt
        return conv_one_gemm
    return None


if HAVE_NUMBA:
    @njit(cache=True, nogil=True, boundscheck=False)
    def _flat_cols(xp, kh, kw, col):
        """col[(c*kh + i)*kw + j, q] = xp[c, i*Wp + j + q] for q < col.shape[1], xp (C, Hp,
        Wp) one padded image: each row one contiguous run (the caller checked that
        (kh - 1)*Wp + kw - 1 + col.shape[1] <= Hp*Wp)."""
        c, hp, wp = xp.shape
        nq = col.shape[1]
        xf = xp.ravel()
        for ci in range(c):
            for i in range(kh):
                for j in range(kw):
                    # a slice start, not base + q: a signed index keeps numba's
                    # wraparound test in the copy loop (convloops.py)
                    src = xf[ci * hp * wp + i * wp + j:]
                    dst = col[(ci * kh + i) * kw + j]
                    for q in range(nq):
                        dst[q] = src[q]


def _flat_one_gemm(w, ph, pw, h, wd, ho, wo):
    """One image through the one-GEMM layout on flat rows (convgen's trick): in the padded
    plane of width Wp, output pixel (y, x) and tap (i, j) read element (y + i)*Wp + x + j,
    so tap (c, i, j)'s column row is one contiguous run of nq = (Ho - 1)*Wp + Wo elements
    of channel c shifted by i*Wp + j (one copy instead of Ho runs of Wo), and the GEMM's
    (O, nq) product holds pixel (y, x) at y*Wp + x: the kw - 1 columns between rows are
    computed and thrown away (LeNet's second layer: 136 columns for 100 pixels). Returns
    x -> the (1, O, Ho, Wo) strided view of the product the epilogue reads."""
    from ...ops import conv as _c
    o, cg, kh, kw = w.shape
    hp, wp = h + 2 * ph, wd + 2 * pw
    nq = (ho - 1) * wp + wo
    if (kh - 1) * wp + kw - 1 + nq > hp * wp:        # what _flat_cols reads
        return None
    w2 = np.ascontiguousarray(w).reshape(o, cg * kh * kw)
    col = np.empty((cg * kh * kw, nq), w.dtype)
    buf = np.empty(o * ho * wp, w.dtype)              # (O, Ho*Wp): the GEMM writes nq of each row
    y2 = buf.reshape(o, ho * wp)[:, :nq]
    it = buf.itemsize
    view = np.lib.stride_tricks.as_strided(buf, (1, o, ho, wo),
                                           (o * ho * wp * it, ho * wp * it, wp * it, it),
                                           writeable=False)
    pad, contiguous = _c._pad, np.ascontiguousarray

    def conv_flat(x):
        xp = contiguous(pad(x, ph, pw)) if (ph or pw) else contiguous(x)
        _flat_cols(xp[0], kh, kw, col)
        np.matmul(w2, col, out=y2)
        return view
    return conv_flat


def _direct_block(node, wc, b, relu, pool, attrs, any_taps=False):
    """The generated direct kernel with the epilogue inside (convgen's "block"), for a
    stride-1 layer the direct kernels serve (`any_taps`: whatever its taps per output):
    the accumulator rows become the block's output in one pass (LeNet's first block at
    batch 1: no separate epilogue call and no (6, 28, 28) intermediate). A batch runs
    the serial kernel or the one that splits the images over the threads, whichever ran
    faster here (`_faster`; the split only where the OpenMP workers sleep after it,
    `gemv.threads_beside_blas`). None where it does not apply."""
    from .loops import conv as _conv
    x = node.inputs[0]
    o, cg, kh, kw = wc.shape
    g = attrs["groups"]
    if any_taps:
        serves = (_conv._unit_loops(x.dtype, attrs["stride"], attrs["dilation"])
                  and 1 < kh * kw and max(kh, kw) <= _conv.DIRECT_MAX_KERNEL
                  and _conv.DIRECT_MAX_TAPS > 0)
    else:
        serves = attrs["stride"] == (1, 1) and _conv._direct(
            x.dtype, (1, 1), attrs["dilation"], cg, o // g, kh, kw)
    if not serves:
        return None
    n, _, h, wd = x.shape
    ph, pw = attrs["padding"]
    ho, wo = h + 2 * ph - kh + 1, wd + 2 * pw - kw + 1
    out_shape = (n, o, ho // 2, wo // 2) if pool else (n, o, ho, wo)
    if tuple(node.outputs[0].shape) != out_shape or min(out_shape) < 1:
        return None
    loop = _conv._direct_kernel("block", x.dtype, o // g, kh, kw)
    w2 = wc.reshape(o, -1)
    shape, dtype, empty, contiguous = tuple(x.shape), x.dtype, np.empty, np.ascontiguousarray
    from .gemv import threads_beside_blas
    if n > 1 and threads_beside_blas():
        par = _conv._direct_kernel("block_parallel", x.dtype, o // g, kh, kw)
        probe = np.zeros(shape, dtype)
        scratch = empty(out_shape, dtype)
        loop = _faster([loop, par], lambda f: f(probe, w2, b, scratch, ph, pw, relu, pool))

    def conv2d_block_direct(x, w, bias):
        if x.shape != shape or x.dtype != dtype:        # what the loop was sized for
            return block_kernel(x, w, bias, **attrs, relu=relu, pool=pool)
        out = empty(out_shape, dtype)
        loop(contiguous(x), w2, b, out, ph, pw, relu, pool)
        return out
    return conv2d_block_direct


def _faster(loops, call):
    """The one of `loops` that ran fastest here (`gemv.fastest_call`; loops[0] is today's
    kernel)."""
    from .gemv import fastest_call
    return fastest_call(loops, call)


def bind_block(node):
    """The numba provider's kernel for a `conv2d_block` node: the convolution chosen once
    for its concrete shapes (at batch > 1 oneDNN where the kernel choice measured it
    faster for the class), then the epilogue loop. A call with other shapes or dtypes,
    or a weight that is no constant, runs `block_kernel`."""
    import functools
    from ...ops.registry import OPS
    x, w, bias = node.inputs
    a = node.attrs
    conv_attrs = {"stride": tuple(a["stride"]), "padding": tuple(a["padding"]),
                  "dilation": tuple(a["dilation"]), "groups": int(a["groups"])}
    relu, pool = bool(a.get("relu", False)), bool(a.get("pool", False))
    plain = functools.partial(block_kernel, **conv_attrs, relu=relu, pool=pool)
    if (not HAVE_NUMBA or w.const is None or bias.const is None or x.dtype not in _FLOATS
            or w.dtype != x.dtype or bias.dtype != x.dtype or len(x.shape) != 4
            or not all(isinstance(d, int) for d in (*x.shape, *w.shape))
            or tuple(bias.shape) != (w.shape[0],)):
        return plain
    shape, dtype = tuple(x.shape), x.dtype
    wc = np.ascontiguousarray(w.const)
    b = np.ascontiguousarray(bias.const)
    fused = _direct_block(node, wc, b, relu, pool, conv_attrs)
    if fused is not None:
        return fused
    conv = None
    if shape[0] > 1:                     # the kernel choice's measured winner for the class
        pick = getattr(OPS["conv2d"].kernel, "pick", None)
        try:
            chosen = pick((np.zeros(shape, dtype), wc), conv_attrs) if pick else None
        except Exception:  # noqa: BLE001 - the choice could not measure: the loops
            chosen = None
        if chosen is not None:
            def conv(x, _f=chosen):
                return _f(x, wc, **conv_attrs)
    if conv is None:
        conv = _conv_for(x, wc, conv_attrs)
    if conv is None:
        kern = OPS["conv2d"].kernel

        def conv(x):
            return kern(x, wc, **conv_attrs)
    out_shape = tuple(node.outputs[0].shape)
    # what the epilogue loop reads: the convolution's (N, O, Ho, Wo), 2x the pooled size
    n, o = shape[0], w.shape[0]
    ho, wo = (2 * out_shape[2], 2 * out_shape[3]) if pool else out_shape[2:]
    probe = conv(np.zeros(shape, dtype))
    if (probe.shape[:2] != (n, o) or probe.shape[2] < ho or probe.shape[3] < wo
            or out_shape[:2] != (n, o) or b.shape != (o,)):
        return plain
    empty = np.empty

    def conv2d_block(x, w, bias):
        if x.shape != shape or x.dtype != dtype:
            return plain(x, w, bias)
        y = conv(x)
        out = empty(out_shape, dtype)
        _epilogue_pool(y, b, relu, pool, out)
        return out
    if n > 1:
        # a batch of a layer with many taps per output (LeNet's second: 150): the GEMM
        # above (BLAS's threads, the column buffer and the epilogue on one) or the direct
        # kernel with the epilogue inside (images over the threads where allowed),
        # whichever ran faster here. At batch 64 on the loaded 2-core Zen 4 (load 10,
        # 2026-12-02): GEMM 0.97 ms, direct 1.37 serial and 1.35 split, so the GEMM kept
        # it there; the direct kernel needs no 3.8 MB column buffer.
        direct = _direct_block(node, wc, b, relu, pool, conv_attrs, any_taps=True)
        if direct is not None:
            zero = np.zeros(shape, dtype)
            return _faster([conv2d_block, direct], lambda f: f(zero, None, None))
    return conv2d_block


KERNELS = {"conv2d_block": block_kernel}
