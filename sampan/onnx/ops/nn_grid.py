"""GridSample beyond sampan's `F.grid_sample` (4-D, bilinear/nearest): N-D input and
cubic mode, written with sampan ops after ONNX's reference semantics.

Coordinates are denormalised, rounded (nearest), brought inside the image by the padding
mode; then every tap (2 per dim for linear, 4 for cubic, 1 for nearest) is read with
`take_along_dim` at a flat index over the spatial dims, its index itself bounded by the
padding mode (zeros: masked out; border: clamped; reflection: reflected). Gradients flow
to the input through the gather and to the grid through the tap weights.
"""
from __future__ import annotations

import itertools

import numpy as np

import sampan


def _denorm(g, n, align):
    return (g + 1.0) * (0.5 * (n - 1)) if align else ((g + 1.0) * n - 1.0) * 0.5


def _reflect(v, lo, hi):
    """Fold v back into [lo, hi] by reflecting at the nearer border, repeatedly."""
    rng = hi - lo
    if rng <= 0:
        return sampan.zeros_like(v) + lo
    below = lo - v
    nb = sampan.floor(below / rng)
    rb = below - nb * rng
    even_b = sampan.remainder(nb, 2.0) == 0
    from_lo = sampan.where(even_b, rb + lo, hi - rb)
    above = v - hi
    na = sampan.floor(above / rng)
    ra = above - na * rng
    even_a = sampan.remainder(na, 2.0) == 0
    from_hi = sampan.where(even_a, hi - ra, ra + lo)
    return sampan.where(v < lo, from_lo, sampan.where(v > hi, from_hi, v))


def _cubic_w(t, a=-0.75):
    """Keys' cubic weights of the 4 taps at floor-1 .. floor+2 for fraction t."""
    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def grid_sample_nd(x, grid, mode, padding_mode, align):
    """ONNX GridSample on (N, C, D1..Dr) with grid (N, O1..Or', r); mode linear, nearest
    or cubic; padding_mode zeros, border or reflection."""
    n, c = x.shape[0], x.shape[1]
    dims = list(x.shape[2:])
    r = len(dims)
    out_sp = list(grid.shape[1:-1])
    p = int(np.prod(out_sp)) if out_sp else 1
    g = sampan.reshape(grid, n, p, r)
    coords = []
    for i in range(r):              # the grid's last axis lists (x, y, z): reversed dims
        v = _denorm(g[:, :, r - 1 - i], dims[i], align)
        if mode == "nearest":
            v = sampan.round(v)
        lo, hi = (0.0, dims[i] - 1.0) if align else (-0.5, dims[i] - 0.5)
        if padding_mode == "border":     # only coordinates outside [lo, hi] move
            out = sampan.logical_or(v < lo, v > hi)
            v = sampan.where(out, sampan.clamp(v, 0.0, dims[i] - 1.0), v)
        elif padding_mode == "reflection":
            v = _reflect(v, lo, hi)
        coords.append((v, lo, hi))
    taps = []                       # per dim: [(index tensor, weight tensor or None)]
    for i, (v, lo, hi) in enumerate(coords):
        if mode == "nearest":
            taps.append([(v, None)])
            continue
        f = sampan.floor(v)
        t = v - f
        if mode == "linear":
            taps.append([(f, 1.0 - t), (f + 1.0, t)])
        else:
            ws = _cubic_w(t)
            taps.append([(f + float(k), ws[k + 1]) for k in (-1, 0, 1, 2)])
    xf = sampan.reshape(x, n, c, -1)
    out = None
    for combo in itertools.product(*taps):
        flat, w, valid = None, None, None
        for i, (idx, wt) in enumerate(combo):
            d = dims[i]
            if padding_mode == "zeros":
                ok = sampan.logical_and(idx >= 0.0, idx <= d - 1.0)
                valid = ok if valid is None else sampan.logical_and(valid, ok)
                idx = sampan.clamp(idx, 0.0, d - 1.0)
            elif padding_mode == "border":
                idx = sampan.clamp(idx, 0.0, d - 1.0)
            else:
                idx = sampan.clamp(sampan.trunc(_reflect(idx, coords[i][1], coords[i][2])),
                                   0.0, d - 1.0)
            ii = sampan.cast(idx, np.int64)
            flat = ii if flat is None else flat * d + ii
            if wt is not None:
                w = wt if w is None else w * wt
        vals = sampan.take_along_dim(xf, sampan.expand(sampan.unsqueeze(flat, 1), n, c, p),
                                     dim=2)
        if w is not None:
            vals = vals * sampan.unsqueeze(w, 1)
        if valid is not None:
            vals = sampan.where(sampan.unsqueeze(valid, 1), vals, sampan.zeros_like(vals))
        out = vals if out is None else out + vals
    return sampan.reshape(out, n, c, *out_sp)
