"""Spatial transformers: `affine_grid` and `grid_sample` (4-d input), composites.

grid_sample follows PyTorch's kernel step by step, written with ops: unnormalise the
grid to pixel coordinates, apply the padding mode to the coordinates (border: clamp,
reflection: fold back into the image), then gather the corners with `take_along_axis`
at clamped flat indices and weight them (bilinear) or gather the nearest pixel. Corners
outside the image are masked to zero, never read out of bounds. The gradient with
respect to the input is the gather's; with respect to the grid it flows through the
bilinear weights (the floors are constants), as in PyTorch.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ..tensor import Tensor
from ._util import Sample, randf, rng


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _base(n, align, dtype):
    """PyTorch's linspace_from_neg_one: the pixel centres in [-1, 1]."""
    if n <= 1:
        return np.zeros(max(n, 0), dtype)
    v = np.linspace(-1, 1, n).astype(dtype)
    return v if align else (v * (n - 1) / n).astype(dtype)


def affine_grid(theta, size, align_corners=None):
    """Sampling grid (N, H, W, 2) of the affine maps theta (N, 2, 3) over an output of
    `size` (N, C, H, W); or (N, D, H, W, 3) from (N, 3, 4) and (N, C, D, H, W).

    Example::

        >>> th = sampan.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
        >>> F.affine_grid(th, (1, 1, 2, 3), align_corners=False).shape
        (1, 2, 3, 2)
    """
    from .linalg import matmul
    from .shape import reshape, transpose
    op = "affine_grid"
    th = _t(theta)
    size = tuple(int(s) for s in size)
    k = len(size) - 2
    if k not in (2, 3) or th.ndim != 3 or tuple(th.shape[1:]) != (k, k + 1) \
            or th.shape[0] != size[0]:
        raise op_error(ShapeError, op, f"theta {tuple(th.shape)} and size {size}",
                       "theta (N, 2, 3) with size (N, C, H, W), or (N, 3, 4) with "
                       "(N, C, D, H, W)")
    if not _dt.is_floating(th.dtype):
        raise op_error(DTypeError, op, f"dtype {th.dtype}", "a floating dtype")
    align = bool(align_corners)
    dt = np.dtype(th.dtype) if th.dtype in (np.float32, np.float64) else np.dtype(np.float32)
    axes = [_base(n, align, dt) for n in size[2:]]          # (D,) H, W
    mesh = np.meshgrid(*axes, indexing="ij")
    coords = list(mesh)[::-1] + [np.ones_like(mesh[0])]     # x, y, (z,) 1
    base = np.stack(coords, -1).reshape(-1, k + 1).astype(th.dtype)
    grid = matmul(Tensor(base), transpose(th, 1, 2))        # (N, L, k)
    return reshape(grid, (size[0],) + size[2:] + (k,))


def _unnormalize(g, n, align):
    from .elementwise import add, mul
    if align:
        return mul(add(g, 1.0), (n - 1) / 2.0)
    return mul(add(mul(add(g, 1.0), float(n)), -1.0), 0.5)


def _reflect(c, lo2, hi2):
    """PyTorch's reflect_coordinates: fold c back into [lo2/2, hi2/2]."""
    from .elementwise import abs as _abs
    from .elementwise import add, eq, floor, mul, sub, where
    if lo2 == hi2:
        return mul(c, 0.0)
    lo, span = lo2 / 2.0, (hi2 - lo2) / 2.0
    c = _abs(add(c, -lo))
    flips = floor(mul(c.detach(), 1.0 / span))
    extra = sub(c, mul(flips, span))
    even = eq(sub(flips, mul(floor(mul(flips, 0.5)), 2.0)), 0.0)
    return where(even, add(extra, lo), add(sub(span, extra), lo))


def _coords(g, n, padding_mode, align):
    from .elementwise import clamp
    c = _unnormalize(g, n, align)
    if padding_mode == "border":
        c = clamp(c, 0.0, float(n - 1))
    elif padding_mode == "reflection":
        c = _reflect(c, 0, 2 * (n - 1)) if align else _reflect(c, -1, 2 * n - 1)
        c = clamp(c, 0.0, float(n - 1))
    return c


def _gather(xf, iy, ix, h, w, c):
    """x at integer (iy, ix) (float tensors (N, Ho, Wo)) as (N, C, Ho, Wo), and whether
    each point is inside the image (N, 1, Ho, Wo). Points outside (NaN included) read
    pixel 0, which the caller masks out."""
    from .elementwise import add, cast, clamp, ge, le, logical_and, mul, where
    from .index import take_along_axis
    from .shape import expand, reshape, unsqueeze
    n, ho, wo = iy.shape
    inside = logical_and(logical_and(ge(ix, 0.0), le(ix, float(w - 1))),
                         logical_and(ge(iy, 0.0), le(iy, float(h - 1))))
    flat = where(inside, add(mul(clamp(iy, 0.0, float(h - 1)), float(w)),
                             clamp(ix, 0.0, float(w - 1))), 0.0)
    idx = expand(reshape(cast(flat, "int64"), (n, 1, ho * wo)), (n, c, ho * wo))
    v = reshape(take_along_axis(xf, idx, 2), (n, c, ho, wo))
    return v, unsqueeze(inside, 1)


def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    """Sample (N, C, H, W) input at the grid's (x, y) points in [-1, 1] (N, Ho, Wo, 2):
    mode "bilinear" or "nearest", padding_mode "zeros", "border" or "reflection",
    PyTorch's align_corners (default False).

    Example::

        >>> g = F.affine_grid(sampan.tensor([[[1.0, 0, 0], [0, 1.0, 0]]]), (1, 1, 3, 3))
        >>> F.grid_sample(sampan.randn(1, 1, 3, 3), g).shape
        (1, 1, 3, 3)
    """
    from .elementwise import add, floor, mul, operands, round, sub, where
    from .shape import getitem, reshape, unsqueeze
    op = "grid_sample"
    x, g = operands(_t(input), _t(grid))
    if mode not in ("bilinear", "nearest"):
        raise op_error(SampanValueError, op, f"mode={mode!r}", "'bilinear' or 'nearest'")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise op_error(SampanValueError, op, f"padding_mode={padding_mode!r}",
                       "'zeros', 'border' or 'reflection'")
    if x.ndim != 4 or g.ndim != 4 or g.shape[-1] != 2 or g.shape[0] != x.shape[0]:
        raise op_error(ShapeError, op, f"input {tuple(x.shape)} and grid {tuple(g.shape)}",
                       "input (N, C, H, W) and grid (N, Ho, Wo, 2)")
    if not _dt.is_floating(x.dtype):
        raise op_error(DTypeError, op, f"dtype {x.dtype}", "a floating dtype")
    n, c, h, w = x.shape
    if min(h, w) < 1:
        raise op_error(ShapeError, op, f"input {tuple(x.shape)}", "a non-empty image")
    align = bool(align_corners)
    ix = _coords(getitem(g, (Ellipsis, 0)), w, padding_mode, align)
    iy = _coords(getitem(g, (Ellipsis, 1)), h, padding_mode, align)
    xf = reshape(x, (n, c, h * w))
    if mode == "nearest":
        v, inside = _gather(xf, round(iy.detach()), round(ix.detach()), h, w, c)
        return where(inside, v, 0.0)
    x0, y0 = floor(ix.detach()), floor(iy.detach())
    x1, y1 = add(x0, 1.0), add(y0, 1.0)
    out = None
    for yy, xx, wy, wx in ((y0, x0, sub(y1, iy), sub(x1, ix)), (y0, x1, sub(y1, iy), sub(ix, x0)),
                           (y1, x0, sub(iy, y0), sub(x1, ix)), (y1, x1, sub(iy, y0), sub(ix, x0))):
        v, inside = _gather(xf, yy, xx, h, w, c)
        # the weight masked, not the product: a point at +-inf has inf weights, and
        # inf * 0 would give NaN (sampan gives 0 there, PyTorch NaN or 0)
        v = mul(v, where(inside, unsqueeze(mul(wy, wx), 1), 0.0))
        out = v if out is None else add(out, v)
    return out


def _register():
    from .composite import COMPOSITES

    def gs(mode, padding_mode, align):
        def fn(x, g):
            return grid_sample(x, g, mode, padding_mode, align)
        return fn

    def sample(seed, lo=-1.2, hi=1.2):
        r = rng(seed)
        return [Sample((randf(r, 1, 2, 3, 4), randf(r, 1, 2, 3, 2, low=lo, high=hi)), {})]
    COMPOSITES["grid_sample_bilinear_zeros"] = (gs("bilinear", "zeros", False),
                                                lambda: sample(130))
    COMPOSITES["grid_sample_bilinear_border"] = (gs("bilinear", "border", True),
                                                 lambda: sample(131))
    COMPOSITES["grid_sample_bilinear_reflection"] = (gs("bilinear", "reflection", False),
                                                     lambda: sample(132, -2.5, 2.5))
    COMPOSITES["grid_sample_nearest_reflection"] = (gs("nearest", "reflection", True),
                                                    lambda: [Sample(s.args, {}, diff=(0,))
                                                             for s in sample(133, -2.5, 2.5)])
    COMPOSITES["affine_grid"] = (affine_grid, lambda: [
        Sample((randf(rng(134), 2, 2, 3),), {"size": (2, 1, 3, 4), "align_corners": False}),
        Sample((randf(rng(135), 1, 3, 4),), {"size": (1, 1, 2, 3, 2), "align_corners": True})])


_register()
