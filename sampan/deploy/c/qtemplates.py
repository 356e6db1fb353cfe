"""The int8 C templates of the C target (the requantising ops of `sampan/ops/quant_fused.py`
and quantize / dequantize): an exact int8 GEMM over weights packed for VNNI's
`_mm512_dpbusd_epi32` (used where the compiler targets AVX512-VNNI, behind `#if`), with
a portable path giving the same integers, and an epilogue that requantises as the op
table's reference does (float32 multiply, rint half to even, saturate).

Weights are packed in panels of 16 output channels, each K/4 (rounded up) groups of 16 x
4 bytes: panel p, group q holds w[16p + j][4q + t] at byte ((p * K4 + q) * 16 + j) * 4 + t
(zero past N and K)."""
from __future__ import annotations

import numpy as np

QKERNELS = {}

# y[m, n] for m < M, n < N: acc = sum_k x[m, k] w[n, k] exactly (int32), then
#   a = acc + corr[n] - wz[n] * rowsum(x[m])   (corr: bias - xz colsum(w[n]) + K xz wz[n])
#   v = float(a) * mult[n];  kind 0: float32 v;  kind 1/2: uint8/int8 saturate(rint(v) + zy)
# written at y + m * ysm + n * ysn (elements)
QKERNELS["qgemm"] = r"""
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#include <immintrin.h>
#define SP_VNNI 1
#endif

static void k_qepilogue(const int32_t *acc, idx m, idx n0, idx nj, int64_t rowsum,
                        const int32_t *corr, const int32_t *wz, const float *mult, int kind,
                        int zy, int lo, int hi, void *y, idx ysm, idx ysn)
{
    for (idx j = 0; j < nj; j++) {
        idx n = n0 + j;
        int64_t a = (int64_t)acc[j] + corr[n] - (wz ? (int64_t)wz[n] * rowsum : 0);
        float v = (float)a * mult[n];
        idx at = m * ysm + n * ysn;
        if (kind == 0) { ((float *)y)[at] = v; continue; }
        if (v > 1e9f) v = 1e9f;
        if (v < -1e9f) v = -1e9f;
        int64_t q = (int64_t)rintf(v) + zy;
        q = q < lo ? lo : (q > hi ? hi : q);
        if (kind == 1) ((uint8_t *)y)[at] = (uint8_t)q;
        else ((int8_t *)y)[at] = (int8_t)q;
    }
}

static void k_qgemm(idx M, idx N, idx K, const void *xv, int x_signed, idx lda,
                    const int8_t *Wp, const int32_t *corr, const int32_t *wz,
                    const float *mult, int kind, int zy, int lo, int hi,
                    void *y, idx ysm, idx ysn)
{
    idx K4 = (K + 3) / 4, panels = (N + 15) / 16;
    const uint8_t *xu = (const uint8_t *)xv;
    const int8_t *xs = (const int8_t *)xv;
#if defined(_OPENMP)
#pragma omp parallel for num_threads(SP_THREADS) if (SP_THREADS > 1 && M * K * N >= 65536)
#endif
    for (idx p = 0; p < panels; p++) {
        const int8_t *bp = Wp + p * K4 * 64;
        idx n0 = p * 16, nj = N - n0 < 16 ? N - n0 : 16;
        for (idx m = 0; m < M; m++) {
            int64_t rowsum = 0;
            if (wz) {
                for (idx k = 0; k < K; k++) rowsum += x_signed ? xs[m * lda + k] : xu[m * lda + k];
            }
            int32_t acc[16];
#ifdef SP_VNNI
            if (!x_signed) {
                const uint8_t *xr = xu + m * lda;
                __m512i s = _mm512_setzero_si512();
                idx q = 0;
                for (; q < K / 4; q++) {
                    int32_t four;
                    memcpy(&four, xr + 4 * q, 4);
                    s = _mm512_dpbusd_epi32(s, _mm512_set1_epi32(four),
                                            _mm512_loadu_si512((const void *)(bp + q * 64)));
                }
                if (q < K4) {
                    uint8_t tail[4] = {0, 0, 0, 0};
                    int32_t four;
                    for (idx t = 0; 4 * q + t < K; t++) tail[t] = xr[4 * q + t];
                    memcpy(&four, tail, 4);
                    s = _mm512_dpbusd_epi32(s, _mm512_set1_epi32(four),
                                            _mm512_loadu_si512((const void *)(bp + q * 64)));
                }
                _mm512_storeu_si512((void *)acc, s);
                k_qepilogue(acc, m, n0, nj, rowsum, corr, wz, mult, kind, zy, lo, hi, y, ysm, ysn);
                continue;
            }
#endif
            for (int j = 0; j < 16; j++) acc[j] = 0;
            for (idx q = 0; q < K4; q++) {
                int32_t a[4];
                for (int t = 0; t < 4; t++) {
                    idx k = 4 * q + t;
                    a[t] = k < K ? (x_signed ? xs[m * lda + k] : xu[m * lda + k]) : 0;
                }
                const int8_t *b = bp + q * 64;
                for (int j = 0; j < 16; j++)
                    acc[j] += a[0] * b[4 * j] + a[1] * b[4 * j + 1] + a[2] * b[4 * j + 2]
                              + a[3] * b[4 * j + 3];
            }
            k_qepilogue(acc, m, n0, nj, rowsum, corr, wz, mult, kind, zy, lo, hi, y, ysm, ysn);
        }
    }
}
"""

# one image of an int8 conv2d: im2row into col (P x Kg bytes, padded with the zero point
# xz) per group, then k_qgemm writing channel-major into y
QKERNELS["qconv2d"] = r"""
static void k_qconv2d(idx G, idx C, idx H, idx W, const void *xv, int x_signed, idx OC,
                      idx KH, idx KW, const int8_t *Wp, const int32_t *corr,
                      const int32_t *wz, const float *mult, int kind, int zy, int lo, int hi,
                      int xz, idx OH, idx OW, idx sh, idx sw, idx ph, idx pw, idx dh, idx dw,
                      unsigned char *col, void *y, size_t ysize)
{
    idx Cg = C / G, OCg = OC / G, K = Cg * KH * KW, P = OH * OW;
    idx gstride = ((OCg + 15) / 16) * ((K + 3) / 4) * 64;
    const unsigned char *x = (const unsigned char *)xv;
    for (idx g = 0; g < G; g++) {
        const unsigned char *xg = x + g * Cg * H * W;
        for (idx oh = 0; oh < OH; oh++)
            for (idx ow = 0; ow < OW; ow++) {
                unsigned char *row = col + (oh * OW + ow) * K;
                for (idx c = 0; c < Cg; c++)
                    for (idx kh = 0; kh < KH; kh++) {
                        idx ih = oh * sh - ph + kh * dh;
                        for (idx kw = 0; kw < KW; kw++) {
                            idx iw = ow * sw - pw + kw * dw;
                            row[(c * KH + kh) * KW + kw] = (ih >= 0 && ih < H && iw >= 0 && iw < W)
                                ? xg[(c * H + ih) * W + iw] : (unsigned char)xz;
                        }
                    }
            }
        k_qgemm(P, OCg, K, col, x_signed, K, Wp + g * gstride, corr + g * OCg,
                wz ? wz + g * OCg : NULL, mult + g * OCg, kind, zy, lo, hi,
                (unsigned char *)y + (size_t)(g * OCg * P) * ysize, 1, P);
    }
}
"""


def pack_int8(w: np.ndarray) -> np.ndarray:
    """An int8 weight (N, K) packed as the module doc says (bytes)."""
    n, k = w.shape
    k4, panels = -(-k // 4), -(-n // 16)
    buf = np.zeros((panels * 16, k4 * 4), np.int8)
    buf[:n, :k] = w
    return np.ascontiguousarray(buf.reshape(panels, 16, k4, 4).transpose(0, 2, 1, 3)).ravel()


def maxpool_kernel(ct: str, lowest: str) -> str:
    """The max_pool2d template over C type `ct` (the float one: `templates`)."""
    return r"""
static void k_maxpool2d_@T@(idx NC, idx H, idx W, const @C@ *x, idx OH, idx OW, idx KH,
                           idx KW, idx sh, idx sw, idx ph, idx pw, idx dh, idx dw, @C@ *y)
{
    for (idx n = 0; n < NC; n++) {
        const @C@ *xs = x + n * H * W;
        for (idx oh = 0; oh < OH; oh++)
            for (idx ow = 0; ow < OW; ow++) {
                @C@ m = @LOW@;
                for (idx i = 0; i < KH; i++) {
                    idx ih = oh * sh - ph + i * dh;
                    if (ih < 0 || ih >= H) continue;
                    for (idx j = 0; j < KW; j++) {
                        idx iw = ow * sw - pw + j * dw;
                        if (iw < 0 || iw >= W) continue;
                        if (xs[ih * W + iw] > m) m = xs[ih * W + iw];
                    }
                }
                y[(n * OH + oh) * OW + ow] = m;
            }
    }
}
""".replace("@T@", ct.replace("_t", "")).replace("@C@", ct).replace("@LOW@", lowest)
