"""conv_transpose2d: the adjoint of conv2d (and conv2d's input gradient: one op, one IR
spelling, ONNX ConvTranspose). Its kernel runs the GEMM and accumulates the kh*kw column
planes into the output (col2im). The layout choices and helpers it shares with conv2d are
in `conv`, which re-exports everything here."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError, op_error
from ..tensor import apply
from . import _convloops as _loops
from ._util import Sample, randf, rng
from .conv import (CONV2D, CONV2D_GRAD_WEIGHT, _any_loops, _attrs, _bias, _cattrs, _check_4d,
                   _check_attrs, _check_float, _check_out, _chunk, _crop, _direct, _direct_kernel,
                   _direct_strided, _f32, _numel, _one_gemm, _pair, _samples_last, _t, _tout_dim,
                   _unit_loops, _upsample, _win, checked_apply)
from .registry import Spec, defop


# ---------------------------------------------------------------------- conv_transpose2d
def _ct_rule(x, w, stride, padding, output_padding, dilation, groups):
    op = "conv_transpose2d"
    d = _check_float(op, x, w)
    _check_4d(op, "input", x)
    _check_4d(op, "weight", w)
    _check_attrs(op, stride, padding, dilation, groups)
    ci, cog, kh, kw = w.shape
    if x.shape[1] != ci or ci % groups:
        raise op_error(ShapeError, op, f"input {tuple(x.shape)}, weight {tuple(w.shape)}, "
                       f"groups={groups}", "input channels == weight.shape[0], divisible by "
                       "groups (weight is (in, out/groups, kh, kw))")
    if any(a < 0 or a >= s for a, s in zip(output_padding, stride)):
        raise op_error(ShapeError, op, f"output_padding={output_padding} with stride={stride}",
                       "0 <= output_padding < stride")
    hw = tuple(_tout_dim(n, k, s, p, a, dd) for n, k, s, p, a, dd in
               zip(x.shape[2:], (kh, kw), stride, padding, output_padding, dilation))
    _check_out(op, x, hw)
    return Spec((x.shape[0], cog * groups) + hw, d)


def _ct_kernel(x, w, stride, padding, output_padding, dilation, groups):
    n, ci, h, wd = x.shape
    _, cog, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = (h - 1) * sh - 2 * ph + dh * (kh - 1) + output_padding[0] + 1
    wo = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + output_padding[1] + 1
    cig = ci // groups
    direct_ok = ph < kh and pw < kw and ho > 0 and wo > 0   # the padding k - 1 - p >= 0
    if direct_ok and _direct(x.dtype, stride, dilation, cig, cog, kh, kw,
                             n * cog * groups * ho * wo):
        # stride 1: the correlation of x, padded by k - 1 - p, with the flipped kernel,
        # each group's (in, out) weight transposed to (out, in)
        wf = w.reshape(groups, cig, cog, kh, kw)[..., ::-1, ::-1].transpose(0, 2, 1, 3, 4)
        wf = np.ascontiguousarray(wf).reshape(groups * cog, cig * kh * kw)
        y = np.empty((n, groups * cog, ho, wo), x.dtype)
        _direct_kernel("forward", x.dtype, cog, kh, kw)(np.ascontiguousarray(x), wf, y,
                                                        kh - 1 - ph, kw - 1 - pw, 1, 1)
        return y
    hu = ((h - 1) * sh + 1 + output_padding[0], (wd - 1) * sw + 1 + output_padding[1])
    if direct_ok and _direct_strided(x.dtype, stride, dilation, cig, cog, kh, kw,
                                     n * cog * groups * ho * wo):
        return _ct_kernel(_upsample(x, stride, hu), w, (1, 1), padding, (0, 0), dilation,
                          groups)
    if _one_gemm(x.dtype, stride, dilation, groups, h * wd) and (kh, kw) != (1, 1):
        col = w.reshape(ci, cog * kh * kw).T @ _samples_last(x)      # (K, N*L)
        buf = np.empty((n, cog, h + kh - 1, wd + kw - 1), col.dtype)
        _loops.col2im_rows(col, h, wd, kh, kw, buf)
        return _crop(buf, ph, pw, ho, wo)
    b = _chunk(n, cog * groups * kh * kw * h * wd * x.dtype.itemsize)
    if b < n:
        y = np.empty((n, cog * groups, ho, wo), x.dtype)
        for b0 in range(0, n, b):
            y[b0:b0 + b] = _ct_kernel(x[b0:b0 + b], w, stride, padding, output_padding,
                                      dilation, groups)
        return y
    wm = w.reshape(groups, ci // groups, cog * kh * kw).transpose(0, 2, 1)
    col = np.matmul(wm, x.reshape(n, groups, ci // groups, h * wd))   # (N, g, K, L)
    col = col.reshape(n, cog * groups, kh, kw, h, wd)
    if kh == kw == 1 and stride == (1, 1) and padding == (0, 0) and ho == h and wo == wd:
        return col.reshape(n, cog * groups, h, wd)
    if _unit_loops(col.dtype, stride, dilation):
        buf = np.empty((n, cog * groups, h + kh - 1, wd + kw - 1), col.dtype)
        _loops.col2im(col.reshape(n, cog * groups * kh * kw, h * wd), h, wd, kh, kw, buf)
        return _crop(buf, ph, pw, ho, wo)
    hb = max((h - 1) * sh + dh * (kh - 1) + 1, ph + ho)
    wb = max((wd - 1) * sw + dw * (kw - 1) + 1, pw + wo)
    if _any_loops(col.dtype):
        buf = np.empty((n, cog * groups, hb, wb), col.dtype)
        _loops.col2im_strided(col.reshape(n, cog * groups * kh * kw, h * wd), h, wd, kh, kw,
                              sh, sw, dh, dw, buf)
        return np.ascontiguousarray(buf[:, :, ph:ph + ho, pw:pw + wo])
    buf = np.zeros((n, cog * groups, hb, wb), col.dtype)
    for i in range(kh):
        for j in range(kw):
            buf[_win(i, j, h, wd, stride, dilation)] += col[:, :, i, j]
    return np.ascontiguousarray(buf[:, :, ph:ph + ho, pw:pw + wo])


def _ct_grad(g, y, x, w, stride, padding, output_padding, dilation, groups):
    attrs = _attrs(stride, padding, dilation, groups)
    gx = gw = None
    if x.requires_grad:
        gx = apply(CONV2D, (g, w), attrs)
    if w.requires_grad:
        gw = apply(CONV2D_GRAD_WEIGHT, (g, x), {**attrs, "kernel_size": tuple(w.shape[2:])})
    return gx, gw


def _ct_flops(x, w, **attrs):
    return 2 * _numel(x.shape) * _numel(w.shape[1:])


def _ctattrs(stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    return {**_cattrs(stride, padding, dilation, groups), "output_padding": _pair(output_padding)}


def _ct_samples():
    r = rng(61)
    return [Sample((randf(r, 2, 3, 4, 5), randf(r, 3, 2, 3, 3)), _ctattrs()),
            Sample((randf(r, 2, 4, 3, 4), randf(r, 4, 3, 3, 2)), _ctattrs(2, 1, 1)),
            Sample((randf(r, 1, 4, 4, 3), randf(r, 4, 2, 2, 3)),
                   _ctattrs((2, 3), (0, 1), (1, 2), 1, 2)),
            Sample((randf(r, 1, 2, 3, 3), randf(r, 2, 2, 3, 3)), _ctattrs(1, 2, 0, 2)),
            Sample((randf(r, 0, 3, 4, 4), randf(r, 3, 2, 3, 3)), _ctattrs(2))]


CONV_TRANSPOSE2D = defop("conv_transpose2d", _ct_rule, kernel=_f32(_ct_kernel), grad=_ct_grad,
                         flops=_ct_flops, onnx="ConvTranspose", samples=_ct_samples, amp="lower",
                         gemm=True)


def conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """Transposed 2-d convolution (the adjoint of conv2d); weight (in, out/groups, kh, kw).
    PyTorch's argument order (groups before dilation).

    Example::

        >>> sampan.conv_transpose2d(sampan.randn(1, 4, 5, 5), sampan.randn(4, 2, 3, 3),
        ...                         stride=2).shape
        (1, 2, 11, 11)
    """
    from .elementwise import operands
    x, w = operands(_t(x), _t(w))
    y = checked_apply(CONV_TRANSPOSE2D, (x, w), _ctattrs(stride, padding, output_padding,
                                                         dilation, int(groups)))
    return _bias(y, b, 4, CONV_TRANSPOSE2D)
