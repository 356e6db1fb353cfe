"""1-d pooling and transposed convolution over (N, C, L) or (C, L) input: the 2-d ops
with a unit H dim, so they share those ops' kernels, gradients and checks. Indices of
max pooling are positions along L (the flat index of a (1, L) plane)."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError, op_error
from ..tensor import Tensor


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _one(v, op, name):
    if isinstance(v, (int, np.integer)):
        return int(v)
    v = tuple(v)
    if len(v) != 1:
        raise op_error(ShapeError, op, f"{name}={v}", "an int or a 1-tuple")
    return int(v[0])


def _ncl(x, op):
    from .shape import unsqueeze
    x = _t(x)
    if x.ndim not in (2, 3):
        raise op_error(ShapeError, op, f"input of shape {tuple(x.shape)}",
                       "a 2-d (C, L) or 3-d (N, C, L) input")
    return unsqueeze(x, -2)


def _sq(y):
    from .shape import squeeze
    if isinstance(y, tuple):
        return tuple(squeeze(v, -2) for v in y)
    return squeeze(y, -2)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """Max over windows along L (PyTorch's signature; indices are positions along L).

    Example::

        >>> F.max_pool1d(sampan.randn(2, 3, 8), 2).shape
        (2, 3, 4)
    """
    from .pool import max_pool2d
    op = "max_pool1d"
    k = _one(kernel_size, op, "kernel_size")
    s = k if stride is None or stride == () else _one(stride, op, "stride")
    return _sq(max_pool2d(_ncl(input, op), (1, k), (1, s), (0, _one(padding, op, "padding")),
                          (1, _one(dilation, op, "dilation")), ceil_mode, return_indices))


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True):
    """Mean over windows along L (PyTorch's signature).

    Example::

        >>> F.avg_pool1d(sampan.randn(2, 3, 8), 2).shape
        (2, 3, 4)
    """
    from .pool import avg_pool2d
    op = "avg_pool1d"
    k = _one(kernel_size, op, "kernel_size")
    s = k if stride is None or stride == () else _one(stride, op, "stride")
    return _sq(avg_pool2d(_ncl(input, op), (1, k), (1, s), (0, _one(padding, op, "padding")),
                          ceil_mode, count_include_pad))


def adaptive_avg_pool1d(input, output_size):
    """Average pooling along L to `output_size` windows (PyTorch's adaptive windows).

    Example: ``F.adaptive_avg_pool1d(sampan.randn(2, 3, 7), 3).shape`` is (2, 3, 3)"""
    from .pool import adaptive_avg_pool2d
    o = _one(output_size, "adaptive_avg_pool1d", "output_size")
    return _sq(adaptive_avg_pool2d(_ncl(input, "adaptive_avg_pool1d"), (1, o)))


def adaptive_max_pool1d(input, output_size, return_indices=False):
    """Max over PyTorch's adaptive windows along L; with return_indices also the int64
    position of each maximum.

    Example: ``F.adaptive_max_pool1d(sampan.randn(2, 3, 7), 3).shape`` is (2, 3, 3)"""
    from .pool_index import adaptive_max_pool2d
    o = _one(output_size, "adaptive_max_pool1d", "output_size")
    return _sq(adaptive_max_pool2d(_ncl(input, "adaptive_max_pool1d"), (1, o),
                                   return_indices))


def max_unpool1d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    """The partial inverse of max_pool1d (values back at their positions along L).

    Example: ``F.max_unpool1d(*F.max_pool1d(x, 2, return_indices=True), 2)``"""
    from .pool_index import max_unpool2d
    op = "max_unpool1d"
    k = _one(kernel_size, op, "kernel_size")
    s = k if stride is None else _one(stride, op, "stride")
    size = None if output_size is None else (1, int(tuple(output_size)[-1]))
    return _sq(max_unpool2d(_ncl(input, op), _ncl(indices, op), (1, k), (1, s),
                            (0, _one(padding, op, "padding")), size))


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups=1, dilation=1):
    """Transposed 1-d convolution (PyTorch's signature); weight (in, out/groups, k).

    Example::

        >>> F.conv_transpose1d(sampan.randn(1, 4, 5), sampan.randn(4, 2, 3), stride=2).shape
        (1, 2, 11)
    """
    from .conv_transpose import conv_transpose2d
    from .shape import unsqueeze
    op = "conv_transpose1d"
    w = _t(weight)
    if w.ndim != 3:
        raise op_error(ShapeError, op, f"weight of shape {tuple(w.shape)}",
                       "a 3-d weight (in, out/groups, k)")
    x = _t(input)
    if x.ndim != 3:
        raise op_error(ShapeError, op, f"input of shape {tuple(x.shape)}",
                       "a 3-d (N, C, L) input")
    y = conv_transpose2d(unsqueeze(x, 2), unsqueeze(w, 2), bias, (1, _one(stride, op, "stride")),
                         (0, _one(padding, op, "padding")),
                         (0, _one(output_padding, op, "output_padding")), groups,
                         (1, _one(dilation, op, "dilation")))
    return _sq(y)


def _lp(x, norm_type, area, pooled):
    """PyTorch's lp_pool tail: (sign(m) * relu(|m|) * area) ** (1 / p) of the pooled
    mean m of x ** p."""
    from .elementwise import abs as _abs
    from .elementwise import mul, relu, sign
    from .elementwise import pow as _pow
    m = pooled(_pow(x, float(norm_type)))
    return _pow(mul(mul(sign(m), relu(_abs(m))), float(area)), 1.0 / float(norm_type))


def lp_pool1d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    """Power-average pooling along L: (sum of x**p over each window) ** (1/p).

    Example: ``F.lp_pool1d(sampan.rand(1, 2, 7), 2, 3).shape`` is (1, 2, 2)"""
    k = _one(kernel_size, "lp_pool1d", "kernel_size")
    return _lp(_t(input), norm_type, k,
               lambda v: avg_pool1d(v, k, stride, 0, ceil_mode))


def lp_pool2d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    """Power-average pooling over (H, W) windows: (sum of x**p) ** (1/p).

    Example: ``F.lp_pool2d(sampan.rand(1, 2, 4, 4), 2, 2).shape`` is (1, 2, 2, 2)"""
    from .conv import _pair
    from .pool import avg_pool2d
    kh, kw = _pair(kernel_size, "lp_pool2d", "kernel_size")
    return _lp(_t(input), norm_type, kh * kw,
               lambda v: avg_pool2d(v, (kh, kw), stride, 0, ceil_mode))


def _register():
    from ._util import Sample, randf, rng
    from .composite import COMPOSITES
    COMPOSITES["lp_pool2d"] = (lp_pool2d, lambda: [
        Sample((randf(rng(150), 1, 2, 4, 5, low=0.2, high=2.0),),
               {"norm_type": 2, "kernel_size": 2, "ceil_mode": True})])
    COMPOSITES["lp_pool1d"] = (lp_pool1d, lambda: [
        Sample((randf(rng(151), 1, 2, 7, low=0.2, high=2.0),),
               {"norm_type": 3, "kernel_size": 3, "stride": 2})])


_register()
