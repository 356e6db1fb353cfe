"""The C target's scalar helpers: small `static inline` C99 functions a generated file
defines when its steps call them (numpy's NaN-propagating max/min, sign, rint, and the
branch-free e^x and erf that let softmax's and GELU's loops vectorise). `cgen` writes
them, sorted by key, before the kernels: a key sorts after those its helper calls."""
from __future__ import annotations

HELPERS = {
    # NaN in either gives NaN (numpy's maximum/minimum), branch-free so loops vectorise
    "sp_maxf": "static inline float sp_maxf(float a, float b) "
               "{ return (a > b || a != a) ? a : b; }",
    "sp_minf": "static inline float sp_minf(float a, float b) "
               "{ return (a < b || a != a) ? a : b; }",
    "sp_maxd": "static inline double sp_maxd(double a, double b) "
               "{ return (a > b || a != a) ? a : b; }",
    "sp_mind": "static inline double sp_mind(double a, double b) "
               "{ return (a < b || a != a) ? a : b; }",
    "sp_maxi": "static inline int64_t sp_maxi(int64_t a, int64_t b) { return a > b ? a : b; }",
    "sp_mini": "static inline int64_t sp_mini(int64_t a, int64_t b) { return a < b ? a : b; }",
    "sp_signf": "static inline float sp_signf(float a) "
                "{ return a > 0 ? 1.0f : (a < 0 ? -1.0f : a); }",
    "sp_signd": "static inline double sp_signd(double a) "
                "{ return a > 0 ? 1.0 : (a < 0 ? -1.0 : a); }",
    "sp_rintf": "static inline float sp_rintf(float a) { return rintf(a); }",
    # e^x for softmax and erf, branch-free so their loops vectorise: x = n ln2 + r with
    # |r| <= ln2/2 (n rounded by the 1.5 * 2^23 trick: no float-to-int conversion, which
    # traps on NaN in wasm), e^r by Cephes' degree-6 polynomial (about 1 ulp), 2^n from
    # n's bits; below -86.9 it gives 0 (the normal range ends there; the exp op keeps expf)
    "sp_expf": r"""static inline float sp_expf(float x)
{
    float xc = x < -86.9f ? -86.9f : (x > 88.72f ? 88.72f : x);
    float t = xc * 1.44269504f + 12582912.0f, n = t - 12582912.0f, s, y;
    uint32_t tb, sb;
    float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r
                + 4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f;
    memcpy(&tb, &t, 4);
    sb = (tb - 0x4B400000u + 126u) << 23;
    memcpy(&s, &sb, 4);
    y = (((p * r * r + r) + 1.0f) * 2.0f) * s;     /* never a subnormal on the way (slow on x86) */
    y = x < -86.9f ? 0.0f : y;
    y = x > 88.72f ? INFINITY : y;
    return x != x ? x : y;
}""",
    # erf, branch-free (the GELU's loop vectorises): below |x| = 0.5 its Taylor series to
    # x^13, above it 1 - erfc by Numerical Recipes' Chebyshev fit (fractional error under
    # 1.2e-7); within 2e-7 of erff
    "sp_expf_erf": r"""static inline float sp_erff(float x)
{
    float a = fabsf(x), z = x * x;
    float p = x * (1.1283791671f + z * (-0.3761263890f + z * (0.1128379167f + z * (
        -0.0268661706f + z * (0.0052239776f + z * (-0.0008548327f + z * 0.0001205491f))))));
    float t = 1.0f / (1.0f + 0.5f * a);
    float q = t * sp_expf(-z - 1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (
        0.09678418f + t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (
        1.48851587f + t * (-0.82215223f + t * 0.17087277f)))))))));
    float r = copysignf(1.0f - q, x);
    return a < 0.5f ? p : r;
}""",
    "sp_rintd": "static inline double sp_rintd(double a) { return rint(a); }",
}
