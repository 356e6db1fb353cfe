"""Observers: the range [lo, hi] of a tensor seen over calibration batches, and the int8
quantisation parameters (scale, zero point) of that range.

- "minmax": the smallest and largest value seen.
- "percentile": the 0.01th and 99.99th percentiles (one outlier does not widen the range).
- "kl": TensorRT's entropy calibration: the clipping threshold whose 128-level quantised
  histogram is closest (Kullback-Leibler) to the histogram of the values.
- "mse": the clipping of [lo, hi] that minimises the mean squared quantisation error.

The histogram observers keep a bounded uniform sample of the values (at most
`MAX_VALUES`), so memory does not grow with the calibration set.

Activations are quantised per tensor, affine int8 (zero point in [-128, 127]); weights per
output channel, symmetric int8 in [-127, 127] with zero point 0 (`weight_qparams`).
"""
from __future__ import annotations

import numpy as np

from ..errors import SampanValueError
from ..passes.quantize import quantize_weight, weight_qparams  # noqa: F401 (re-exported)

OBSERVERS = ("minmax", "percentile", "kl", "mse")
MAX_VALUES = 1 << 18


class Observer:
    """Collects the values of one tensor over batches; `range()` gives [lo, hi]."""

    def __init__(self, kind="minmax", seed=0):
        if kind not in OBSERVERS:
            raise SampanValueError(f"sampan.quant: unknown observer {kind!r}; expected one of "
                                   f"{', '.join(OBSERVERS)}")
        self.kind = kind
        self.lo, self.hi = np.inf, -np.inf
        self.values = []
        self.n = 0
        self.rng = np.random.default_rng(seed)

    def update(self, x):
        x = np.asarray(x, np.float32).reshape(-1)
        if not x.size:
            return
        self.lo = min(self.lo, float(x.min()))
        self.hi = max(self.hi, float(x.max()))
        if self.kind != "minmax":
            keep = MAX_VALUES // 8
            if x.size > keep:
                x = self.rng.choice(x, keep, replace=False)
            self.values.append(x)
            self.n += x.size
            if self.n > MAX_VALUES:     # thin the sample to half, uniformly
                v = np.concatenate(self.values)
                self.values = [self.rng.choice(v, MAX_VALUES // 2, replace=False)]
                self.n = MAX_VALUES // 2

    def range(self):
        if self.lo > self.hi:
            return 0.0, 0.0
        if self.kind == "minmax" or not self.values:
            return self.lo, self.hi
        v = np.concatenate(self.values)
        if self.kind == "percentile":
            return float(np.percentile(v, 0.01)), float(np.percentile(v, 99.99))
        if self.kind == "mse":
            return _mse_range(v, self.lo, self.hi)
        return _kl_range(v, self.lo, self.hi)

    def qparams(self):
        """(scale, zero point) of the affine int8 grid covering range() and 0."""
        return affine_qparams(*self.range())


def affine_qparams(lo, hi):
    """Affine int8 parameters of [lo, hi] widened to hold 0 (so padding and ReLU zeros are
    exact): scale (hi - lo) / 255, zero point in [-128, 127]."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = (hi - lo) / 255.0
    if not scale > 0 or not np.isfinite(scale):
        return np.float32(1.0), np.int8(0)
    zp = int(np.clip(np.rint(-128 - lo / scale), -128, 127))
    return np.float32(scale), np.int8(zp)


def _fake(v, lo, hi):
    s, z = affine_qparams(lo, hi)
    q = np.clip(np.rint(v / s) + int(z), -128, 127)
    return (q - int(z)) * s


def _mse_range(v, lo, hi, steps=40):
    best, out = np.inf, (lo, hi)
    for f in np.linspace(1.0, 0.2, steps):
        a, b = lo * f, hi * f
        err = float(np.mean((_fake(v, a, b) - v) ** 2))
        if err < best:
            best, out = err, (a, b)
    return out


def _kl_range(v, lo, hi, bins=2048):
    """Threshold t on |v| minimising KL(P || Q), P the histogram clipped at t (outliers
    added to the last bin), Q that histogram merged to the levels the int8 grid has there
    (128 for a signed range, 256 for a non-negative one) and expanded back."""
    levels = 256 if lo >= 0 else 128
    a = np.abs(v)
    amax = float(a.max()) if a.size else 0.0
    if amax == 0:
        return lo, hi
    hist, edges = np.histogram(a, bins=bins, range=(0, amax))
    hist = hist.astype(np.float64)
    best, best_i = np.inf, bins
    for i in range(levels, bins + 1, 16):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()          # P: the clipped distribution
        nz = p > 0
        q = np.zeros(i)                  # Q: the unclipped bins merged to `levels`
        for c in np.array_split(np.arange(i), levels):
            cnt = nz[c].sum()
            if cnt:
                q[c] = np.where(nz[c], hist[c].sum() / cnt, 0)
        ps, qs = p / p.sum(), q / max(q.sum(), 1e-30)
        m = (ps > 0) & (qs > 0)
        kl = float(np.sum(ps[m] * np.log(ps[m] / qs[m]))) + (1e3 if np.any((ps > 0) & ~m)
                                                             else 0.0)
        if kl < best:
            best, best_i = kl, i
    t = float(edges[best_i])
    return (max(lo, -t), min(hi, t)) if lo < 0 else (0.0, min(hi, t))
