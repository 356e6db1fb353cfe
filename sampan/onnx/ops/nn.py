"""Import handlers for ONNX's dense NN ops: MatMul, Gemm, Conv, ConvTranspose, pooling.

Everything is built from sampan ops so an imported model trains and traces. ONNX's
asymmetric pads and ``auto_pad`` are turned into an explicit `F.pad` in front of a
zero-padding sampan op, so one code path serves SAME_UPPER, SAME_LOWER, VALID and
explicit pads on 1-D, 2-D and 3-D data. Average and Lp pooling are depthwise
convolutions with a ones kernel: that gives them ONNX's dilations and the exact
``count_include_pad`` divisor (a second convolution over a mask of the real input).
"""
from __future__ import annotations

import math

import numpy as np

import sampan
import sampan.nn.functional as F

from ...ops.registry import STATE
from . import onnx_op

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_MAXPOOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d}


def _spatial(ctx, x, what="X"):
    n = x.ndim - 2
    if n not in (1, 2, 3):
        raise ctx.error(f"input {what} has shape {list(x.shape)}; expected (N, C, D1[, D2[, "
                        "D3]]) with 1 to 3 spatial dims")
    return n


def _ints(node, name, n, default):
    v = node.attr(name)
    return [default] * n if v is None else [int(a) for a in v]


def _pads(ctx, node, in_sizes, kernel, strides, dilations, ceil_mode=False):
    """(begin, end) pads per spatial dim from `pads` / `auto_pad`."""
    n = len(in_sizes)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(n):
            out = -(-in_sizes[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
                        - in_sizes[i])
            small = total // 2
            if auto == "SAME_UPPER":
                begin.append(small)
                end.append(total - small)
            else:
                begin.append(total - small)
                end.append(small)
        return begin, end
    if auto == "VALID":
        return [0] * n, [0] * n
    if auto not in ("NOTSET", ""):
        raise ctx.error(f"auto_pad {auto!r} is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")
    p = _ints(node, "pads", 2 * n, 0)
    if len(p) != 2 * n:
        raise ctx.error(f"pads has {len(p)} values; expected {2 * n} (begin and end of each "
                        "spatial dim)")
    return p[:n], p[n:]


def _fpad(begin, end):
    """ONNX (begin, end) per dim -> F.pad's list (last dim first)."""
    out = []
    for b, e in zip(reversed(begin), reversed(end)):
        out += [int(b), int(e)]
    return out


def _pad(x, begin, end, value=0.0):
    if not any(begin) and not any(end):
        return x
    return F.pad(x, _fpad(begin, end), value=value)


def _shape_value(ctx, t, what):
    """A shape input: static when it can be, else (eager only) the value it holds now: an
    output shape read from data cannot be traced into a static graph."""
    if ctx.is_static(t) or STATE.tracer is not None:
        return ctx.static(t, what)
    return np.asarray(t.numpy())


def _bias_shape(b, nsp):
    return sampan.reshape(b, -1, *([1] * nsp))


# ---------------------------------------------------------------------- matmul / gemm
@onnx_op("MatMul", since=1)
def matmul(ctx, node, a, b):
    return sampan.matmul(a, b)


@onnx_op("Gemm", since=1)
def gemm(ctx, node, a, b, c=None):
    if a.ndim != 2 or b.ndim != 2:
        raise ctx.error(f"A and B must be 2-D; got {list(a.shape)} and {list(b.shape)}")
    if node.attr("transA", 0):
        a = sampan.transpose(a, 0, 1)
    if node.attr("transB", 0):
        b = sampan.transpose(b, 0, 1)
    y = sampan.matmul(a, b)
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if alpha != 1.0:
        y = y * alpha
    if c is not None and beta != 0.0:
        y = y + (c * beta if beta != 1.0 else c)
    return y


@onnx_op("MatMulInteger", since=10)
def matmul_integer(ctx, node, a, b, a_zero=None, b_zero=None):
    a = sampan.cast(a, np.int32)
    b = sampan.cast(b, np.int32)
    if a_zero is not None:
        az = sampan.cast(a_zero, np.int32)
        if az.ndim == 1 and a.ndim >= 2 and az.shape[0] > 1:
            az = sampan.unsqueeze(az, -1)      # per-row zero point of A (M,)
        a = a - az
    if b_zero is not None:
        b = b - sampan.cast(b_zero, np.int32)
    return sampan.matmul(a, b)


# ---------------------------------------------------------------------- convolution
@onnx_op("Conv", since=1)
def conv(ctx, node, x, w, b=None):
    nsp = _spatial(ctx, x)
    if w.ndim != x.ndim:
        raise ctx.error(f"W has shape {list(w.shape)}; expected {x.ndim} dims like X "
                        f"{list(x.shape)}")
    kernel = _ints(node, "kernel_shape", nsp, 0)
    kernel = [int(k) if k else int(s) for k, s in zip(kernel, w.shape[2:])]
    strides = _ints(node, "strides", nsp, 1)
    dil = _ints(node, "dilations", nsp, 1)
    group = int(node.attr("group", 1))
    begin, end = _pads(ctx, node, list(x.shape[2:]), kernel, strides, dil)
    one = (lambda v: v[0]) if nsp == 1 else tuple
    if begin == end:      # symmetric: the conv's own padding (the graph sampan would trace)
        return _CONV[nsp](x, w, b, stride=one(strides), padding=one(begin),
                          dilation=one(dil), groups=group)
    xp = _pad(x, begin, end)
    return _CONV[nsp](xp, w, b, stride=one(strides), padding=0, dilation=one(dil),
                      groups=group)


@onnx_op("ConvTranspose", since=1)
def conv_transpose(ctx, node, x, w, b=None):
    nsp = _spatial(ctx, x)
    kernel = [int(s) for s in w.shape[2:]]
    ks = node.attr("kernel_shape")
    if ks is not None and list(ks) != kernel:
        raise ctx.error(f"kernel_shape {list(ks)} disagrees with the weight's spatial dims "
                        f"{kernel}")
    strides = _ints(node, "strides", nsp, 1)
    dil = _ints(node, "dilations", nsp, 1)
    group = int(node.attr("group", 1))
    out_pad = _ints(node, "output_padding", nsp, 0)
    in_sizes = list(x.shape[2:])
    full = [strides[i] * (in_sizes[i] - 1) + (kernel[i] - 1) * dil[i] + 1 for i in range(nsp)]
    out_shape = node.attr("output_shape")
    auto = node.attr("auto_pad", "NOTSET")
    if out_shape is not None:
        out_shape = [int(v) for v in out_shape][-nsp:]
        begin, end = [], []
        for i in range(nsp):
            total = full[i] + out_pad[i] - out_shape[i]
            if auto == "SAME_UPPER":
                begin.append(total // 2)
                end.append(total - total // 2)
            else:
                begin.append(total - total // 2)
                end.append(total // 2)
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nsp):
            total = full[i] + out_pad[i] - in_sizes[i] * strides[i]
            if auto == "SAME_UPPER":
                begin.append(total // 2)
                end.append(total - total // 2)
            else:
                begin.append(total - total // 2)
                end.append(total // 2)
    else:
        begin, end = _pads(ctx, node, in_sizes, kernel, strides, dil)
    one = (lambda v: v[0]) if nsp == 1 else tuple
    if nsp in _CONVT:
        y = _CONVT[nsp](x, w, None, stride=one(strides), padding=0, output_padding=0,
                        groups=group, dilation=one(dil))
    else:
        y = _conv_transpose_nd(x, w, strides, dil, group, kernel)
    # crop the pads (negative F.pad amounts) and extend by output_padding (zeros)
    y = _pad(y, [-p for p in begin], [op - p for op, p in zip(out_pad, end)])
    if b is not None:
        y = y + _bias_shape(b, nsp)
    return y


def _conv_transpose_nd(x, w, strides, dil, group, kernel):
    """A transposed convolution with no pads as a plain one: the input spread out by the
    stride (zeros between), padded by the dilated kernel extent, convolved with the kernel
    flipped and its in/out channels swapped per group."""
    nsp = x.ndim - 2
    for i, s in enumerate(strides):
        if s > 1:                       # insert s-1 zeros after each element of dim 2+i
            ax = 2 + i
            xe = sampan.unsqueeze(x, ax + 1)
            pad = [0, 0] * (x.ndim - ax - 1) + [0, s - 1]
            xe = F.pad(xe, pad, value=0.0)
            shp = list(x.shape)
            shp[ax] = shp[ax] * s
            x = sampan.reshape(xe, *shp)
            x = sampan.narrow(x, ax, 0, shp[ax] - (s - 1))
    edge = [(k - 1) * d for k, d in zip(kernel, dil)]
    x = _pad(x, edge, edge)
    cin, coutg = w.shape[0], w.shape[1]
    wg = sampan.reshape(w, group, cin // group, coutg, *kernel)
    wg = sampan.transpose(wg, 1, 2)                     # (g, cout/g, cin/g, k...)
    wf = sampan.flip(sampan.reshape(wg, group * coutg, cin // group, *kernel),
                     tuple(range(2, 2 + nsp)))
    return _CONV[nsp](x, wf, None, stride=tuple([1] * nsp), padding=0,
                      dilation=tuple(dil), groups=group)


# ---------------------------------------------------------------------- pooling
def _pool_geometry(ctx, node, x, nsp, with_dilation=True):
    kernel = node.attr("kernel_shape")
    if kernel is None or len(kernel) != nsp:
        raise ctx.error(f"kernel_shape {kernel} must give one size per spatial dim of X "
                        f"{list(x.shape)}")
    kernel = [int(k) for k in kernel]
    strides = _ints(node, "strides", nsp, 1)
    dil = _ints(node, "dilations", nsp, 1) if with_dilation else [1] * nsp
    ceil_mode = bool(node.attr("ceil_mode", 0))
    in_sizes = list(x.shape[2:])
    begin, end = _pads(ctx, node, in_sizes, kernel, strides, dil)
    auto = node.attr("auto_pad", "NOTSET")
    extra = []
    for i in range(nsp):
        eff = (kernel[i] - 1) * dil[i] + 1
        span = in_sizes[i] + begin[i] + end[i] - eff
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-in_sizes[i] // strides[i])
        elif ceil_mode:
            out = -(-span // strides[i]) + 1
            # a last window that would start in the end padding is dropped (as PyTorch)
            if (out - 1) * strides[i] >= in_sizes[i] + begin[i]:
                out -= 1
        else:
            out = span // strides[i] + 1
        need = (out - 1) * strides[i] + eff
        extra.append(max(0, need - (in_sizes[i] + begin[i] + end[i])))
    return kernel, strides, dil, begin, end, extra


def _ones_kernel(c, kernel, dtype):
    return sampan.Tensor(np.ones([c, 1] + list(kernel), dtype=dtype))


def _window_sum(x, kernel, strides, dil, nsp):
    one = (lambda v: v[0]) if nsp == 1 else tuple
    c = x.shape[1]
    return _CONV[nsp](x, _ones_kernel(c, kernel, x.dtype), None, stride=one(strides),
                      padding=0, dilation=one(dil), groups=c)


@onnx_op("AveragePool", since=1)
def average_pool(ctx, node, x):
    nsp = _spatial(ctx, x)
    kernel, strides, dil, begin, end, extra = _pool_geometry(ctx, node, x, nsp)
    end2 = [e + x_ for e, x_ in zip(end, extra)]
    total = _window_sum(_pad(x, begin, end2), kernel, strides, dil, nsp)
    # the divisor: how many cells of each window count (real input, plus pads when
    # count_include_pad); ceil_mode's overhang past the pads never counts
    full = [1, 1] + [n + b + e for n, b, e in zip(x.shape[2:], begin, end2)]
    if ctx.foldable(full, x.dtype):
        mask = np.ones([1, 1] + list(x.shape[2:]), dtype=x.dtype)
        if node.attr("count_include_pad", 0):
            mask = np.pad(mask, [(0, 0), (0, 0)] + list(zip(begin, end)), constant_values=1)
            mask = np.pad(mask, [(0, 0), (0, 0)] + [(0, e) for e in extra])
        else:
            mask = np.pad(mask, [(0, 0), (0, 0)] + list(zip(begin, end2)))
        mask = sampan.Tensor(mask)
    else:   # too large to make at import: ops that make it when the program runs
        mask = sampan.ones(*([1, 1] + list(x.shape[2:])), dtype=x.dtype)
        if node.attr("count_include_pad", 0):
            mask = sampan.pad(mask, ((0, 0), (0, 0)) + tuple(zip(begin, end)), value=1.0)
            mask = sampan.pad(mask, ((0, 0), (0, 0)) + tuple((0, e) for e in extra),
                              value=0.0)
        else:
            mask = sampan.pad(mask, ((0, 0), (0, 0)) + tuple(zip(begin, end2)), value=0.0)
    count = _window_sum(mask, kernel, strides, dil, nsp)
    return total / count


@onnx_op("LpPool", since=1)
def lp_pool(ctx, node, x):
    nsp = _spatial(ctx, x)
    kernel, strides, dil, begin, end, extra = _pool_geometry(ctx, node, x, nsp)
    p = float(node.attr("p", 2))
    end2 = [e + x_ for e, x_ in zip(end, extra)]
    xp = _pad(sampan.abs(x) ** p if p != 2 else x * x, begin, end2)
    s = _window_sum(xp, kernel, strides, dil, nsp)
    return sampan.sqrt(s) if p == 2 else s ** (1.0 / p)


def _lowest(dtype):
    d = np.dtype(dtype)
    if np.issubdtype(d, np.floating):
        return -math.inf
    return int(np.iinfo(d).min)


@onnx_op("MaxPool", since=1)
def max_pool(ctx, node, x):
    nsp = _spatial(ctx, x)
    kernel, strides, dil, begin, end, extra = _pool_geometry(ctx, node, x, nsp)
    end2 = [e + x_ for e, x_ in zip(end, extra)]
    xp = _pad(x, begin, end2, value=_lowest(x.dtype))
    one = (lambda v: v[0]) if nsp == 1 else tuple
    want_idx = node.n_outputs > 1 and node.outputs[1] != ""
    r = _MAXPOOL[nsp](xp, one(kernel), stride=one(strides), padding=0, dilation=one(dil),
                      ceil_mode=False, return_indices=want_idx)
    if not want_idx:
        return r
    y, idx = r
    return y, _onnx_indices(x, idx, list(xp.shape[2:]), begin, node.attr("storage_order", 0))


def _onnx_indices(x, idx, padded, begin, storage_order):
    """Per-plane indices into the padded input -> ONNX's indices into the whole tensor
    (row-major, or column-major over the spatial dims when storage_order=1)."""
    idx = sampan.cast(idx, np.int64)
    sizes = list(x.shape[2:])
    coords = []
    rem = idx
    for d in reversed(padded):           # unravel in the padded layout
        coords.append(sampan.remainder(rem, d))
        rem = sampan.floor_divide(rem, d)
    coords = coords[::-1]
    coords = [c - b for c, b in zip(coords, begin)]
    flat = None
    if storage_order:
        stride = 1
        for c, s in zip(coords, sizes):
            flat = c * stride if flat is None else flat + c * stride
            stride *= s
    else:
        for c, s in zip(coords, sizes):
            flat = c if flat is None else flat * s + c
    ch, k = x.shape[1], len(sizes)
    plane = int(np.prod(sizes))
    # the (n, c) plane offsets, with the batch index counted by ops (a dynamic batch
    # dim must not bake the example's batch size into a constant)
    one = flat[(slice(None), slice(0, 1)) + (slice(0, 1),) * k] * 0 + 1   # not foldable
    batch = sampan.cumsum(one, dim=0) - 1                               # (N, 1, 1..)
    chan = sampan.Tensor(np.arange(ch, dtype=np.int64).reshape([1, ch] + [1] * k))
    return flat + (batch * ch + chan) * plane


@onnx_op("GlobalAveragePool", since=1)
def global_average_pool(ctx, node, x):
    return sampan.mean(x, dim=tuple(range(2, x.ndim)), keepdim=True)


@onnx_op("GlobalMaxPool", since=1)
def global_max_pool(ctx, node, x):
    return sampan.amax(x, dim=tuple(range(2, x.ndim)), keepdim=True)


@onnx_op("GlobalLpPool", since=2)
def global_lp_pool(ctx, node, x):
    p = float(node.attr("p", 2))
    s = sampan.sum(sampan.abs(x) ** p, dim=tuple(range(2, x.ndim)), keepdim=True)
    return s ** (1.0 / p)


@onnx_op("MaxUnpool", since=9)
def max_unpool(ctx, node, x, indices, output_shape=None):
    nsp = _spatial(ctx, x)
    kernel = [int(k) for k in node.attr("kernel_shape")]
    strides = _ints(node, "strides", nsp, 1)
    p = _ints(node, "pads", 2 * nsp, 0)
    default = list(x.shape[:2]) + [(x.shape[2 + i] - 1) * strides[i] + kernel[i] - p[i]
                                   - p[nsp + i] for i in range(nsp)]
    idx = sampan.reshape(sampan.cast(indices, np.int64), -1)
    shape = default
    if output_shape is not None:
        shape = [int(v) for v in _shape_value(ctx, output_shape, "output_shape")]
        if shape != default:
            # indices address the default output layout; keep their coordinates in the
            # larger one (as the ONNX reference does)
            coords, rem = [], idx
            for d in reversed(default):
                coords.append(sampan.remainder(rem, d))
                rem = sampan.floor_divide(rem, d)
            idx = None
            for c, d in zip(reversed(coords), shape):
                idx = c if idx is None else idx * d + c
    total = int(np.prod(shape))
    flat = sampan.zeros(total, dtype=x.dtype)
    flat = sampan.scatter(flat, 0, idx, sampan.reshape(x, -1))
    return sampan.reshape(flat, *shape)
