"""3-d convolution and pooling (NCDHW) as composites over window taps.

Every kernel tap is one strided slice of the padded input; the taps stacked on a new
axis (N, C, K, *out) are the im2col columns. conv3d is one batched matmul of those
columns with the weight; max_pool3d gathers each window's first maximum (its argmax
over the taps, so the gradient goes to that element alone, as PyTorch's); avg_pool3d
sums the taps and divides by PyTorch's per-window divisor. No kernel of their own:
slices, stacks, matmuls and gathers carry the gradients and trace to graph nodes, and no
index can leave the padded input. Correctness first: fine for the small volumes these
layers meet in tests and 3-d toy models; a large 3-d network wants a real kernel.
"""
from __future__ import annotations

import itertools

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ..tensor import Tensor
from ._util import Sample, randf, rng
from .pool import _out_len


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _triple(v, op, name):
    if isinstance(v, (int, np.integer)):
        return (int(v),) * 3
    v = tuple(int(a) for a in v)
    if len(v) != 3:
        raise op_error(ShapeError, op, f"{name}={v}", "an int or three ints")
    return v


def _ncdhw(x, op):
    from .shape import unsqueeze
    x = _t(x)
    if x.ndim == 4:
        return unsqueeze(x, 0), True
    if x.ndim != 5:
        raise op_error(ShapeError, op, f"input of shape {tuple(x.shape)}",
                       "a 4-d (C, D, H, W) or 5-d (N, C, D, H, W) input")
    return x, False


def _back(y, sq):
    from .shape import squeeze
    return squeeze(y, 0) if sq else y


def _taps(x, k, s, p, d, out, value, extra=(0, 0, 0)):
    """(N, C, K, *out): every tap of the windows over x padded by p (and `extra` on the
    right for ceil_mode), with `value` in the padding."""
    from .shape import getitem, pad, stack
    if any(p) or any(extra):
        pads = ((0, 0), (0, 0)) + tuple((a, a + e) for a, e in zip(p, extra))
        x = pad(x, pads, value=value)
    taps = []
    for t in itertools.product(*[range(n) for n in k]):
        idx = (slice(None), slice(None)) + tuple(
            slice(ti * di, ti * di + si * (o - 1) + 1, si) for ti, di, si, o in zip(t, d, s, out))
        taps.append(getitem(x, idx))
    return stack(taps, 2)


def _check_out(op, x, out):
    if any(o < 1 for o in out):
        raise op_error(ShapeError, op, f"input of shape {tuple(x.shape)}",
                       f"an input large enough for the kernel (output would be {out})")


def _window_args(op, x, kernel_size, stride, padding, dilation, ceil_mode, pool=True):
    k = _triple(kernel_size, op, "kernel_size")
    s = k if stride is None or (pool and stride == ()) else _triple(stride, op, "stride")
    p, d = _triple(padding, op, "padding"), _triple(dilation, op, "dilation")
    if min(k) < 1 or min(s) < 1 or min(d) < 1 or min(p) < 0:
        raise op_error(ShapeError, op, f"kernel_size={k}, stride={s}, padding={p}, "
                       f"dilation={d}", "kernel, stride, dilation >= 1 and padding >= 0")
    if pool and any(2 * a > b for a, b in zip(p, k)):
        raise op_error(ShapeError, op, f"kernel_size={k}, padding={p}",
                       "padding at most half the kernel size")
    out = tuple(_out_len(n, a, b, c, e, ceil_mode) for n, a, b, c, e in
                zip(x.shape[2:], k, s, p, d))
    _check_out(op, x, out)
    extra = tuple(max(0, (o - 1) * b + e * (a - 1) + 1 - (n + 2 * c)) for n, a, b, c, e, o in
                  zip(x.shape[2:], k, s, p, d, out))
    return k, s, p, d, out, extra


# ---------------------------------------------------------------------- conv3d
def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """3-d convolution (cross-correlation) over (N, C, D, H, W) input; weight
    (out, in/groups, kd, kh, kw); padding ints, "valid" or "same" (stride 1).

    Example::

        >>> F.conv3d(sampan.randn(1, 2, 4, 4, 4), sampan.randn(3, 2, 3, 3, 3)).shape
        (1, 3, 2, 2, 2)
    """
    from .elementwise import add, operands
    from .linalg import matmul
    from .shape import pad, reshape
    op = "conv3d"
    x, sq = _ncdhw(input, op)
    x, w = operands(x, _t(weight))
    if not _dt.is_floating(x.dtype):
        raise op_error(DTypeError, op, f"dtype {x.dtype}", "a floating dtype")
    if w.ndim != 5 or x.shape[1] != w.shape[1] * groups or w.shape[0] % groups:
        raise op_error(ShapeError, op, f"input {tuple(x.shape)}, weight {tuple(w.shape)}, "
                       f"groups={groups}", "a 5-d weight (O, C/groups, kd, kh, kw) with C == "
                       "weight.shape[1] * groups and O divisible by groups")
    dil = _triple(dilation, op, "dilation")
    if isinstance(padding, str):
        if padding not in ("same", "valid") or (padding == "same" and
                                                _triple(stride, op, "stride") != (1, 1, 1)):
            raise op_error(ShapeError, op, f"padding={padding!r}, stride={stride}",
                           "'valid', or 'same' with stride 1, or ints")
        if padding == "same":
            tot = [e * (k - 1) for k, e in zip(w.shape[2:], dil)]
            x = pad(x, ((0, 0), (0, 0)) + tuple((t // 2, t - t // 2) for t in tot))
        padding = 0
    k, s, p, d, out, _ = _window_args(op, x, tuple(w.shape[2:]), stride, padding, dil, False,
                                      pool=False)
    n, c = x.shape[:2]
    o = w.shape[0]
    cols = reshape(_taps(x, k, s, p, d, out, 0.0), (n, groups, c // groups * int(np.prod(k)),
                                                    int(np.prod(out))))
    y = matmul(reshape(w, (groups, o // groups, -1)), cols)           # (N, g, O/g, L)
    y = reshape(y, (n, o) + out)
    if bias is not None:       # an input of the conv in PyTorch: it follows matmul's policy
        from .linalg import MATMUL
        from .modes import as_inputs_of
        (bias,) = as_inputs_of(MATMUL, _t(bias))
        y = add(y, reshape(bias, (1, o, 1, 1, 1)))
    return _back(y, sq)


# ---------------------------------------------------------------------- pooling
def _lowest(dtype):
    return float("-inf") if dtype.kind == "f" else float(np.iinfo(dtype).min)


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """Max over kd x kh x kw windows (padding counts as -inf); PyTorch's signature, its
    indices flat per (D, H, W) volume.

    Example::

        >>> F.max_pool3d(sampan.randn(1, 2, 4, 4, 4), 2).shape
        (1, 2, 2, 2, 2)
    """
    from .index import index_select, take_along_axis
    from .reduce import argmax
    from .shape import reshape, squeeze
    op = "max_pool3d"
    x, sq = _ncdhw(input, op)
    if x.dtype == np.bool_ or not (_dt.is_floating(x.dtype) or _dt.is_integer(x.dtype)):
        raise op_error(DTypeError, op, f"dtype {x.dtype}", "a numeric dtype")
    k, s, p, d, out, extra = _window_args(op, x, kernel_size, stride, padding, dilation,
                                          ceil_mode)
    cols = _taps(x, k, s, p, d, out, _lowest(x.dtype), extra)        # (N, C, K, *out)
    arg = argmax(cols.detach(), 2, keepdims=True)
    y = squeeze(take_along_axis(cols, arg, 2), 2)
    if not return_indices:
        return _back(y, sq)
    # the input position of tap t at output position q: base[q] + offset[t]
    dd, hh, ww = x.shape[2:]
    grids = np.meshgrid(*[np.arange(o) * b - c for o, b, c in zip(out, s, p)], indexing="ij")
    base = (grids[0] * hh + grids[1]) * ww + grids[2]
    offs = np.array([(t0 * d[0] * hh + t1 * d[1]) * ww + t2 * d[2]
                     for t0, t1, t2 in itertools.product(*[range(n) for n in k])], np.int64)
    from .elementwise import add
    idx = index_select(Tensor(offs), reshape(arg, (-1,)), 0)
    idx = add(reshape(idx, tuple(y.shape)), Tensor(base.astype(np.int64)))
    return _back(y, sq), _back(idx, sq)


def _divisor(in_sizes, out, k, s, p, count_include_pad, divisor_override):
    """PyTorch's per-window divisor (as avg_pool2d's, in three dims)."""
    if divisor_override:
        return np.full(out, float(divisor_override))
    parts = []
    for n, o, a, b, c in zip(in_sizes, out, k, s, p):
        start = np.arange(o) * b - c
        end = np.minimum(start + a, n + c)
        parts.append(end - start if count_include_pad else
                     np.minimum(end, n) - np.maximum(start, 0))
    return np.einsum("i,j,k->ijk", *parts).astype(np.float64)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """Mean over kd x kh x kw windows with PyTorch's ceil_mode, count_include_pad and
    divisor_override.

    Example::

        >>> F.avg_pool3d(sampan.randn(1, 2, 4, 4, 4), 2).shape
        (1, 2, 2, 2, 2)
    """
    from .elementwise import cast, div
    from .reduce import sum as _sum
    op = "avg_pool3d"
    x, sq = _ncdhw(input, op)
    if not _dt.is_floating(x.dtype):
        x = cast(x, _dt.get_default_dtype())
    if divisor_override is not None and (isinstance(divisor_override, bool) or not isinstance(
            divisor_override, (int, np.integer)) or divisor_override < 1):
        raise op_error(SampanValueError, op, f"divisor_override={divisor_override!r}",
                       "a positive int or None")
    k, s, p, d, out, extra = _window_args(op, x, kernel_size, stride, padding, 1, ceil_mode)
    total = _sum(_taps(x, k, s, p, d, out, 0.0, extra), 2)
    den = _divisor(x.shape[2:], out, k, s, p, count_include_pad, divisor_override)
    return _back(div(total, Tensor(den.astype(x.dtype))), sq)


def adaptive_avg_pool3d(input, output_size):
    """Average pooling to a fixed (D, H, W) output size (None keeps that dim).

    Example::

        >>> F.adaptive_avg_pool3d(sampan.randn(1, 2, 5, 4, 3), 2).shape
        (1, 2, 2, 2, 2)
    """
    from .pool import _adaptive_axis
    x, sq = _ncdhw(input, "adaptive_avg_pool3d")
    size = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * 3
    if len(size) != 3:
        raise op_error(ShapeError, "adaptive_avg_pool3d", f"output_size={output_size}",
                       "an int or three sizes")
    size = tuple(n if o is None else int(o) for n, o in zip(x.shape[2:], size))
    if min(size) < 1 or min(x.shape[2:]) < 1:
        raise op_error(ShapeError, "adaptive_avg_pool3d", f"output_size={output_size} for "
                       f"input {tuple(x.shape)}", "positive sizes and a non-empty input")
    if not _dt.is_floating(x.dtype):
        from .elementwise import cast
        x = cast(x, _dt.get_default_dtype())
    for axis, o in zip((2, 3, 4), size):
        x = _adaptive_axis(x, axis, o)
    return _back(x, sq)


def _max3(x, **attrs):
    return max_pool3d(x, **attrs)


def _register():
    from .composite import COMPOSITES
    COMPOSITES["conv3d"] = (conv3d, lambda: [
        Sample((randf(rng(100), 1, 2, 3, 4, 3), randf(rng(101), 2, 2, 2, 2, 2)), {}),
        Sample((randf(rng(102), 1, 2, 3, 3, 3), randf(rng(103), 2, 1, 2, 1, 2)),
               {"stride": (1, 2, 1), "padding": 1, "groups": 2})])
    COMPOSITES["max_pool3d"] = (_max3, lambda: [
        Sample((randf(rng(104), 1, 2, 4, 3, 4),), {"kernel_size": 2}),
        Sample((randf(rng(105), 1, 1, 5, 4, 3),), {"kernel_size": 3, "stride": 2,
                                                   "padding": 1, "ceil_mode": True})])
    COMPOSITES["avg_pool3d"] = (avg_pool3d, lambda: [
        Sample((randf(rng(106), 1, 2, 4, 3, 4),), {"kernel_size": 2, "ceil_mode": True}),
        Sample((randf(rng(107), 1, 1, 5, 4, 3),), {"kernel_size": 3, "stride": 2,
                                                   "padding": 1, "count_include_pad": False})])
    COMPOSITES["adaptive_avg_pool3d"] = (adaptive_avg_pool3d, lambda: [
        Sample((randf(rng(108), 1, 2, 5, 3, 4),), {"output_size": (2, 3, 3)})])


_register()
