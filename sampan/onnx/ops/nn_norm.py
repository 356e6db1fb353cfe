"""Import handlers for ONNX's normalisation, softmax and dropout ops.

BatchNormalization, InstanceNormalization, LayerNormalization, GroupNormalization, LRN,
LpNormalization, MeanVarianceNormalization, Softmax, LogSoftmax, Hardmax, Dropout: each
written with sampan ops so gradients flow to the input and to scale/bias Parameters.
"""
from __future__ import annotations

import numpy as np

import sampan
import sampan.nn.functional as F

from . import onnx_op


def _chan(t, ndim):
    """A per-channel vector (C,) shaped to broadcast over (N, C, ...)."""
    return sampan.reshape(t, -1, *([1] * (ndim - 2)))


def _stash(x, stash_type):
    """The dtype statistics are computed in (ONNX stash_type: 1 = float32)."""
    if stash_type == 1 and x.dtype != np.float32 and x.dtype != np.float64:
        return sampan.cast(x, np.float32)
    return x


# ---------------------------------------------------------------------- batch norm
@onnx_op("BatchNormalization", since=1)
def batch_norm(ctx, node, x, scale, bias, mean, var):
    eps = float(node.attr("epsilon", 1e-5))
    mom = float(node.attr("momentum", 0.9))      # only the training outputs use it
    training = bool(node.attr("training_mode", 0)) if ctx.opset >= 14 else False
    if ctx.opset < 14 and node.n_outputs > 1 and ctx.opset >= 9:
        training = True                 # opsets 9-13 signal training by their extra outputs
    if x.ndim < 2:
        raise ctx.error(f"X has shape {list(x.shape)}; expected (N, C, ...)")
    if not training:
        inv = sampan.rsqrt(_chan(var, x.ndim) + eps)
        y = (x - _chan(mean, x.ndim)) * (inv * _chan(scale, x.ndim)) + _chan(bias, x.ndim)
        return y
    axes = tuple(i for i in range(x.ndim) if i != 1)
    bmean = sampan.mean(x, dim=axes)
    bvar = sampan.mean((x - _chan(bmean, x.ndim)) ** 2, dim=axes)
    y = (x - _chan(bmean, x.ndim)) * sampan.rsqrt(_chan(bvar, x.ndim) + eps) \
        * _chan(scale, x.ndim) + _chan(bias, x.ndim)
    run_mean = mean * mom + bmean * (1 - mom)
    run_var = var * mom + bvar * (1 - mom)
    if ctx.opset >= 14:
        return y, run_mean, run_var
    return y, run_mean, run_var, bmean, bvar


@onnx_op("InstanceNormalization", since=1)
def instance_norm(ctx, node, x, scale, bias):
    eps = float(node.attr("epsilon", 1e-5))
    axes = tuple(range(2, x.ndim))
    m = sampan.mean(x, dim=axes, keepdim=True)
    d = x - m
    v = sampan.mean(d * d, dim=axes, keepdim=True)
    return d * sampan.rsqrt(v + eps) * _chan(scale, x.ndim) + _chan(bias, x.ndim)


@onnx_op("LayerNormalization", since=17)
def layer_norm(ctx, node, x, scale, bias=None):
    axis = int(node.attr("axis", -1))
    if axis < 0:
        axis += x.ndim
    if not 0 <= axis < x.ndim:
        raise ctx.error(f"axis {node.attr('axis')} is out of range for X {list(x.shape)}")
    eps = float(node.attr("epsilon", 1e-5))
    stash = int(node.attr("stash_type", 1))
    only_y = all(not o for o in node.outputs[1:])
    if (only_y and axis == x.ndim - 1 and scale.ndim == 1 and (bias is None or bias.ndim == 1)
            and (stash, x.dtype) in ((1, np.float32), (11, np.float64))):
        # the usual case: sampan's layer norm row op (the graph sampan itself traces)
        return F.layer_norm(x, (x.shape[-1],), scale, bias, eps)
    xs = _stash(x, stash)
    axes = tuple(range(axis, x.ndim))
    m = sampan.mean(xs, dim=axes, keepdim=True)
    d = xs - m
    v = sampan.mean(d * d, dim=axes, keepdim=True)
    inv = sampan.rsqrt(v + eps)
    y = d * inv
    if y.dtype != x.dtype:
        y = sampan.cast(y, x.dtype)
    y = y * scale
    if bias is not None:
        y = y + bias
    return y, m, inv


@onnx_op("GroupNormalization", since=18)
def group_norm(ctx, node, x, scale, bias):
    g = int(node.attr("num_groups"))
    eps = float(node.attr("epsilon", 1e-5))
    n, c = x.shape[0], x.shape[1]
    if c % g:
        raise ctx.error(f"num_groups {g} does not divide the {c} channels of X {list(x.shape)}")
    xs = _stash(x, int(node.attr("stash_type", 1)))
    xg = sampan.reshape(xs, n, g, -1)
    m = sampan.mean(xg, dim=2, keepdim=True)
    d = xg - m
    v = sampan.mean(d * d, dim=2, keepdim=True)
    y = sampan.reshape(d * sampan.rsqrt(v + eps), *x.shape)
    if y.dtype != x.dtype:
        y = sampan.cast(y, x.dtype)
    if ctx.opset < 21 and scale.shape[0] == g and g != c:   # opset 18: one scale per group
        scale = sampan.repeat_interleave(scale, c // g, dim=0)
        bias = sampan.repeat_interleave(bias, c // g, dim=0)
    return y * _chan(scale, x.ndim) + _chan(bias, x.ndim)


@onnx_op("LRN", since=1)
def lrn(ctx, node, x):
    size = int(node.attr("size"))
    alpha = float(node.attr("alpha", 1e-4))
    beta = float(node.attr("beta", 0.75))
    bias = float(node.attr("bias", 1.0))
    c = x.shape[1]
    front, back = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = x * x
    pad = [0, 0] * (x.ndim - 2) + [front, back]
    sqp = F.pad(sq, pad, value=0.0)
    s = None
    for k in range(size):
        part = sqp[:, k:k + c]
        s = part if s is None else s + part
    return x / (s * (alpha / size) + bias) ** beta


@onnx_op("LpNormalization", since=1)
def lp_normalization(ctx, node, x):
    axis = int(node.attr("axis", -1))
    p = int(node.attr("p", 2))
    if p == 1:
        norm = sampan.sum(sampan.abs(x), dim=axis, keepdim=True)
    elif p == 2:
        norm = sampan.sqrt(sampan.sum(x * x, dim=axis, keepdim=True))
    else:
        raise ctx.error(f"p={p}; ONNX LpNormalization takes p = 1 or 2")
    safe = sampan.where(norm == 0, sampan.ones_like(norm), norm)
    return x / safe


@onnx_op("MeanVarianceNormalization", since=9)
def mean_variance_normalization(ctx, node, x):
    axes = tuple(int(a) for a in node.attr("axes", [0, 2, 3]))
    m = sampan.mean(x, dim=axes, keepdim=True)
    d = x - m
    v = sampan.mean(d * d, dim=axes, keepdim=True)
    return d / (sampan.sqrt(v) + 1e-9)


# ---------------------------------------------------------------------- softmax family
def _flat2d(ctx, node, x, fn):
    """Opsets < 13: the op works on X flattened to 2-D at `axis` (default 1)."""
    axis = int(node.attr("axis", 1))
    if axis < 0:
        axis += x.ndim
    shape = x.shape
    lead = int(np.prod(shape[:axis])) if axis else 1
    y = fn(sampan.reshape(x, lead, -1), 1)
    return sampan.reshape(y, *shape)


def _axis(ctx, node, x):
    axis = int(node.attr("axis", -1))
    if not -x.ndim <= axis < max(x.ndim, 1):
        raise ctx.error(f"axis {axis} is out of range for input {list(x.shape)}")
    return axis


@onnx_op("Softmax", since=1)
def softmax_v1(ctx, node, x):
    return _flat2d(ctx, node, x, lambda t, a: sampan.softmax(t, dim=a))


@onnx_op("Softmax", since=13)
def softmax(ctx, node, x):
    return sampan.softmax(x, dim=_axis(ctx, node, x))


@onnx_op("LogSoftmax", since=1)
def log_softmax_v1(ctx, node, x):
    return _flat2d(ctx, node, x, lambda t, a: sampan.log_softmax(t, dim=a))


@onnx_op("LogSoftmax", since=13)
def log_softmax(ctx, node, x):
    return sampan.log_softmax(x, dim=_axis(ctx, node, x))


def _hardmax(t, axis):
    n = t.shape[axis]
    idx = sampan.argmax(t, dim=axis)
    oh = sampan.one_hot(idx, n)                       # (..., n) with the axis last
    oh = sampan.moveaxis(oh, -1, axis if axis >= 0 else t.ndim + axis)
    return sampan.cast(oh, t.dtype)


@onnx_op("Hardmax", since=1)
def hardmax_v1(ctx, node, x):
    return _flat2d(ctx, node, x, _hardmax)


@onnx_op("Hardmax", since=13)
def hardmax(ctx, node, x):
    return _hardmax(x, _axis(ctx, node, x))


# ---------------------------------------------------------------------- dropout
@onnx_op("Dropout", since=1)
def dropout(ctx, node, x, ratio=None, training_mode=None):
    # the seed only picks the mask's numbers (sampan's generator draws them); the ratio
    # attribute of opsets < 12 does not matter at inference, the only mode they run in
    node.attr("seed"), node.attr("is_test"), node.attr("ratio")
    want_mask = node.n_outputs > 1 and node.outputs[1] != ""
    if ctx.opset < 12:
        # opsets < 12 run Dropout as identity (opsets 1-6's is_test=0 default is read as
        # inference too: an imported model is used for inference or fine-tuning)
        train = False
    elif training_mode is None:
        train = False
    elif ctx.is_static(training_mode):
        train = bool(ctx.static(training_mode))
    else:
        train = training_mode                       # a bool tensor: decided at run time
    if train is False or (ratio is not None and ctx.is_static(ratio)
                          and float(ctx.static(ratio)) == 0.0):
        if not want_mask:
            return x
        nan = sampan.isnan(x)                       # all True, computed from x so that a
        mask = sampan.logical_or(nan, sampan.logical_not(nan))   # dynamic dim stays dynamic
        return x, (mask if ctx.opset >= 10 else sampan.cast(mask, x.dtype))
    p = 0.5 if ratio is None else ratio
    keep = sampan.rand_like(x) >= p               # sampan's generator (seeded, traced)
    scale = 1.0 / (1.0 - p)
    y = x * sampan.cast(keep, x.dtype) * (sampan.cast(scale, x.dtype)
                                          if isinstance(scale, sampan.Tensor) else scale)
    if train is not True:                           # training_mode known only at run time
        y = sampan.where(train, y, x)
        keep = sampan.logical_or(keep, sampan.logical_not(train))
    return (y, keep) if want_mask else y
