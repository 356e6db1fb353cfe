"""Pooling with indices (NCHW): the int64 indices of max_pool2d's and adaptive max
pooling's maxima, max_unpool2d (which puts values back at such indices), and the
frontends that use them.

Indices are PyTorch's: flat offsets ``row * W + col`` into each (H, W) plane of the
input. The values of a pooling with indices come from the pooling op itself
(max_pool2d) or from a gather at the indices (adaptive_max_pool2d), so their gradients
are those ops' gradients; the index ops are not differentiable.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, SampanIndexError, ShapeError, op_error
from ..tensor import apply
from ._util import Sample, randf, rng
from .conv import _check_4d, _numel, _pair, _spec, _t
from .pool import MAX_POOL2D, WITH_INDICES, _argmax, _back, _max_rule, _nchw, _pattrs
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, Spec, defop


# ---------------------------------------------------------------------- max_pool2d indices
def _mpi_rule(x, kernel_size, stride, padding, dilation, ceil_mode=False):
    y = _max_rule(x, kernel_size, stride, padding, dilation, ceil_mode)
    return Spec(tuple(y.shape), np.dtype(np.int64))


def _mpi_kernel(x, kernel_size, stride, padding, dilation, ceil_mode=False):
    w = x.shape[3]
    if _dt.is_floating(x.dtype) and x.dtype.itemsize < 4:
        x = x.astype(np.float32)
    arg, ho, wo = _argmax(x, kernel_size, stride, padding, dilation, ceil_mode)
    arg = arg.astype(np.int64)
    kw = kernel_size[1]
    rows = (np.arange(ho) * stride[0] - padding[0])[:, None] + (arg // kw) * dilation[0]
    cols = (np.arange(wo) * stride[1] - padding[1])[None, :] + (arg % kw) * dilation[1]
    return rows * w + cols


def _mpi_samples():
    r = rng(80)
    return [Sample((randf(r, 1, 2, 5, 6),), _pattrs(3, 2, 1)),
            Sample((randf(r, 2, 1, 5, 5),), _pattrs(2, ceil_mode=True))]


MAX_POOL2D_INDICES = defop(
    "max_pool2d_indices", _mpi_rule, kernel=_mpi_kernel, grad=NOT_DIFFERENTIABLE,
    flops=lambda x, kernel_size, **_: _numel(x.shape) * kernel_size[0] * kernel_size[1],
    onnx=NO_ONNX, samples=_mpi_samples,
    doc="flat per-plane int64 index of each max_pool2d window's first maximum")


# ---------------------------------------------------------------------- adaptive max indices
def _windows(n, o):
    """PyTorch's adaptive windows [floor(i*n/o), ceil((i+1)*n/o)) of n split o ways."""
    return [((i * n) // o, -((-(i + 1) * n) // o)) for i in range(o)]


def _ami_rule(x, output_size):
    op = "adaptive_max_pool2d"
    if x.dtype == np.bool_ or not (_dt.is_floating(x.dtype) or _dt.is_integer(x.dtype)):
        raise op_error(DTypeError, op, f"dtype {x.dtype}", "a numeric dtype")
    _check_4d(op, "input", x)
    if len(output_size) != 2 or min(output_size) < 1:
        raise op_error(ShapeError, op, f"output_size={output_size}", "two positive sizes")
    if any(isinstance(n, int) and n < 1 for n in x.shape[2:]):
        raise op_error(ShapeError, op, f"input of shape {tuple(x.shape)}",
                       "non-empty spatial dims")
    return Spec(tuple(x.shape[:2]) + tuple(output_size), np.dtype(np.int64))


def _ami_kernel(x, output_size):
    n, c, h, w = x.shape
    oh, ow = output_size
    out = np.empty((n, c, oh, ow), np.int64)
    if _dt.is_floating(x.dtype) and x.dtype.itemsize < 4:
        x = x.astype(np.float32)
    for i, (a, b) in enumerate(_windows(h, oh)):
        for j, (p, q) in enumerate(_windows(w, ow)):
            win = x[:, :, a:b, p:q].reshape(n, c, -1)
            k = np.argmax(win, axis=2) if win.size else np.zeros((n, c), np.int64)
            out[:, :, i, j] = (a + k // (q - p)) * w + p + k % (q - p)
    return out


ADAPTIVE_MAX_POOL2D_INDICES = defop(
    "adaptive_max_pool2d_indices", _ami_rule, kernel=_ami_kernel, grad=NOT_DIFFERENTIABLE,
    flops=lambda x, output_size: _numel(x.shape), onnx=NO_ONNX,
    samples=lambda: [Sample((randf(rng(81), 1, 2, 5, 7),), {"output_size": (3, 2)}),
                     Sample((randf(rng(82), 2, 1, 4, 4),), {"output_size": (2, 3)})],
    doc="flat per-plane int64 index of each adaptive max-pooling window's first maximum")


# ---------------------------------------------------------------------- max_unpool2d
def _unpool_rule(x, indices, output_size):
    op = "max_unpool2d"
    if not _dt.is_floating(x.dtype):
        raise op_error(DTypeError, op, f"dtype {x.dtype}", "a floating dtype")
    if indices.dtype.kind not in "iu":
        raise op_error(DTypeError, op, f"indices dtype {indices.dtype}", "an integer dtype")
    _check_4d(op, "input", x)
    if tuple(indices.shape) != tuple(x.shape):
        raise op_error(ShapeError, op, f"input {tuple(x.shape)} and indices "
                       f"{tuple(indices.shape)}", "indices shaped like the input")
    if len(output_size) != 2 or min(output_size) < 0:
        raise op_error(ShapeError, op, f"output_size={output_size}", "two sizes >= 0")
    return Spec(tuple(x.shape[:2]) + tuple(output_size), x.dtype)


def _unpool_kernel(x, indices, output_size):
    n, c = x.shape[:2]
    hw = output_size[0] * output_size[1]
    i = indices.reshape(n * c, -1)
    if i.size and (int(i.min()) < 0 or int(i.max()) >= hw):
        bad = int(i.min()) if int(i.min()) < 0 else int(i.max())
        raise op_error(SampanIndexError, "max_unpool2d", f"index {bad} for an output plane "
                       f"of {tuple(output_size)}", f"indices in [0, {hw})")
    out = np.zeros((n * c, hw), x.dtype)
    out[np.arange(n * c)[:, None], i] = x.reshape(n * c, -1)
    return out.reshape((n, c) + tuple(output_size))


def _unpool_grad(g, y, x, indices, output_size):
    from .index import take_along_axis
    from .shape import reshape
    n, c, h, w = x.shape
    gf = reshape(g, (n, c, output_size[0] * output_size[1]))
    gx = take_along_axis(gf, reshape(indices, (n, c, h * w)), 2)
    return reshape(gx, tuple(x.shape)), None


def _unpool_samples():
    r = rng(83)
    x = randf(r, 1, 2, 5, 6)
    out = []
    for attrs in (_pattrs(2), _pattrs((2, 3), ceil_mode=True)):   # no duplicate indices
        idx = _mpi_kernel(x, **attrs)
        out.append(Sample((randf(r, *idx.shape), idx), {"output_size": (5, 6)}, diff=(0,)))
    return out


MAX_UNPOOL2D = defop(
    "max_unpool2d", _unpool_rule, kernel=_unpool_kernel, grad=_unpool_grad, saves=(1,),
    nondiff_inputs=(1,), flops=lambda x, indices, output_size: 0, onnx="MaxUnpool",
    samples=_unpool_samples,
    doc="zeros of output_size per plane with x written at its flat indices", amp="float32")


# ---------------------------------------------------------------------- frontends
def max_pool2d_with_indices(x, kernel_size, stride=None, padding=0, dilation=1,
                            ceil_mode=False):
    """max_pool2d and the int64 flat per-plane index of each window's maximum.

    Example::

        >>> y, i = sampan.ops.pool_index.max_pool2d_with_indices(sampan.randn(1, 1, 4, 4), 2)
        >>> str(i.dtype)
        'int64'
    """
    from .conv import checked_apply
    x, sq = _nchw(x, "max_pool2d")
    attrs = _pattrs(kernel_size, stride, padding, dilation, ceil_mode)
    y = checked_apply(MAX_POOL2D, (x,), attrs)
    i = apply(MAX_POOL2D_INDICES, (x.detach(),), attrs)
    return _back(y, sq), _back(i, sq)


WITH_INDICES["max_pool2d"] = max_pool2d_with_indices   # max_pool2d(return_indices=True)


def _adaptive_size(op, hw, output_size):
    if isinstance(output_size, (int, np.integer)) or output_size is None:
        output_size = (output_size, output_size)
    out = tuple(n if o is None else int(o) for n, o in zip(hw, output_size))
    if len(out) != 2 or min(out) < 1:
        raise op_error(ShapeError, op, f"output_size={output_size}", "positive output sizes")
    return out


def adaptive_max_pool2d(x, output_size, return_indices=False):
    """Max over PyTorch's adaptive windows to a fixed output size (None keeps a dim);
    with return_indices also the int64 flat per-plane index of each maximum.

    Example::

        >>> F.adaptive_max_pool2d(sampan.randn(2, 3, 7, 5), (2, 2)).shape
        (2, 3, 2, 2)
    """
    from .index import take_along_axis
    from .shape import reshape
    x, sq = _nchw(x, "adaptive_max_pool2d")
    size = _adaptive_size("adaptive_max_pool2d", x.shape[2:], output_size)
    attrs = {"output_size": size}
    ADAPTIVE_MAX_POOL2D_INDICES.shape_rule(_spec(x), **attrs)
    i = apply(ADAPTIVE_MAX_POOL2D_INDICES, (x.detach(),), attrs)
    n, c, h, w = x.shape
    y = take_along_axis(reshape(x, (n, c, h * w)), reshape(i, (n, c, size[0] * size[1])), 2)
    y = _back(reshape(y, (n, c) + size), sq)
    return (y, _back(i, sq)) if return_indices else y


def max_unpool2d(x, indices, kernel_size, stride=None, padding=0, output_size=None):
    """The partial inverse of max_pool2d: zeros with each value of `x` at its index.

    `output_size` (its last two entries) picks among the sizes that pool to x's size.

    Example::

        >>> y, i = F.max_pool2d(sampan.randn(1, 1, 4, 4), 2, return_indices=True)
        >>> F.max_unpool2d(y, i, 2).shape
        (1, 1, 4, 4)
    """
    x, sq = _nchw(x, "max_unpool2d")
    indices, _ = _nchw(indices, "max_unpool2d")
    k = _pair(kernel_size, "max_unpool2d", "kernel_size")
    s = k if stride is None else _pair(stride, "max_unpool2d", "stride")
    p = _pair(padding, "max_unpool2d", "padding")
    default = tuple((n - 1) * si - 2 * pi + ki for n, si, pi, ki in zip(x.shape[2:], s, p, k))
    if output_size is None:
        size = default
    else:
        size = tuple(int(v) for v in tuple(output_size)[-2:])
        if len(size) != 2 or any(not d - si < v < d + si
                                 for v, d, si in zip(size, default, s)):
            raise op_error(ShapeError, "max_unpool2d", f"output_size={tuple(output_size)}",
                           "sizes within a stride of the default "
                           f"{default} (the sizes that pool back to {tuple(x.shape[2:])})")
    attrs = {"output_size": size}
    MAX_UNPOOL2D.shape_rule(_spec(x), _spec(indices), **attrs)
    return _back(apply(MAX_UNPOOL2D, (x, _t(indices)), attrs), sq)
