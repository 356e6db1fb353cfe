"""`dense(x, w, bias, relu=)`: a float layer with its epilogue, y = x @ w + bias, then
ReLU when `relu` (issue 31). The Predictor's `fuse_layers` pass writes it in place of a
matmul against a constant weight and the bias add (and ReLU) that follow, so a served
layer is one kernel call: at batch 1 the GEMV's output is finished while it is still in
registers instead of by a second generated kernel that reads it back (two calls of
~1-2 us each on the W5 models' five layers).

    dense(x (M, K), w (K, N), bias (N,), relu=False) -> (M, N), the dtype of x

float32 or float64, all three of one dtype. ReLU keeps NaN (numpy's maximum(y, 0)). The
op table's kernel is numpy's (matmul, then the epilogue in place); the numba provider's
binder (`backends/numba/gemv.py`) packs the weight once and runs the small-GEMM loops
with the epilogue inside, or the measured GEMM and one epilogue loop for larger batches.
Only a pass writes this op (no user API, no gradient, no ONNX form: a saved program
keeps its matmul and add).
"""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError, op_error
from ._util import Sample, rng
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, Spec, defop

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _rule(x, w, bias, relu=False):
    op = "dense"
    if x.dtype not in _FLOATS or w.dtype != x.dtype or bias.dtype != x.dtype:
        raise op_error(DTypeError, op, f"x {x.dtype}, w {w.dtype}, bias {bias.dtype}",
                       "one float32 or float64 dtype for all three")
    if len(x.shape) != 2 or len(w.shape) != 2 or len(bias.shape) != 1:
        raise op_error(ShapeError, op, f"x {tuple(x.shape)}, w {tuple(w.shape)}, bias "
                       f"{tuple(bias.shape)}", "x (M, K), w (K, N), bias (N,)")
    k, n = w.shape
    if (isinstance(x.shape[1], int) and isinstance(k, int) and x.shape[1] != k) or (
            isinstance(n, int) and isinstance(bias.shape[0], int) and bias.shape[0] != n):
        raise op_error(ShapeError, op, f"x {tuple(x.shape)}, w {tuple(w.shape)}, bias "
                       f"{tuple(bias.shape)}", "x (M, K), w (K, N), bias (N,)")
    return Spec((x.shape[0], n), x.dtype)


def reference(x, w, bias, relu=False):
    """numpy: x @ w + bias (then maximum(., 0) when relu), in a new array."""
    y = np.matmul(x, w)
    y += bias
    if relu:
        np.maximum(y, 0, out=y)
    return y


def _flops(x, w, bias, relu=False):
    m, n = x.shape[0], w.shape[1]
    k = w.shape[0]
    return 2 * (m if isinstance(m, int) else 1) * (k if isinstance(k, int) else 1) * (
        n if isinstance(n, int) else 1)


def _samples():
    r = rng(431)

    def f(*s, dt=np.float32):
        return r.standard_normal(s).astype(dt)
    x = f(3, 17)
    x[1, 2] = np.nan                         # NaN stays NaN through the ReLU
    return [Sample((f(1, 33), f(33, 10), f(10)), {"relu": True}),
            Sample((x, f(17, 6), f(6)), {"relu": True}),
            Sample((f(5, 8, dt=np.float64), f(8, 21, dt=np.float64), f(21, dt=np.float64)),
                   {"relu": False})]


DENSE = defop(
    "dense", _rule, kernel=reference, grad=NOT_DIFFERENTIABLE, flops=_flops, onnx=NO_ONNX,
    samples=_samples, gemm=True,
    doc="x @ w + bias with an optional ReLU: a served layer and its epilogue in one "
        "kernel (written by the fuse_layers pass)")


# ---------------------------------------------------------------------- conv2d_block
# conv2d_block(x, w, bias, stride=, padding=, dilation=, groups=, relu=, pool=): a served
# convolution with its bias add, ReLU and a 2x2 stride-2 max-pool (`pool`) in one node,
# as `fuse_layers` writes it for conv2d -> add/fused(add, relu) -> max_pool2d: the
# epilogue and the pool read the convolution's output once, in one loop, instead of a
# generated kernel and a pool kernel each making a pass (LeNet-5's two blocks).
def _conv_parts():
    from ..ops.registry import OPS
    return OPS["conv2d"], OPS["max_pool2d"]


def _block_rule(x, w, bias, stride, padding, dilation, groups, relu=False, pool=False):
    op = "conv2d_block"
    conv, _ = _conv_parts()
    s = conv.shape_rule(x, w, stride, padding, dilation, groups)
    if bias.dtype != s.dtype or len(bias.shape) != 1 or (
            isinstance(bias.shape[0], int) and isinstance(w.shape[0], int)
            and bias.shape[0] != w.shape[0]):
        raise op_error(ShapeError, op, f"bias {bias.dtype}{tuple(bias.shape)}",
                       f"a {s.dtype} bias of one value per output channel ({w.shape[0]},)")
    if not pool:
        return s
    ho, wo = s.shape[2], s.shape[3]
    if any(isinstance(d, int) and d < 2 for d in (ho, wo)):
        raise op_error(ShapeError, op, f"a convolution output of {ho}x{wo}",
                       "at least 2x2 under the 2x2 max-pool")
    half = tuple(d // 2 if isinstance(d, int) else d for d in (ho, wo))
    return Spec(tuple(s.shape[:2]) + half, s.dtype)


POOL_ATTRS = {"kernel_size": (2, 2), "stride": (2, 2), "padding": (0, 0),
              "dilation": (1, 1), "ceil_mode": False}


def block_reference(x, w, bias, stride, padding, dilation, groups, relu=False, pool=False):
    """numpy: the conv2d op's numpy kernel, + bias per channel, ReLU, max_pool2d 2x2."""
    conv, mp = _conv_parts()
    y = conv.kernels["numpy"](x, w, stride=stride, padding=padding, dilation=dilation,
                              groups=groups)
    y = y + bias.reshape(1, -1, 1, 1)
    if relu:
        y = np.maximum(y, 0)
    if pool:
        y = mp.kernels["numpy"](y, **POOL_ATTRS)
    return np.ascontiguousarray(y)


def _block_flops(x, w, bias, stride, padding, dilation, groups, relu=False, pool=False):
    conv, _ = _conv_parts()
    return conv.flops(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)


def _block_samples():
    r = rng(432)

    def f(*s, dt=np.float32):
        return r.standard_normal(s).astype(dt)
    a = {"stride": (1, 1), "padding": (2, 2), "dilation": (1, 1), "groups": 1}
    x = f(2, 1, 12, 12)
    x[1, 0, 3, 4] = np.nan
    return [Sample((x, f(4, 1, 5, 5), f(4)), dict(a, relu=True, pool=True)),
            Sample((f(1, 6, 9, 9), f(5, 6, 3, 3), f(5)),
                   {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 1,
                    "relu": True, "pool": True}),
            Sample((f(1, 4, 7, 6, dt=np.float64), f(6, 2, 3, 3, dt=np.float64),
                    f(6, dt=np.float64)),
                   {"stride": (1, 2), "padding": (1, 1), "dilation": (1, 1), "groups": 2,
                    "relu": False, "pool": False})]


CONV2D_BLOCK = defop(
    "conv2d_block", _block_rule, kernel=block_reference, grad=NOT_DIFFERENTIABLE,
    flops=_block_flops, onnx=NO_ONNX, samples=_block_samples, gemm=True,
    doc="conv2d + per-channel bias, optional ReLU and 2x2 max-pool: a served conv block "
        "in one kernel (written by the fuse_layers pass)")
