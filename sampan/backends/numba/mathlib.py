"""Vectorisable float32 transcendental functions for generated numba kernels.

numba from PyPI links no vector math library, so `math.exp` inside a kernel is one
scalar libm call per element and the loop around it cannot use SIMD. The functions
here are written with arithmetic, comparisons, selects and bit casts only (range
reduction + polynomial, after Cephes), so LLVM vectorises the loops that call them.

Accuracy: `ACCURACY`, the largest error in ulps against the float64 function rounded to
float32, checked over each function's useful range by tests/fusion/test_mathlib.py.
float64 kernels keep calling libm: these are float32 only.

Example::

    >>> from sampan.backends.numba.mathlib import exp32
    >>> exp32(np.float32(1.0))
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

# max |error| in ulps against the correctly rounded float32 value (tests/fusion/test_mathlib.py)
ACCURACY = {"exp": 2, "log": 2, "tanh": 2, "erf": 6}   # measured: 1, 1, 1, 5
# max absolute error of functions that cross zero, where ulps mean nothing; the bound of
# dgelu32 is ~2.5 ulps of its values near 1 (the erf/exp form it replaced: 1.4e-7)
ACCURACY_ABS = {"dgelu": 3e-7}   # measured: 2.7e-7

_F = np.float32
_I = np.int32


@intrinsic
def _f2i(typingctx, x):
    """Reinterpret float32 bits as int32."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@intrinsic
def _i2f(typingctx, x):
    """Reinterpret the low 32 bits of an integer as float32."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if x.bitwidth > 32:
            v = builder.trunc(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())
    return types.float32(x), codegen


@njit(inline="always", cache=True)
def bf16_load(u):
    """The float32 value of bfloat16 bits `u` (uint16): exact, the bits moved up."""
    return _i2f(np.int64(u) << 16)


@njit(inline="always", cache=True)
def bf16_store(x):
    """float32 `x` rounded to bfloat16 bits (uint16): to nearest, ties to even, NaN kept
    quiet, as ml_dtypes' astype, so a kernel writing bfloat16 matches eager bit for bit."""
    u = np.int64(_f2i(x)) & 0xFFFFFFFF
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return np.uint16(((u >> 16) | 0x40) if (u & 0x7FFFFFFF) > 0x7F800000 else r)


@njit(inline="always", cache=True)
def max_(a, b):
    """np.maximum for scalars: NaN in either operand gives NaN."""
    return a if (a > b or a != a) else b


@njit(inline="always", cache=True)
def min_(a, b):
    """np.minimum for scalars: NaN in either operand gives NaN."""
    return a if (a < b or a != a) else b


@njit(inline="always", cache=True)
def exp32(x):
    """e**x in float32: n = round(x / ln 2), r = x - n ln 2 (two-part), e**r by a degree-6
    polynomial, scaled by 2**n as two factors built from exponent bits (so that n from -150
    to 128, subnormal and largest results, needs no special case)."""
    xc = min(max(x, _F(-104.0)), _F(88.72283))
    n = np.floor(xc * _F(1.44269504088896341) + _F(0.5))
    r = xc - n * _F(0.693359375)
    r = r + n * _F(2.12194440e-4)
    r2 = r * r
    p = _F(1.9875691500e-4) * r + _F(1.3981999507e-3)
    p = p * r + _F(8.3334519073e-3)
    p = p * r + _F(4.1665795894e-2)
    p = p * r + _F(1.6666665459e-1)
    p = p * r + _F(5.0000001201e-1)
    p = p * r2 + r + _F(1.0)
    ni = _I(n)
    n1 = ni >> _I(1)
    y = p * _i2f((n1 + _I(127)) << _I(23)) * _i2f((ni - n1 + _I(127)) << _I(23))
    y = _F(0.0) if x < _F(-104.0) else y
    y = _F(np.inf) if x > _F(88.72283) else y
    return x if x != x else y


@njit(inline="always", cache=True)
def log32(x):
    """Natural log in float32: split x = m * 2**e with m in [sqrt(1/2), sqrt(2)), log(m)
    by a degree-9 polynomial in m - 1."""
    bits = _f2i(x)
    e = ((bits >> _I(23)) & _I(255)) - _I(126)
    m = _i2f((bits & _I(0x7FFFFF)) | _I(0x3F000000))      # in [0.5, 1)
    small = m < _F(0.707106781186547524)
    e = e - _I(1) if small else e
    f = (m + m - _F(1.0)) if small else (m - _F(1.0))
    fe = _F(e)
    z = f * f
    y = _F(7.0376836292e-2) * f - _F(1.1514610310e-1)
    y = y * f + _F(1.1676998740e-1)
    y = y * f - _F(1.2420140846e-1)
    y = y * f + _F(1.4249322787e-1)
    y = y * f - _F(1.6668057665e-1)
    y = y * f + _F(2.0000714765e-1)
    y = y * f - _F(2.4999993993e-1)
    y = y * f + _F(3.3333331174e-1)
    y = y * f * z
    y = y + _F(-2.12194440e-4) * fe
    y = y - _F(0.5) * z
    r = f + y + _F(0.693359375) * fe
    r = _F(-np.inf) if x == _F(0.0) else r
    r = _F(np.nan) if x < _F(0.0) else r
    r = x if (x != x or x == _F(np.inf)) else r
    return r


@njit(inline="always", cache=True)
def tanh32(x):
    """tanh in float32: odd polynomial below |x| = 0.625, else 1 - 2 / (e**(2|x|) + 1)."""
    ax = abs(x)
    z = x * x
    p = _F(-5.70498872745e-3) * z + _F(2.06390887954e-2)
    p = p * z - _F(5.37397155531e-2)
    p = p * z + _F(1.33314422036e-1)
    p = p * z - _F(3.33332819422e-1)
    small = p * z * x + x
    e = exp32(ax + ax)
    big = _F(1.0) - _F(2.0) / (e + _F(1.0))
    big = -big if x < _F(0.0) else big
    return small if ax < _F(0.625) else big


# erf(x) = x P(x^2) / Q(x^2) for |x| <= 3.925, where float32 erf reaches 1; the rational
# fit of tools/fit_erf.py (relative error 1.8e-9 in float64). No exponential: the
# Abramowitz & Stegun formula this replaced took an exp32 and a second polynomial and ran
# at half the speed.
_ERF_CLAMP = 3.925
_ERF_P = (1.1283791690965077, 0.18514453948382226, 0.05424942553933694,
          0.003839541042128015, 0.0003769511454379923, 4.6142420339310986e-06,
          -1.2826997741743895e-08)
_ERF_Q = (1.0, 0.49741348202205116, 0.1138813152962844, 0.01543256340145597,
          0.0013019682941275141, 6.244623474024012e-05)


@njit(inline="always", cache=True)
def erf32(x):
    """erf in float32: x P(x^2) / Q(x^2) on the clamped argument (see `_ERF_P`)."""
    xc = min(max(x, _F(-_ERF_CLAMP)), _F(_ERF_CLAMP))
    t = xc * xc
    p = _F(_ERF_P[6]) * t + _F(_ERF_P[5])
    p = p * t + _F(_ERF_P[4])
    p = p * t + _F(_ERF_P[3])
    p = p * t + _F(_ERF_P[2])
    p = p * t + _F(_ERF_P[1])
    p = p * t + _F(_ERF_P[0])
    q = _F(_ERF_Q[5]) * t + _F(_ERF_Q[4])
    q = q * t + _F(_ERF_Q[3])
    q = q * t + _F(_ERF_Q[2])
    q = q * t + _F(_ERF_Q[1])
    q = q * t + _F(1.0)
    r = min(max(xc * p / q, _F(-1.0)), _F(1.0))
    return x if x != x else r


@njit(inline="always", cache=True)
def sigmoid32(x):
    """1 / (1 + e**-x) in float32."""
    return _F(1.0) / (_F(1.0) + exp32(-x))


# GELU'(x) = Phi(x) + x phi(x) = 1/2 + x P(t) / Q(t), t = x^2 / 36, on |x| <= 6; beyond,
# 1 (or 0 within 4e-8 on the negative side). Degrees 7 and 6, reproduced by
# `tools/fit_erf.py --dgelu`. One rational function instead of erf32 and exp32: 2.1x faster.
_DGELU_CLAMP = 6.0
_DGELU_P = (0.7978845234279256, -0.6522286280698646, 17.589626887101346, 13.239239038334418,
            53.79792844955868, 67.59240791113608, 28.23298439402253, -2.259954424628884)
_DGELU_Q = (1.0, 11.182535600124151, 59.03754239596481, 193.4433881376176, 433.7454521817545,
            652.6904429156739, 788.9551658618993)


@njit(inline="always", cache=True)
def dgelu32(x):
    """The derivative of exact GELU, Phi(x) + x phi(x), in float32 (see `_DGELU_P`)."""
    xc = min(max(x, _F(-_DGELU_CLAMP)), _F(_DGELU_CLAMP))
    t = xc * xc * _F(1.0 / (_DGELU_CLAMP * _DGELU_CLAMP))
    p = _F(_DGELU_P[7]) * t + _F(_DGELU_P[6])
    p = p * t + _F(_DGELU_P[5])
    p = p * t + _F(_DGELU_P[4])
    p = p * t + _F(_DGELU_P[3])
    p = p * t + _F(_DGELU_P[2])
    p = p * t + _F(_DGELU_P[1])
    p = p * t + _F(_DGELU_P[0])
    q = _F(_DGELU_Q[6]) * t + _F(_DGELU_Q[5])
    q = q * t + _F(_DGELU_Q[4])
    q = q * t + _F(_DGELU_Q[3])
    q = q * t + _F(_DGELU_Q[2])
    q = q * t + _F(_DGELU_Q[1])
    q = q * t + _F(1.0)
    return x if x != x else _F(0.5) + xc * p / q


@njit(inline="always", cache=True)
def dgelu64(x):
    """The derivative of exact GELU in float64, from libm's erf and exp."""
    return (0.5 * (1.0 + math.erf(x * 0.7071067811865476))
            + x * (0.3989422804014327 * math.exp(-0.5 * x * x)))



@njit(inline="always", cache=True, nogil=True)
def _pw_block(a, lo, n, zero):
    """numpy's pairwise_sum on at most 128 elements: 8 accumulators, then the rest."""
    if n < 8:
        res = zero
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = lo + 8
    end = lo + n - n % 8
    while i < end:
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < lo + n:
        res += a[i]
        i += 1
    return res


@njit(cache=True, nogil=True)
def pairwise_sum(a, lo, n, zero):
    """Sum of a[lo:lo + n] in numpy's pairwise order (blocks of at most 128 summed by
    `_pw_block`, halves rounded to multiples of 8 above that), so a fused row sum is
    bit-identical to `np.sum(x, axis=-1)` on a contiguous row. `zero` gives the type.
    Iterative (an explicit stack): numba's cache cannot link recursive functions."""
    if n <= 128:
        return _pw_block(a, lo, n, zero)
    f_lo = np.empty(64, np.int64)
    f_n = np.empty(64, np.int64)
    f_st = np.zeros(64, np.int64)
    vals = np.empty(64, a.dtype)
    top, nv = 0, 0
    f_lo[0], f_n[0], f_st[0] = lo, n, 0
    while top >= 0:
        m = f_n[top]
        if m <= 128:
            vals[nv] = _pw_block(a, f_lo[top], m, zero)
            nv += 1
            top -= 1
            continue
        n2 = m // 2
        n2 -= n2 % 8
        st = f_st[top]
        f_st[top] = st + 1
        if st == 0:
            f_lo[top + 1], f_n[top + 1], f_st[top + 1] = f_lo[top], n2, 0
            top += 1
        elif st == 1:
            f_lo[top + 1], f_n[top + 1], f_st[top + 1] = f_lo[top] + n2, m - n2, 0
            top += 1
        else:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
            top -= 1
    return vals[0]
