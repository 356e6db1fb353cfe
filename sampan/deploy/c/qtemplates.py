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
QKERNELS["qbase"] = r"""
#if defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define SP_VNNI 1
#endif

static inline void k_qepilogue(const int32_t *acc, idx m, idx n0, idx nj, int64_t rowsum,
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

#ifdef SP_VNNI
/* the epilogue of 16 channels at once: the same operations, lane by lane (int32 sums:
   the generator checked that acc + corr cannot leave int32) */
static inline void k_qepi_vnni(__m512i s, idx m, idx n0, idx nj, const int32_t *corr,
                        const float *mult, int kind, int zy, int lo, int hi, void *y,
                        idx ysm, idx ysn)
{
    __mmask16 mk = (__mmask16)((1u << nj) - 1u);
    __m512i a = _mm512_add_epi32(s, _mm512_maskz_loadu_epi32(mk, corr + n0));
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_maskz_loadu_ps(mk, mult + n0));
    if (kind == 0) {
        float o[16];
        if (ysn == 1) { _mm512_mask_storeu_ps((float *)y + m * ysm + n0, mk, v); return; }
        _mm512_storeu_ps(o, v);
        for (idx j = 0; j < nj; j++) ((float *)y)[m * ysm + (n0 + j) * ysn] = o[j];
        return;
    }
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-1e9f)), _mm512_set1_ps(1e9f));
    v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(v), _mm512_set1_epi32(zy));
    q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(lo)), _mm512_set1_epi32(hi));
    __m128i b = _mm512_cvtepi32_epi8(q);
    unsigned char *yb = (unsigned char *)y, o[16];
    if (ysn == 1) { _mm_mask_storeu_epi8(yb + m * ysm + n0, mk, b); return; }
    _mm_storeu_si128((__m128i *)o, b);
    for (idx j = 0; j < nj; j++) yb[m * ysm + (n0 + j) * ysn] = o[j];
}

static inline __m512i sp_dp4(__m512i s, const uint8_t *x, idx q, idx K, __m512i w)
{
    int32_t four;
    if (4 * q + 4 <= K) memcpy(&four, x + 4 * q, 4);
    else {
        uint8_t t[4] = {0, 0, 0, 0};
        idx left = K - 4 * q;
        for (int i = 0; i < 4 && i < left; i++) t[i] = x[4 * q + i];
        memcpy(&four, t, 4);
    }
    return _mm512_dpbusd_epi32(s, _mm512_set1_epi32(four), w);
}
#endif

"""

QKERNELS["qgemm"] = r"""
/* i32ok: acc + corr stays in int32 (the vector epilogue's condition) */
SP_KERNEL void k_qgemm(idx M, idx N, idx K, const void *xv, int x_signed, idx lda,
                    const int8_t *Wp, const int32_t *corr, const int32_t *wz,
                    const float *mult, int kind, int zy, int lo, int hi,
                    void *y, idx ysm, idx ysn, int i32ok)
{
    idx K4 = (K + 3) / 4, panels = (N + 15) / 16;
    const uint8_t *xu = (const uint8_t *)xv;
    const int8_t *xs = (const int8_t *)xv;
    (void)i32ok;
#if defined(_OPENMP)
#pragma omp parallel for num_threads(SP_THREADS) if (SP_THREADS > 1 && M * K * N >= 65536)
#endif
    for (idx p = 0; p < panels; p++) {
        const int8_t *bp = Wp + p * K4 * 64;
        idx n0 = p * 16, nj = N - n0 < 16 ? N - n0 : 16;
#ifdef SP_VNNI
        if (!x_signed && !wz && i32ok) {
            idx m = 0;
            const uint8_t *xr = xu;
            for (; m + 4 <= M; m += 4, xr += 4 * lda) {
                const uint8_t *x0 = xr, *x1 = x0 + lda, *x2 = x1 + lda, *x3 = x2 + lda;
                __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
                for (idx q = 0; q < K4; q++) {
                    __m512i w = _mm512_loadu_si512((const void *)(bp + q * 64));
                    s0 = sp_dp4(s0, x0, q, K, w); s1 = sp_dp4(s1, x1, q, K, w);
                    s2 = sp_dp4(s2, x2, q, K, w); s3 = sp_dp4(s3, x3, q, K, w);
                }
                k_qepi_vnni(s0, m, n0, nj, corr, mult, kind, zy, lo, hi, y, ysm, ysn);
                k_qepi_vnni(s1, m + 1, n0, nj, corr, mult, kind, zy, lo, hi, y, ysm, ysn);
                k_qepi_vnni(s2, m + 2, n0, nj, corr, mult, kind, zy, lo, hi, y, ysm, ysn);
                k_qepi_vnni(s3, m + 3, n0, nj, corr, mult, kind, zy, lo, hi, y, ysm, ysn);
            }
            for (; m < M; m++, xr += lda) {
                const uint8_t *x0 = xr;
                __m512i s0 = _mm512_setzero_si512(), s1 = s0;
                idx q = 0;
                for (; q + 2 <= K4; q += 2) {
                    s0 = sp_dp4(s0, x0, q, K, _mm512_loadu_si512((const void *)(bp + q * 64)));
                    s1 = sp_dp4(s1, x0, q + 1, K, _mm512_loadu_si512((const void *)(bp + q * 64 + 64)));
                }
                if (q < K4) s0 = sp_dp4(s0, x0, q, K, _mm512_loadu_si512((const void *)(bp + q * 64)));
                k_qepi_vnni(_mm512_add_epi32(s0, s1), m, n0, nj, corr, mult, kind, zy, lo, hi,
                            y, ysm, ysn);
            }
            continue;
        }
#endif
        for (idx m = 0; m < M; m++) {
            int64_t rowsum = 0;
            if (wz) {
                for (idx k = 0; k < K; k++) rowsum += x_signed ? xs[m * lda + k] : xu[m * lda + k];
            }
            int32_t acc[16];
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

# one image of an int8 conv2d: im2row into col (P rows of Kg bytes rounded up to 4, padded
# with the zero point xz inside the image border and 0 past Kg, where the packed weight is
# 0 too) per group, then k_qgemm writing channel-major into y
QKERNELS["qconv2d"] = r"""
SP_KERNEL void k_qconv2d(idx G, idx C, idx H, idx W, const void *xv, int x_signed, idx OC,
                      idx KH, idx KW, const int8_t *Wp, const int32_t *corr,
                      const int32_t *wz, const float *mult, int kind, int zy, int lo, int hi,
                      int xz, idx OH, idx OW, idx sh, idx sw, idx ph, idx pw, idx dh, idx dw,
                      unsigned char *col, void *y, size_t ysize, int i32ok)
{
    idx Cg = C / G, OCg = OC / G, K = Cg * KH * KW, P = OH * OW;
    idx Kp = (K + 3) / 4 * 4;
    idx gstride = ((OCg + 15) / 16) * (Kp / 4) * 64;
    const unsigned char *x = (const unsigned char *)xv;
    for (idx g = 0; g < G; g++) {
        const unsigned char *xg = x + g * Cg * H * W;
        for (idx oh = 0; oh < OH; oh++)
            for (idx ow = 0; ow < OW; ow++) {
                unsigned char *row = col + (oh * OW + ow) * Kp;
                idx iw0 = ow * sw - pw;
                int inside = dw == 1 && iw0 >= 0 && iw0 + KW <= W;
                for (idx c = 0; c < Cg; c++)
                    for (idx kh = 0; kh < KH; kh++) {
                        idx ih = oh * sh - ph + kh * dh;
                        unsigned char *r = row + (c * KH + kh) * KW;
                        if (ih < 0 || ih >= H) {
                            for (idx kw = 0; kw < KW; kw++) r[kw] = (unsigned char)xz;
                            continue;
                        }
                        const unsigned char *src = xg + (c * H + ih) * W;
                        /* 8 bytes at once where both ends hold them (the bytes past KW
                           are rewritten by the next run or the padding below) */
                        if (inside && KW <= 8 && iw0 + 8 <= W
                            && (c * KH + kh) * KW + 8 <= Kp) {
                            memcpy(r, src + iw0, 8);
                            continue;
                        }
                        if (inside) {
                            for (idx kw = 0; kw < KW; kw++) r[kw] = src[iw0 + kw];
                            continue;
                        }
                        for (idx kw = 0; kw < KW; kw++) {
                            idx iw = iw0 + kw * dw;
                            r[kw] = (iw >= 0 && iw < W) ? src[iw] : (unsigned char)xz;
                        }
                    }
                for (idx k = K; k < Kp; k++) row[k] = 0;
            }
        k_qgemm(P, OCg, Kp, col, x_signed, Kp, Wp + g * gstride, corr + g * OCg,
                wz ? wz + g * OCg : NULL, mult + g * OCg, kind, zy, lo, hi,
                (unsigned char *)y + (size_t)(g * OCg * P) * ysize, 1, P, i32ok);
    }
}
"""


# one image of an int8 conv2d with few output channels: im2col in groups of 4 bytes per
# pixel (col[(q * P + p) * 4 + t] = x at kernel offset 4q + t of pixel p; the zero point
# outside the image, 0 past Kg), then per output channel the 16-pixel dot products
# (VNNI where compiled: pixels in the lanes, the weight's 4 bytes broadcast), the same
# integer sums and epilogue as k_qgemm; w4: the weight as OC rows of Kg rounded up to 4
QKERNELS["qconv2d_wcol"] = r"""
SP_KERNEL void k_qconv2d_wcol(idx G, idx C, idx H, idx W, const void *xv, int x_signed, idx OC,
                           idx KH, idx KW, const int8_t *w4, const int32_t *corr,
                           const int32_t *wz, const float *mult, int kind, int zy, int lo,
                           int hi, int xz, idx OH, idx OW, idx sh, idx sw, idx ph, idx pw,
                           idx dh, idx dw, unsigned char *col, void *y, size_t ysize, int i32ok)
{
    idx Cg = C / G, OCg = OC / G, K = Cg * KH * KW, P = OH * OW;
    idx Kp = (K + 3) / 4 * 4, K4 = Kp / 4;
    const unsigned char *x = (const unsigned char *)xv;
    (void)i32ok;
    for (idx g = 0; g < G; g++) {
        const unsigned char *xg = x + g * Cg * H * W;
        /* small images: a copy padded with the zero point (and a row of zeros for the
           offsets past Kg) makes every kernel offset's row a plain pointer */
        idx Hp = (OH - 1) * sh + (KH - 1) * dh + 1, Wp = (OW - 1) * sw + (KW - 1) * dw + 1;
        unsigned char pad[8192];
        if (Cg * Hp * Wp + Wp <= (idx)sizeof pad) {
            for (idx c = 0; c < Cg; c++)
                for (idx i = 0; i < Hp; i++) {
                    unsigned char *pr = pad + (c * Hp + i) * Wp;
                    idx ih = i - ph;
                    for (idx j = 0; j < Wp; j++) {
                        idx iw = j - pw;
                        pr[j] = (ih >= 0 && ih < H && iw >= 0 && iw < W)
                            ? xg[(c * H + ih) * W + iw] : (unsigned char)xz;
                    }
                }
            memset(pad + Cg * Hp * Wp, 0, (size_t)Wp);
            for (idx q = 0; q < K4; q++) {
                const unsigned char *s4[4];
                for (int t = 0; t < 4; t++) {
                    idx k = 4 * q + t, c = k / (KH * KW), kh = k / KW % KH, kw = k % KW;
                    s4[t] = k < K ? pad + (c * Hp + kh * dh) * Wp + kw * dw : pad + Cg * Hp * Wp;
                }
                for (idx oh = 0; oh < OH; oh++) {
                    unsigned char *d = col + (q * P + oh * OW) * 4;
                    idx ro = oh * sh * Wp;
                    const unsigned char *a0 = s4[0] + (s4[0] == pad + Cg * Hp * Wp ? 0 : ro);
                    const unsigned char *a1 = s4[1] + (s4[1] == pad + Cg * Hp * Wp ? 0 : ro);
                    const unsigned char *a2 = s4[2] + (s4[2] == pad + Cg * Hp * Wp ? 0 : ro);
                    const unsigned char *a3 = s4[3] + (s4[3] == pad + Cg * Hp * Wp ? 0 : ro);
                    if (sw == 1)
                        for (idx i = 0; i < OW; i++) {
                            d[4 * i] = a0[i]; d[4 * i + 1] = a1[i];
                            d[4 * i + 2] = a2[i]; d[4 * i + 3] = a3[i];
                        }
                    else
                        for (idx i = 0; i < OW; i++) {
                            d[4 * i] = a0[i * sw]; d[4 * i + 1] = a1[i * sw];
                            d[4 * i + 2] = a2[i * sw]; d[4 * i + 3] = a3[i * sw];
                        }
                }
            }
        } else
        for (idx q = 0; q < K4; q++) {
            /* per output row: the 4 kernel offsets' input bytes, contiguous, then
               interleaved into col (loops the compiler vectorises) */
            idx cq[4], kh4[4], lo[4], hi[4], off[4];
            for (int t = 0; t < 4; t++) {
                idx k = 4 * q + t;
                cq[t] = k < K ? k / (KH * KW) : -1;
                kh4[t] = k / KW % KH;
                off[t] = k % KW * dw - pw;
                lo[t] = 0; hi[t] = OW;
                while (lo[t] < OW && lo[t] * sw + off[t] < 0) lo[t]++;
                while (hi[t] > lo[t] && (hi[t] - 1) * sw + off[t] >= W) hi[t]--;
            }
            for (idx oh = 0; oh < OH; oh++) {
                unsigned char *d = col + (q * P + oh * OW) * 4;
                for (idx ow0 = 0; ow0 < OW; ow0 += 64) {
                    idx n = OW - ow0 < 64 ? OW - ow0 : 64;
                    unsigned char b[4][64];
                    for (int t = 0; t < 4; t++) {
                        idx ih = oh * sh - ph + kh4[t] * dh;
                        unsigned char fill = cq[t] < 0 ? 0 : (unsigned char)xz;
                        if (cq[t] < 0 || ih < 0 || ih >= H) {
                            memset(b[t], fill, (size_t)n);
                            continue;
                        }
                        const unsigned char *src = xg + (cq[t] * H + ih) * W + off[t];
                        idx a = lo[t] - ow0, e = hi[t] - ow0;
                        a = a < 0 ? 0 : (a > n ? n : a);
                        e = e < a ? a : (e > n ? n : e);
                        memset(b[t], fill, (size_t)a);
                        if (sw == 1) memcpy(b[t] + a, src + ow0 + a, (size_t)(e - a));
                        else for (idx i = a; i < e; i++) b[t][i] = src[(ow0 + i) * sw];
                        memset(b[t] + e, fill, (size_t)(n - e));
                    }
                    unsigned char *dd = d + ow0 * 4;
                    for (idx i = 0; i < n; i++) {
                        dd[4 * i] = b[0][i]; dd[4 * i + 1] = b[1][i];
                        dd[4 * i + 2] = b[2][i]; dd[4 * i + 3] = b[3][i];
                    }
                }
            }
        }
        const int8_t *wg = w4 + g * OCg * Kp;
        unsigned char *yg = (unsigned char *)y + (size_t)(g * OCg * P) * ysize;
        idx o = 0;
#ifdef SP_VNNI
        if (!x_signed && !wz && i32ok) {
            for (; o < OCg; o++) {
                const int8_t *wo = wg + o * Kp;
                const int32_t co = corr[g * OCg + o];
                const float mo = mult[g * OCg + o];
                for (idx p0 = 0; p0 < P; p0 += 16) {
                    idx nj = P - p0 < 16 ? P - p0 : 16;
                    __mmask16 mk = (__mmask16)((1u << nj) - 1u);
                    __m512i s0 = _mm512_setzero_si512(), s1 = s0;
                    idx q = 0;
                    for (; q + 2 <= K4; q += 2) {
                        int32_t f0, f1;
                        memcpy(&f0, wo + 4 * q, 4);
                        memcpy(&f1, wo + 4 * q + 4, 4);
                        s0 = _mm512_dpbusd_epi32(s0, _mm512_loadu_si512((const void *)(col + (q * P + p0) * 4)), _mm512_set1_epi32(f0));
                        s1 = _mm512_dpbusd_epi32(s1, _mm512_loadu_si512((const void *)(col + ((q + 1) * P + p0) * 4)), _mm512_set1_epi32(f1));
                    }
                    if (q < K4) {
                        int32_t f0;
                        memcpy(&f0, wo + 4 * q, 4);
                        s0 = _mm512_dpbusd_epi32(s0, _mm512_loadu_si512((const void *)(col + (q * P + p0) * 4)), _mm512_set1_epi32(f0));
                    }
                    __m512i a = _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(co));
                    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(mo));
                    if (kind == 0) {
                        _mm512_mask_storeu_ps((float *)yg + o * P + p0, mk, v);
                        continue;
                    }
                    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-1e9f)), _mm512_set1_ps(1e9f));
                    v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                    __m512i qv = _mm512_add_epi32(_mm512_cvtps_epi32(v), _mm512_set1_epi32(zy));
                    qv = _mm512_min_epi32(_mm512_max_epi32(qv, _mm512_set1_epi32(lo)), _mm512_set1_epi32(hi));
                    _mm_mask_storeu_epi8(yg + o * P + p0, mk, _mm512_cvtepi32_epi8(qv));
                }
            }
        }
#endif
        for (; o < OCg; o++) {
            const int8_t *wo = wg + o * Kp;
            idx n = g * OCg + o;
            for (idx p = 0; p < P; p++) {
                int32_t acc = 0;
                int64_t rowsum = 0;
                for (idx q = 0; q < K4; q++)
                    for (int t = 0; t < 4; t++) {
                        int32_t xv4 = x_signed ? (int32_t)(int8_t)col[(q * P + p) * 4 + t]
                                               : (int32_t)col[(q * P + p) * 4 + t];
                        acc += xv4 * wo[4 * q + t];
                        rowsum += xv4;
                    }
                k_qepilogue(&acc, p, n, 1, rowsum, corr, wz, mult, kind, zy, lo, hi,
                            yg - (size_t)(g * OCg * P) * ysize, 1, P);
            }
        }
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
SP_KERNEL void k_maxpool2d_@T@(idx NC, idx H, idx W, const @C@ *x, idx OH, idx OW, idx KH,
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
