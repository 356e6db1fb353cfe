"""Fit the rational float32 erf of `sampan.backends.numba.mathlib.erf32`.

erf(x) ~ x P(x^2) / Q(x^2) on 0 < x <= 3.925 (beyond it erf rounds to 1 in float32), with
P of degree 6 and Q of degree 5 (Q(0) = 1). Linearised least squares on the relative error
(x P - erf Q) / erf, repeated with weights 1/|Q| (Loeb) and, Lawson-style, weights raised
where the error is largest, which moves the fit toward minimax. Prints the coefficients and
the float32 error in ulps. Needs scipy (a test dependency) for the reference erf.

    .venv/bin/python tools/fit_erf.py
"""
import numpy as np
from scipy.special import erf

CLAMP = 3.925
DEG_P, DEG_Q = 6, 5


def fit(n=6000, rounds=60):
    x = np.concatenate([np.linspace(1e-6, CLAMP, n),
                        CLAMP * np.sin(np.linspace(0, np.pi / 2, n)) ** 2])
    x = np.unique(x)
    x = x[x > 1e-7]
    f, t = erf(x), x * x
    w = np.ones_like(x)
    q = np.ones(1)
    for _ in range(rounds):
        ww = w / np.abs(np.polyval(q[::-1], t)) / f
        a = np.concatenate([x[:, None] * t[:, None] ** np.arange(DEG_P + 1),
                            -f[:, None] * t[:, None] ** np.arange(1, DEG_Q + 1)], 1)
        sol = np.linalg.lstsq(a * ww[:, None], f * ww, rcond=None)[0]
        p, q = sol[:DEG_P + 1], np.concatenate([[1.0], sol[DEG_P + 1:]])
        rel = np.abs(x * np.polyval(p[::-1], t) / np.polyval(q[::-1], t) - f) / f
        w = w * (rel / rel.max()) ** 0.3 + 1e-3
    return p, q, rel.max()


def ulps32(p, q):
    """Max error in float32 ulps of the float32 evaluation (Horner, as mathlib does)."""
    x = np.concatenate([np.linspace(-4.5, 4.5, 2_000_001),
                        10.0 ** np.linspace(-30, 0.6, 200_001)]).astype(np.float32)
    xc = np.clip(x, np.float32(-CLAMP), np.float32(CLAMP))
    t = xc * xc
    pp = np.full_like(t, np.float32(p[-1]))
    for c in p[-2::-1]:
        pp = pp * t + np.float32(c)
    qq = np.full_like(t, np.float32(q[-1]))
    for c in q[-2::-1]:
        qq = qq * t + np.float32(c)
    r = np.clip(xc * pp / qq, np.float32(-1), np.float32(1)).astype(np.float64)
    ref = erf(x.astype(np.float64)).astype(np.float32)
    err = np.abs(r - ref) / np.spacing(np.abs(ref)).astype(np.float64)
    return float(err[ref != 0].max())


if __name__ == "__main__":
    p, q, rel = fit()
    print(f"max relative error (float64 evaluation): {rel:.3g}")
    print(f"max error of the float32 evaluation: {ulps32(p, q):.0f} ulps")
    print("P =", ", ".join(repr(float(c)) for c in p))
    print("Q =", ", ".join(repr(float(c)) for c in q))
