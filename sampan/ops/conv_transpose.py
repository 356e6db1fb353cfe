"""conv_transpose2d: the adjoint of conv2d (and conv2d's input gradient: one op, one IR
spelling, ONNX ConvTranspose). Its kernel runs the GEMM and accumulates the kh*kw column
planes into the output (col2im). The helpers it shares with conv2d are in
`conv`, which re-exports everything here; where numba is, the loops and direct kernels of
`backends/numba/loops/conv.py` run it."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError, op_error
from ..tensor import apply
from ._util import Sample, randf, rng
from .conv import (CONV2D, CONV2D_GRAD_WEIGHT, _attrs, _bias, _cattrs, _check_4d, _check_attrs,
                   _check_float, _check_out, _chunk, _f32, _numel, _pair, _t, _tout_dim, _win,
                   checked_apply)
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


def _col2im_numpy(col, h, wd, stride, padding, dilation, ho, wo):
    """The output (N, O, ho, wo) of columns (N, O, kh, kw, h, wd): each tap's plane added
    into a strided slice of a padded buffer, then cropped."""
    n, o, kh, kw = col.shape[:4]
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    hb = max((h - 1) * sh + dh * (kh - 1) + 1, ph + ho)
    wb = max((wd - 1) * sw + dw * (kw - 1) + 1, pw + wo)
    buf = np.zeros((n, o, hb, wb), col.dtype)
    for i in range(kh):
        for j in range(kw):
            buf[_win(i, j, h, wd, stride, dilation)] += col[:, :, i, j]
    return np.ascontiguousarray(buf[:, :, ph:ph + ho, pw:pw + wo])


def _ct_cols(x, w, stride, padding, output_padding, dilation, groups, col2im):
    """conv_transpose2d as one batched GEMM into columns and `col2im` (the numpy or the
    numba accumulation) into the output; large batches in chunks of images."""
    n, ci, h, wd = x.shape
    _, cog, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = (h - 1) * sh - 2 * ph + dh * (kh - 1) + output_padding[0] + 1
    wo = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + output_padding[1] + 1
    b = _chunk(n, cog * groups * kh * kw * h * wd * x.dtype.itemsize)
    if b < n:
        y = np.empty((n, cog * groups, ho, wo), x.dtype)
        for b0 in range(0, n, b):
            y[b0:b0 + b] = _ct_cols(x[b0:b0 + b], w, stride, padding, output_padding,
                                    dilation, groups, col2im)
        return y
    wm = w.reshape(groups, ci // groups, cog * kh * kw).transpose(0, 2, 1)
    col = np.matmul(wm, x.reshape(n, groups, ci // groups, h * wd))   # (N, g, K, L)
    col = col.reshape(n, cog * groups, kh, kw, h, wd)
    if kh == kw == 1 and tuple(stride) == (1, 1) and tuple(padding) == (0, 0) \
            and ho == h and wo == wd:
        return col.reshape(n, cog * groups, h, wd)
    return col2im(col, h, wd, stride, padding, dilation, ho, wo)


def _ct_kernel(x, w, stride, padding, output_padding, dilation, groups):
    return _ct_cols(x, w, stride, padding, output_padding, dilation, groups, _col2im_numpy)


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
