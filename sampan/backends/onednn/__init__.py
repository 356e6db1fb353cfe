"""The oneDNN backend: a kernel table by op name over oneDNN's C API (ctypes, the
`onednn-cpu-gomp` package; see `_lib.py` and `primitives.py`).

`KERNELS[op]` takes the same arrays and attributes as the op's numpy kernel and returns
the same result; it raises `Unsupported` for a call oneDNN does not serve (a dtype, a
layout, an attribute), which the kernel chooser (`sampan.backends.choice`) answers with
the numpy kernel. Importing this module loads nothing: `available()` loads the library
on first use.

Example::

    >>> from sampan.backends import onednn
    >>> onednn.available() in (True, False)
    True
"""
from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...ops.engine import EngineError, register_engine
from . import _lib
from .primitives import Unsupported

_F = (np.dtype(np.float32), _dt.bfloat16)
_I8 = (np.dtype(np.int8), np.dtype(np.uint8))


def available() -> bool:
    """Whether oneDNN's library is installed and loads on this machine."""
    return _lib.lib() is not None


def why_unavailable() -> str:
    return _lib.why_unavailable()


def version() -> str:
    return _lib.version()


def _P():
    if _lib.lib() is None:
        raise Unsupported(_lib.why_unavailable())
    from . import primitives
    return primitives


def _float(*arrays):
    d = arrays[0].dtype
    if d not in _F or any(a.dtype != d for a in arrays):
        raise Unsupported(f"dtype {d}")


def matmul(a, b, out=None):
    """The matmul op (batch broadcasting) in float32 or bfloat16."""
    _float(a, b)
    return _P().matmul(a, b, out=out)


def linear(x, w, bias=None, post_ops=(), out=None):
    """x @ w + bias with elementwise/binary post-ops in one primitive (an epilogue the
    fusion pass can hand over): post_ops as in `primitives.matmul`."""
    _float(x, w)
    return _P().matmul(x, w, bias=bias, post_ops=tuple(post_ops), out=out)


def conv2d(x, w, stride, padding, dilation, groups):
    _float(x, w)
    return _P().conv2d(x, w, tuple(stride), tuple(padding), tuple(dilation), int(groups))


def conv_transpose2d(x, w, stride, padding, output_padding, dilation, groups):
    """conv_transpose2d (the input gradient of conv2d) as oneDNN's convolution backward
    data: its weight (in, out/g, kh, kw) is the forward convolution's (O, I/g, kh, kw)."""
    _float(x, w)
    n, ci, h, wd = x.shape
    kh, kw = w.shape[2:]
    hw = tuple((n_ - 1) * s - 2 * p + d * (k - 1) + op + 1 for n_, s, p, d, k, op in zip(
        (h, wd), stride, padding, dilation, (kh, kw), output_padding))
    if min(hw) < 1:
        raise Unsupported("empty output")
    return _P().conv2d_backward_data(x, w, hw, tuple(stride), tuple(padding),
                                     tuple(dilation), int(groups))


def conv2d_grad_weight(x, g, kernel_size, stride, padding, dilation, groups):
    _float(x, g)
    return _P().conv2d_backward_weights(x, g, tuple(kernel_size), tuple(stride),
                                        tuple(padding), tuple(dilation), int(groups))


def _pool_out(x, kernel_size, stride, padding, dilation, ceil_mode):
    from ...ops.pool import _hw
    return _hw(x, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode=False):
    _float(x)
    hw = _pool_out(x, kernel_size, stride, padding, dilation, ceil_mode)
    return _P().pool2d(x, "max", tuple(kernel_size), tuple(stride), tuple(padding), hw,
                       tuple(dilation))


def avg_pool2d(x, kernel_size, stride, padding, count_include_pad, ceil_mode=False,
               divisor_override=0):
    _float(x)
    if ceil_mode or divisor_override:
        raise Unsupported("ceil_mode / divisor_override")   # PyTorch's divisors differ
    hw = _pool_out(x, kernel_size, stride, padding, (1, 1), False)
    return _P().pool2d(x, "avg_include" if count_include_pad else "avg_exclude",
                       tuple(kernel_size), tuple(stride), tuple(padding), hw)


def matmul_integer(a, b, a_zero_point, b_zero_point):
    """int8 x int8 -> int32 with zero points: u8s8s32 / s8s8s32 GEMM on oneDNN, the
    activation zero point taken out exactly as za * (column sums of b); a weight zero
    point other than 0 keeps the numpy kernel."""
    if a.dtype not in _I8 or b.dtype != np.int8 or np.any(np.asarray(b_zero_point)):
        raise Unsupported("int8 dtypes / weight zero point")
    y = _P().matmul(a, b)
    za = int(a_zero_point)
    if za:
        y -= np.int32(za) * b.sum(0, dtype=np.int32)
    return y


class RegionFallback:
    """The runner of an engine node of engine "onednn" where the onednn provider does not
    bind it (a provider list without "onednn", eager calls of the node): onnxruntime runs
    its body, the same op-table ops (`blocked.py` runs it in oneDNN's layouts)."""

    def __init__(self, model_bytes, n_inputs, threads=None):
        try:
            from ..onnxruntime import OrtRunner
            self.run = OrtRunner(model_bytes, n_inputs, threads).run
        except ImportError as e:
            raise EngineError(f"engine 'onednn' outside the onednn provider needs "
                              f"onnxruntime: {e}") from None


register_engine("onednn", RegionFallback)

KERNELS = {"matmul": matmul, "conv2d": conv2d, "conv_transpose2d": conv_transpose2d,
           "conv2d_grad_weight": conv2d_grad_weight, "max_pool2d": max_pool2d,
           "avg_pool2d": avg_pool2d, "matmul_integer": matmul_integer}

__all__ = ["KERNELS", "Unsupported", "available", "linear", "version", "why_unavailable"]
