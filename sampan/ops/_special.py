"""Kernels of the special functions in `mathops`: lgamma, polygamma (digamma is n = 0),
erfinv and erfc, hand-written (scipy is not a dependency).

Each function is written once as scalar Python over float64 (`math` calls, loops):
numba compiles it into a loop over the array when it is installed, and without numba the
same function runs per element through `np.vectorize` (slow, but the same numbers).
Half types and float32 are computed in float64 and rounded once.

    >>> polygamma_kernel(np.array([1.0]), 0)   # digamma(1) = -Euler's gamma
    array([-0.57721566])
"""
from __future__ import annotations

import math

import numpy as np

from ._nb import HAVE_NUMBA, njit

_PI = math.pi
_SQRT_PI_2 = math.sqrt(math.pi) / 2.0
# B_2k for k = 1..8 (Bernoulli numbers), for the asymptotic series below
_B2K = (1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30, 5.0 / 66, -691.0 / 2730, 7.0 / 6,
        -3617.0 / 510)


@njit(cache=True)
def lgamma_s(x):
    """log|Gamma(x)|; +inf at the poles (0, negative integers, -inf) as torch."""
    if x != x:
        return x
    if x <= 0.0 and x == math.floor(x):
        return math.inf
    return math.lgamma(x)


@njit(cache=True)
def _digamma_pos(x):
    """psi(x) for x >= 0.5: recurrence psi(x) = psi(x + 1) - 1/x up to x >= 10, then the
    asymptotic series log x - 1/(2x) - sum B_2k / (2k x^2k) (8 terms: < 1e-17 at 10)."""
    s = 0.0
    while x < 10.0:
        s -= 1.0 / x
        x += 1.0
    if x == math.inf:
        return x
    z = 1.0 / (x * x)
    t = 0.0
    for k in range(7, -1, -1):
        t = t * z + _B2K[k] / (2.0 * (k + 1))
    return s + math.log(x) - 0.5 / x - t * z


@njit(cache=True)
def _hurwitz_pos(s, x, n_fact):
    """n! * zeta(s, x) = n! * sum_k (x + k)^-s for x >= 0.5, s = n + 1 >= 2: the sum up to
    x + m >= 20 + 2n, then Euler-Maclaurin for the tail."""
    acc = 0.0
    lim = 20.0 + 2.0 * (s - 1.0)
    while x < lim:
        acc += x ** -s
        x += 1.0
    if x == math.inf:
        return 0.0
    # tail: x^(1-s)/(s-1) + x^-s/2 + sum_j B_2j/(2j)! * s(s+1)...(s+2j-2) x^(-s-2j+1)
    tail = x ** (1.0 - s) / (s - 1.0) + 0.5 * x ** -s
    rise = s          # s(s+1)...(s+2j-2)
    fact = 2.0        # (2j)!
    xp = x ** (-s - 1.0)
    for j in range(1, 9):
        tail += _B2K[j - 1] / fact * rise * xp
        rise *= (s + 2 * j - 1) * (s + 2 * j)
        fact *= (2 * j + 1) * (2 * j + 2)
        xp /= x * x
    return n_fact * (acc + tail)


@njit(cache=True)
def _cot_poly(n, c):
    """P_n(c) with d^n/dx^n cot(pi x) = pi^n P_n(cot(pi x)): P_0 = c,
    P_{k+1} = -(1 + c^2) P_k'(c), as polynomial coefficients."""
    p = np.zeros(n + 2)
    p[1] = 1.0
    for _ in range(n):
        d = np.zeros(n + 2)
        for i in range(n + 1):
            d[i] = (i + 1) * p[i + 1]
        q = np.zeros(n + 2)
        for i in range(n + 2):
            q[i] = -d[i] - (d[i - 2] if i >= 2 else 0.0)
        p = q
    r = 0.0
    for i in range(n + 1, -1, -1):
        r = r * c + p[i]
    return r


@njit(cache=True)
def polygamma_s(n, x):
    """The n-th derivative of digamma at x (n = 0: digamma). Poles as torch: psi(+-0) =
    -+inf, nan at negative integers; for n >= 1, +inf (odd n) or -inf (even n)."""
    if x != x:
        return x
    if x <= 0.0 and x == math.floor(x):
        if n == 0:
            if x == 0.0:
                return -math.inf if math.copysign(1.0, x) > 0 else math.inf
            return math.nan
        return math.inf if n % 2 == 1 else -math.inf
    if x < 0.5:
        # reflection: psi^(n)(x) = (-1)^n psi^(n)(1 - x) - pi^(n+1) P_n(cot(pi x)), with
        # the fractional part of x (tan(pi x) loses digits for large |x|)
        r = x - math.trunc(x)   # exact
        c = 1.0 / math.tan(_PI * r)
        return (-1.0) ** n * _polygamma_pos(n, 1.0 - x) - _PI ** (n + 1) * _cot_poly(n, c)
    return _polygamma_pos(n, x)


@njit(cache=True)
def _polygamma_pos(n, x):
    if n == 0:
        return _digamma_pos(x)
    return (-1.0) ** (n + 1) * _hurwitz_pos(n + 1.0, x, math.gamma(n + 1.0))


@njit(cache=True)
def erfinv_s(x):
    """Inverse error function: Winitzki's closed form (relative error ~2e-3) refined by
    three Halley steps (cubic convergence: float64 precision). For |x| > 0.5 the steps
    solve erfc(y) = 1 - |x| instead, exact in the tails where erf(y) rounds to 1."""
    if x != x or x < -1.0 or x > 1.0:
        return math.nan
    ax = abs(x)
    if ax == 1.0:
        return math.copysign(math.inf, x)
    lg = math.log((1.0 - ax) * (1.0 + ax))
    t = 2.0 / (_PI * 0.147) + 0.5 * lg
    y = math.sqrt(max(math.sqrt(t * t - lg / 0.147) - t, 0.0))
    one_minus = 1.0 - ax
    for _ in range(3):
        if ax <= 0.5:
            f = math.erf(y) - ax
            fp = math.exp(-y * y) / _SQRT_PI_2
        else:
            f = math.erfc(y) - one_minus
            fp = -math.exp(-y * y) / _SQRT_PI_2
        if fp == 0.0:
            break
        d = f / fp
        y -= d / (1.0 + y * d)   # Halley: f''/f' = -2y for erf and erfc alike
    return math.copysign(y, x)


@njit(cache=True)
def erfc_s(x):
    return math.erfc(x)


if HAVE_NUMBA:
    @njit(cache=True, nogil=True)
    def _loop_lgamma(a, out):
        for i in range(a.size):
            out[i] = lgamma_s(a[i])

    @njit(cache=True, nogil=True)
    def _loop_erfinv(a, out):
        for i in range(a.size):
            out[i] = erfinv_s(a[i])

    @njit(cache=True, nogil=True)
    def _loop_erfc(a, out):
        for i in range(a.size):
            out[i] = erfc_s(a[i])

    @njit(cache=True, nogil=True)
    def _loop_polygamma(a, n, out):
        for i in range(a.size):
            out[i] = polygamma_s(n, a[i])

    _LOOPS = {"lgamma": _loop_lgamma, "erfinv": _loop_erfinv, "erfc": _loop_erfc}
else:  # pragma: no cover - the no-numba variant
    _LOOPS = {}
_SCALAR = {"lgamma": lgamma_s, "erfinv": erfinv_s, "erfc": erfc_s}


def _run(name, a, *extra):
    x = np.ascontiguousarray(a, dtype=np.float64).reshape(-1)
    if HAVE_NUMBA:
        out = np.empty_like(x)
        if name == "polygamma":
            _loop_polygamma(x, extra[0], out)
        else:
            _LOOPS[name](x, out)
    elif name == "polygamma":  # pragma: no cover
        out = np.array([polygamma_s(extra[0], float(v)) for v in x], np.float64)
    else:  # pragma: no cover
        out = np.array([_SCALAR[name](float(v)) for v in x], np.float64)
    return out.reshape(a.shape).astype(a.dtype, copy=False)


def lgamma_kernel(a):
    """log|Gamma(a)| elementwise."""
    return _run("lgamma", a)


def erfinv_kernel(a):
    """The inverse of erf elementwise (nan outside [-1, 1])."""
    return _run("erfinv", a)


def erfc_kernel(a):
    """1 - erf(a) without cancellation."""
    return _run("erfc", a)


def polygamma_kernel(a, n):
    """The n-th derivative of digamma elementwise (n = 0: digamma)."""
    return _run("polygamma", a, int(n))
