"""Fit the rational float32 functions of `sampan.backends.numba.mathlib`: erf32 and dgelu32.

erf (default): erf(x) ~ x P(x^2) / Q(x^2) on 0 < x <= 3.925 (beyond it erf rounds to 1 in
float32), P of degree 6, Q of degree 5 (Q(0) = 1), fitted to the relative error.

dgelu (``--dgelu``): the derivative of exact GELU, Phi(x) + x phi(x) = 1/2 + h(x) with h
odd; h(x) ~ x P(t) / Q(t), t = x^2 / 36, on 0 < x <= 6 (beyond it the derivative rounds
to 1, or to 0 on the negative side within 4e-8), P of degree 7, Q of degree 6, fitted to
the absolute error (the derivative crosses zero, so a relative bound means nothing there).
The scaled t keeps the normal equations well conditioned at these degrees.

Both: linearised least squares (x P - f Q), repeated with weights 1/|Q| (Loeb) and,
Lawson-style, weights raised where the error is largest, which moves the fit toward
minimax. Prints the coefficients and the float32 error of the float32 Horner evaluation
that mathlib does. Needs scipy (a test dependency) for the reference erf.

    .venv/bin/python tools/fit_erf.py [--dgelu]
"""
import sys

import numpy as np
from scipy.special import erf

TARGETS = {  # name -> (function, clamp, degree of P, degree of Q, t scale, relative fit)
    "erf": (erf, 3.925, 6, 5, 1.0, True),
    "dgelu": (lambda x: 0.5 * erf(x / np.sqrt(2)) + x * np.exp(-0.5 * x * x)
              / np.sqrt(2 * np.pi), 6.0, 7, 6, 1 / 36, False),
}


def fit(target="erf", n=6000, rounds=60):
    f_ref, clamp, dp, dq, scale, relative = TARGETS[target]
    x = np.concatenate([np.linspace(1e-6, clamp, n),
                        clamp * np.sin(np.linspace(0, np.pi / 2, n)) ** 2])
    x = np.unique(x)
    x = x[x > 1e-7]
    f, t = f_ref(x), x * x * scale
    w = np.ones_like(x)
    q = np.ones(1)
    for _ in range(rounds):
        ww = w / np.abs(np.polyval(q[::-1], t))
        if relative:
            ww = ww / f
        a = np.concatenate([x[:, None] * t[:, None] ** np.arange(dp + 1),
                            -f[:, None] * t[:, None] ** np.arange(1, dq + 1)], 1)
        sol = np.linalg.lstsq(a * ww[:, None], f * ww, rcond=None)[0]
        p, q = sol[:dp + 1], np.concatenate([[1.0], sol[dp + 1:]])
        err = np.abs(x * np.polyval(p[::-1], t) / np.polyval(q[::-1], t) - f)
        if relative:
            err = err / f
        w = w * (err / err.max()) ** 0.3 + 1e-3
    return p, q, err.max()


def eval32(target, p, q, x):
    """The float32 evaluation, in mathlib's order."""
    _, clamp, _, _, scale, _ = TARGETS[target]
    xc = np.clip(x, np.float32(-clamp), np.float32(clamp))
    t = xc * xc * np.float32(scale) if scale != 1.0 else xc * xc
    pp = np.full_like(t, np.float32(p[-1]))
    for c in p[-2::-1]:
        pp = pp * t + np.float32(c)
    qq = np.full_like(t, np.float32(q[-1]))
    for c in q[-2::-1]:
        qq = qq * t + np.float32(c)
    if target == "erf":
        return np.clip(xc * pp / qq, np.float32(-1), np.float32(1))
    return np.float32(0.5) + xc * pp / qq


def error32(target, p, q):
    """erf: max error in float32 ulps; dgelu: max absolute error (float32 evaluation)."""
    f_ref = TARGETS[target][0]
    span = 4.5 if target == "erf" else 8.0
    x = np.concatenate([np.linspace(-span, span, 2_000_001),
                        10.0 ** np.linspace(-30, 0.6, 200_001)]).astype(np.float32)
    r = eval32(target, p, q, x).astype(np.float64)
    if target == "erf":
        ref = erf(x.astype(np.float64)).astype(np.float32)
        err = np.abs(r - ref) / np.spacing(np.abs(ref)).astype(np.float64)
        return float(err[ref != 0].max())
    return float(np.abs(r - (0.5 + f_ref(x.astype(np.float64)))).max())


if __name__ == "__main__":
    target = "dgelu" if "--dgelu" in sys.argv[1:] else "erf"
    p, q, e = fit(target, **({"n": 8000, "rounds": 80} if target == "dgelu" else {}))
    kind = "relative" if TARGETS[target][5] else "absolute"
    print(f"max {kind} error (float64 evaluation): {e:.3g}")
    unit = "ulps" if target == "erf" else "absolute"
    print(f"max error of the float32 evaluation: {error32(target, p, q):.3g} {unit}")
    print("P =", ", ".join(repr(float(c)) for c in p))
    print("Q =", ", ".join(repr(float(c)) for c in q))
