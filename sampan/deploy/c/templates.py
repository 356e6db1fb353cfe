"""The C templates of the C target: one per op family, the generator's own C99 text
(standard library only). `cgen` includes a template only when a step of the program uses
it. Every kernel is `static` (SP_KERNEL; noinline in wasm), so two generated models
link into one program; the exported names are the model's prefix's (see `cfiles`)."""
from __future__ import annotations

from .helpers import HELPERS  # noqa: F401  (the scalar helpers: sp_maxf ... sp_expf, sp_erff)
from .rowkernels import ROW_KERNELS

# The big loops (GEMM panels and rows) carry an OpenMP pragma behind `#if defined(_OPENMP)`
# with the generation's thread count (SP_THREADS); without OpenMP they run on one thread.

# the GEMM micro-kernel's panel width: B is packed in panels of NR columns
NR = 16
MR = 4

KERNELS = {}

# C[M,N] = A[M,K] (rows lda apart) x B, B packed in panels of 16 columns: panel p holds
# B[k][16p + j] at Bp[(p*K + k)*16 + j], zero past column N. MR x NR register blocks.
# the float kernels' vectors and epilogue macros (included before them)
KERNELS["vec"] = r"""
/* GCC and Clang (zig cc, emcc, wasi-sdk too): 16-float vectors, lowered to the target's
   registers (AVX-512, AVX2, SSE, NEON, wasm SIMD128); any other compiler, or
   -DSP_NO_VECTORS: plain loops */
#if defined(__GNUC__) && !defined(SP_NO_VECTORS)
#define SP_VEC 1
typedef float sp_v16 __attribute__((vector_size(64)));
typedef int32_t sp_i16 __attribute__((vector_size(64)));
#define SP_RELU(v) ((sp_v16)((sp_i16)(v) & ~((v) < zero)))
/* the 4 cache lines 1024 floats past p (a hint: never faults, nothing on wasm) */
#define SP_PREFETCH(p) do { const char *pf_ = (const char *)(p) + 4096; \
    __builtin_prefetch(pf_, 0, 3); __builtin_prefetch(pf_ + 64, 0, 3); \
    __builtin_prefetch(pf_ + 128, 0, 3); __builtin_prefetch(pf_ + 192, 0, 3); } while (0)
#endif
#define SP_ACT(v) ((act && (v) < 0.0f) ? 0.0f : (v))
/* the packed GEMM's register blocking per target: a row alone (batch 1: a GEMV) keeps 4
   accumulators of 16 floats, 16 registers where vectors are 128-bit (wasm SIMD128: all of
   V8's 16 on x86-64), so there (or with -DSP_GEMM_NARROW; -DSP_GEMM_WIDE keeps the wide
   one) it runs each half panel in turn, 4 x 8 floats: the W5 MLP 14% faster in Node. Rows
   in fours run 4 rows x half a panel there too (8 accumulators of 4 floats): with the
   kernels kept out of graph_main (SP_KERNEL) that ran MiniLM's GEMMs 1.5x faster in Node
   than the 8 x 16 block, whose 32 accumulators spill (inlined, the two had measured the
   other way round). Natively the 8 x 16 and 4 x 16 blocks stay */
#if defined(SP_VEC) && ((defined(__wasm_simd128__) && !defined(SP_GEMM_WIDE)) \
                        || defined(SP_GEMM_NARROW))
#undef SP_GEMM_NARROW
#define SP_GEMM_NARROW 1
typedef float sp_v8 __attribute__((vector_size(32)));
#endif
/* the float GEMMs let the compiler fuse their multiply-adds (FMA where the target has one;
   GCC turns contraction off under -std=c99): MiniLM natively 1.4x faster. wasm SIMD128 has
   no FMA: the same mul + add there */
#if defined(__clang__)
#define SP_FMA_FN
#define SP_FMA_BODY _Pragma("clang fp contract(fast)")
#elif defined(__GNUC__)
#define SP_FMA_FN __attribute__((optimize("fp-contract=fast")))
#define SP_FMA_BODY
#else
#define SP_FMA_FN
#define SP_FMA_BODY
#endif
#ifdef SP_VEC
typedef float sp_v4 __attribute__((vector_size(16)));
typedef int32_t sp_i4 __attribute__((vector_size(16)));
#define SP_RELU4(v) ((sp_v4)((sp_i4)(v) & ~((v) < zero4)))
#endif
"""

KERNELS["gemm_packed"] = r"""

/* act 1: ReLU on the way out (NaN stays NaN, as numpy's maximum(x, 0)) */
SP_KERNEL SP_FMA_FN void k_gemm_packed(idx M, idx N, idx K, const float *A, idx lda,
                          const float *Bp, const float *bias, float *C, idx ldc, int act)
{
    SP_FMA_BODY
    idx panels = (N + 15) / 16;
#if defined(_OPENMP)
#pragma omp parallel for num_threads(SP_THREADS) if (SP_THREADS > 1 && M * K * N >= 32768)
#endif
    for (idx p = 0; p < panels; p++) {
        const float *bp = Bp + p * K * 16;
        idx j0 = p * 16, nj = N - j0 < 16 ? N - j0 : 16;
        float bb[16];
        for (int j = 0; j < 16; j++)
            bb[j] = (bias && j < nj) ? bias[j0 + j] : 0.0f;
#ifdef SP_VEC
        sp_v16 vb, zero = {0};
        memcpy(&vb, bb, sizeof vb);
        idx i = 0;
#ifdef SP_GEMM_NARROW
        /* 4 rows x half a panel: 8 accumulators of 4 floats, 2 of B and A's splat (11 of
           the 16 128-bit registers: the 8 x 16 block's 32 accumulators spill in V8) */
        sp_v4 zero4 = {0};
        for (; i + 4 <= M; i += 4) {
            const float *a0 = A + i * lda;
            for (idx h = 0; h < nj; h += 8) {
                sp_v4 c[4][2];
                memcpy(&c[0][0], bb + h, 16);
                memcpy(&c[0][1], bb + h + 4, 16);
                for (int r = 1; r < 4; r++) { c[r][0] = c[0][0]; c[r][1] = c[0][1]; }
                const float *b = bp + h;
                for (idx k = 0; k < K; k++, b += 16) {
                    sp_v4 b0 = *(const sp_v4 *)b, b1 = *(const sp_v4 *)(b + 4);
                    for (int r = 0; r < 4; r++) {
                        float x = a0[r * lda + k];
                        c[r][0] += x * b0;
                        c[r][1] += x * b1;
                    }
                }
                idx w = nj - h < 8 ? nj - h : 8;
                for (int r = 0; r < 4; r++) {
                    float o[8];
                    if (act) { c[r][0] = SP_RELU4(c[r][0]); c[r][1] = SP_RELU4(c[r][1]); }
                    memcpy(o, &c[r][0], 16);
                    memcpy(o + 4, &c[r][1], 16);
                    memcpy(C + (i + r) * ldc + j0 + h, o, (size_t)w * sizeof(float));
                }
            }
        }
#elif defined(__AVX512F__)
        /* 8 rows x two panels (16 accumulators of AVX-512's 32 registers; with 16 registers,
           AVX2's, they would spill): B's two rows per A broadcast; an odd panel's 8-row
           blocks ran with its even neighbour's */
        if (p % 2 == 1)
            i = M - M % 8;
        else if (p + 1 < panels) {
            const float *bq = bp + K * 16;
            idx nj2 = N - j0 - 16 < 16 ? N - j0 - 16 : 16;
            float b2[16];
            sp_v16 vb2;
            for (int j = 0; j < 16; j++)
                b2[j] = (bias && j < nj2) ? bias[j0 + 16 + j] : 0.0f;
            memcpy(&vb2, b2, sizeof vb2);
            for (; i + 8 <= M; i += 8) {
                sp_v16 c[8], d[8];
                const float *a = A + i * lda;
                for (int r = 0; r < 8; r++) { c[r] = vb; d[r] = vb2; }
                for (idx k = 0; k < K; k++) {
                    sp_v16 b = *(const sp_v16 *)(bp + k * 16), e = *(const sp_v16 *)(bq + k * 16);
                    for (int r = 0; r < 8; r++) {
                        float x = a[r * lda + k];
                        c[r] += x * b;
                        d[r] += x * e;
                    }
                }
                for (int r = 0; r < 8; r++) {
                    float o[16];
                    if (act) { c[r] = SP_RELU(c[r]); d[r] = SP_RELU(d[r]); }
                    memcpy(C + (i + r) * ldc + j0, &c[r], 64);
                    memcpy(o, &d[r], 64);
                    memcpy(C + (i + r) * ldc + j0 + 16, o, (size_t)nj2 * sizeof(float));
                }
            }
        }
#endif
        for (; i + 8 <= M; i += 8) {     /* 8 rows: 8 independent accumulators */
            sp_v16 c[8];
            const float *a = A + i * lda;
            for (int r = 0; r < 8; r++) c[r] = vb;
            for (idx k = 0; k < K; k++) {
                sp_v16 b = *(const sp_v16 *)(bp + k * 16);
                for (int r = 0; r < 8; r++) c[r] += a[r * lda + k] * b;
            }
            for (int r = 0; r < 8; r++) {
                float o[16];
                if (act) c[r] = SP_RELU(c[r]);
                memcpy(o, &c[r], 64);
                memcpy(C + (i + r) * ldc + j0, o, (size_t)nj * sizeof(float));
            }
        }
        for (; i + 4 <= M; i += 4) {
            sp_v16 c0 = vb, c1 = vb, c2 = vb, c3 = vb;
            const float *a0 = A + i * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
            for (idx k = 0; k < K; k++) {
                sp_v16 b = *(const sp_v16 *)(bp + k * 16);
                c0 += a0[k] * b; c1 += a1[k] * b; c2 += a2[k] * b; c3 += a3[k] * b;
            }
            if (act) {
                c0 = SP_RELU(c0); c1 = SP_RELU(c1); c2 = SP_RELU(c2); c3 = SP_RELU(c3);
            }
            float o[4][16];
            memcpy(o[0], &c0, 64); memcpy(o[1], &c1, 64); memcpy(o[2], &c2, 64); memcpy(o[3], &c3, 64);
            for (int r = 0; r < 4; r++)
                memcpy(C + (i + r) * ldc + j0, o[r], (size_t)nj * sizeof(float));
        }
#ifdef SP_GEMM_NARROW
        for (; i < M; i++) {
            const float *a0 = A + i * lda;
            float o[16];
            for (int h = 0; h < 16; h += 8) {
                sp_v8 c0, c1 = {0}, c2 = {0}, c3 = {0};
                memcpy(&c0, bb + h, 32);
                const float *b = bp + h, *ak = a0;
                for (idx q = K / 4; q > 0; q--, b += 64, ak += 4) {
                    c0 += ak[0] * *(const sp_v8 *)b;
                    c1 += ak[1] * *(const sp_v8 *)(b + 16);
                    c2 += ak[2] * *(const sp_v8 *)(b + 32);
                    c3 += ak[3] * *(const sp_v8 *)(b + 48);
                }
                for (idx r = K % 4; r > 0; r--, b += 16, ak++) c0 += ak[0] * *(const sp_v8 *)b;
                c0 = (c0 + c1) + (c2 + c3);
                memcpy(o + h, &c0, 32);
            }
            for (int j = 0; j < 16; j++) o[j] = SP_ACT(o[j]);
            memcpy(C + i * ldc + j0, o, (size_t)nj * sizeof(float));
        }
        (void)zero;
#else
        for (; i < M; i++) {
            /* a row alone (batch 1: a GEMV) streams the whole weight once, from L2/L3:
               the 4 cache lines 4 KiB ahead are asked for as these 4 are used */
            sp_v16 c0 = vb, c1 = zero, c2 = zero, c3 = zero;
            const float *a0 = A + i * lda;
            const float *b = bp, *ak = a0;
            for (idx q = K / 4; q > 0; q--, b += 64, ak += 4) {
                SP_PREFETCH(b);
                c0 += ak[0] * *(const sp_v16 *)b;
                c1 += ak[1] * *(const sp_v16 *)(b + 16);
                c2 += ak[2] * *(const sp_v16 *)(b + 32);
                c3 += ak[3] * *(const sp_v16 *)(b + 48);
            }
            for (idx r = K % 4; r > 0; r--, b += 16, ak++) c0 += ak[0] * *(const sp_v16 *)b;
            float o[16];
            c0 = (c0 + c1) + (c2 + c3);
            if (act) c0 = SP_RELU(c0);
            memcpy(o, &c0, 64);
            memcpy(C + i * ldc + j0, o, (size_t)nj * sizeof(float));
        }
#endif
#else
        idx i = 0;
        for (; i + 4 <= M; i += 4) {
            float c0[16], c1[16], c2[16], c3[16];
            const float *a0 = A + i * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
            for (int j = 0; j < 16; j++) { c0[j] = bb[j]; c1[j] = bb[j]; c2[j] = bb[j]; c3[j] = bb[j]; }
            for (idx k = 0; k < K; k++) {
                const float *b = bp + k * 16;
                float x0 = a0[k], x1 = a1[k], x2 = a2[k], x3 = a3[k];
                for (int j = 0; j < 16; j++) {
                    c0[j] += x0 * b[j]; c1[j] += x1 * b[j];
                    c2[j] += x2 * b[j]; c3[j] += x3 * b[j];
                }
            }
            for (idx j = 0; j < nj; j++) {
                C[i * ldc + j0 + j] = SP_ACT(c0[j]); C[(i + 1) * ldc + j0 + j] = SP_ACT(c1[j]);
                C[(i + 2) * ldc + j0 + j] = SP_ACT(c2[j]); C[(i + 3) * ldc + j0 + j] = SP_ACT(c3[j]);
            }
        }
        for (; i < M; i++) {
            float c0[16];
            const float *a0 = A + i * lda;
            for (int j = 0; j < 16; j++) c0[j] = bb[j];
            for (idx k = 0; k < K; k++) {
                const float *b = bp + k * 16;
                float x0 = a0[k];
                for (int j = 0; j < 16; j++) c0[j] += x0 * b[j];
            }
            for (idx j = 0; j < nj; j++) C[i * ldc + j0 + j] = SP_ACT(c0[j]);
        }
#endif
    }
}
"""

# C[M,N] = A[M,K] x B[K,N], all row-major (a matmul of two computed values: attention's
# batched products), B's rows read in place: 4 x 8 register blocks where vectors are 128-bit
# (wasm), as the packed GEMM; 8 x 16 elsewhere; the rows left by the row loop
KERNELS["gemm"] = r"""
SP_KERNEL SP_FMA_FN void k_gemm(idx M, idx N, idx K, const float *A, const float *B, float *C)
{
    SP_FMA_BODY
    idx rows = 0;          /* the rows the register blocks ran */
#if defined(SP_VEC) && defined(SP_GEMM_NARROW)
    idx nb = N - N % 8;
    rows = M - M % 4;
    for (idx i0 = 0; i0 < rows; i0 += 4) {
        const float *a0 = A + i0 * K;
        for (idx j = 0; j < nb; j += 8) {
            sp_v4 c[4][2] = {{{0}}};
            const float *b = B + j;
            for (idx k = 0; k < K; k++, b += N) {
                sp_v4 b0, b1;
                memcpy(&b0, b, 16);
                memcpy(&b1, b + 4, 16);
                for (int r = 0; r < 4; r++) {
                    float x = a0[r * K + k];
                    c[r][0] += x * b0;
                    c[r][1] += x * b1;
                }
            }
            for (int r = 0; r < 4; r++) {
                memcpy(C + (i0 + r) * N + j, &c[r][0], 16);
                memcpy(C + (i0 + r) * N + j + 4, &c[r][1], 16);
            }
        }
        for (idx j = nb; j < N; j++)           /* the columns left */
            for (int r = 0; r < 4; r++) {
                float s = 0.0f;
                for (idx k = 0; k < K; k++) s += a0[r * K + k] * B[k * N + j];
                C[(i0 + r) * N + j] = s;
            }
    }
#elif defined(SP_VEC)
    /* 8 rows x 16 columns: 8 independent accumulators (AVX-512: one register each) */
    idx nb = N - N % 16;
    rows = M - M % 8;
    for (idx i0 = 0; i0 < rows; i0 += 8) {
        const float *a0 = A + i0 * K;
        for (idx j = 0; j < nb; j += 16) {
            sp_v16 c[8];
            const float *b = B + j;
            memset(c, 0, sizeof c);
            for (idx k = 0; k < K; k++, b += N) {
                sp_v16 bv;
                memcpy(&bv, b, 64);
                for (int r = 0; r < 8; r++) c[r] += a0[r * K + k] * bv;
            }
            for (int r = 0; r < 8; r++) memcpy(C + (i0 + r) * N + j, &c[r], 64);
        }
        for (idx j = nb; j < N; j++)           /* the columns left */
            for (int r = 0; r < 8; r++) {
                float s = 0.0f;
                for (idx k = 0; k < K; k++) s += a0[r * K + k] * B[k * N + j];
                C[(i0 + r) * N + j] = s;
            }
    }
#endif
#if defined(_OPENMP)
#pragma omp parallel for num_threads(SP_THREADS) if (SP_THREADS > 1 && M * K * N >= 32768)
#endif
    for (idx i = rows; i < M; i++) {
        float *c = C + i * N;
        for (idx j = 0; j < N; j++) c[j] = 0.0f;
        for (idx k = 0; k < K; k++) {
            float a = A[i * K + k];
            const float *b = B + k * N;
            for (idx j = 0; j < N; j++) c[j] += a * b[j];
        }
    }
}
"""

# conv2d of one image, per group: im2row (col: OH*OW rows of Cg*KH*KW) and the packed GEMM
# with the group's weight packed as W^T (Kg x OCg, `pack_conv_weight`); tmp holds the (OH*OW,
# OCg) product before it is written channel-major into y
KERNELS["conv2d"] = r"""
SP_KERNEL void k_conv2d(idx G, idx C, idx H, idx W, const float *x, idx OC, idx KH, idx KW,
                     const float *Wp, const float *bias, idx OH, idx OW,
                     idx sh, idx sw, idx ph, idx pw, idx dh, idx dw,
                     float *col, float *tmp, float *y, int act)
{
    idx Cg = C / G, OCg = OC / G, K = Cg * KH * KW, P = OH * OW;
    idx gstride = ((OCg + 15) / 16) * K * 16;
    for (idx g = 0; g < G; g++) {
        const float *xg = x + g * Cg * H * W;
        for (idx oh = 0; oh < OH; oh++)
            for (idx ow = 0; ow < OW; ow++) {
                float *row = col + (oh * OW + ow) * K;
                idx iw0 = ow * sw - pw;
                int inside = dw == 1 && iw0 >= 0 && iw0 + KW <= W;
                for (idx c = 0; c < Cg; c++)
                    for (idx kh = 0; kh < KH; kh++) {
                        idx ih = oh * sh - ph + kh * dh;
                        float *r = row + (c * KH + kh) * KW;
                        if (ih < 0 || ih >= H) {
                            for (idx kw = 0; kw < KW; kw++) r[kw] = 0.0f;
                            continue;
                        }
                        const float *src = xg + (c * H + ih) * W;
                        if (inside) {
                            for (idx kw = 0; kw < KW; kw++) r[kw] = src[iw0 + kw];
                            continue;
                        }
                        for (idx kw = 0; kw < KW; kw++) {
                            idx iw = iw0 + kw * dw;
                            r[kw] = (iw >= 0 && iw < W) ? src[iw] : 0.0f;
                        }
                    }
            }
        k_gemm_packed(P, OCg, K, col, K, Wp + g * gstride, bias ? bias + g * OCg : NULL, tmp,
                      OCg, 0);
        float *yg = y + g * OCg * P;
        for (idx o = 0; o < OCg; o++)
            for (idx p = 0; p < P; p++) {
                float v = tmp[p * OCg + o];
                yg[o * P + p] = SP_ACT(v);
            }
    }
}
"""

# C[M,N] = A[M,K] B[K,N] (+ bias[m]), both row-major, vectorised over N: the conv2d of a
# layer with few output channels (rows) and many pixels (columns), every lane useful
KERNELS["gemm_wcol"] = r"""
SP_KERNEL SP_FMA_FN void k_gemm_wcol(idx M, idx N, idx K, const float *A, const float *B,
                        const float *bias, float *C, int act)
{
    SP_FMA_BODY
#ifdef SP_VEC
    idx j = 0;
    sp_v16 zero = {0};
    for (; j + 16 <= N; j += 16) {
        idx i = 0;
        for (; i + 4 <= M; i += 4) {
            sp_v16 c0 = zero, c1 = zero, c2 = zero, c3 = zero;
            if (bias) { c0 += bias[i]; c1 += bias[i + 1]; c2 += bias[i + 2]; c3 += bias[i + 3]; }
            const float *a0 = A + i * K, *a1 = a0 + K, *a2 = a1 + K, *a3 = a2 + K;
            const float *bk = B + j;
            for (idx k = 0; k < K; k++, bk += N) {
                sp_v16 b;
                memcpy(&b, bk, 64);
                c0 += a0[k] * b; c1 += a1[k] * b; c2 += a2[k] * b; c3 += a3[k] * b;
            }
            if (act) { c0 = SP_RELU(c0); c1 = SP_RELU(c1); c2 = SP_RELU(c2); c3 = SP_RELU(c3); }
            memcpy(C + i * N + j, &c0, 64); memcpy(C + (i + 1) * N + j, &c1, 64);
            memcpy(C + (i + 2) * N + j, &c2, 64); memcpy(C + (i + 3) * N + j, &c3, 64);
        }
        for (; i < M; i++) {
            sp_v16 c0 = zero;
            if (bias) c0 += bias[i];
            const float *a0 = A + i * K, *bk = B + j;
            for (idx k = 0; k < K; k++, bk += N) {
                sp_v16 b;
                memcpy(&b, bk, 64);
                c0 += a0[k] * b;
            }
            if (act) c0 = SP_RELU(c0);
            memcpy(C + i * N + j, &c0, 64);
        }
    }
#endif
    for (idx i = 0; i < M; i++) {      /* the columns left (all of them without vectors) */
        const float *ai = A + i * K;
        float *ci = C + i * N;
#ifdef SP_VEC
        for (idx t = 0; t < 16 && j + t < N; t++) {
            idx jj = j + t;
#else
        for (idx jj = 0; jj < N; jj++) {
#endif
            float s = bias ? bias[i] : 0.0f;
            const float *bk = B + jj;
            for (idx k = 0; k < K; k++, bk += N) s += ai[k] * *bk;
            ci[jj] = SP_ACT(s);
        }
    }
}
"""

# conv2d of one image as im2col (col: Kg rows of OH*OW) and k_gemm_wcol per group, written
# channel-major straight into y (a weight used as it is: computed weights too)
KERNELS["conv2d_wcol"] = r"""
SP_KERNEL void k_conv2d_wcol(idx G, idx C, idx H, idx W, const float *x, idx OC, idx KH, idx KW,
                          const float *w, const float *bias, idx OH, idx OW,
                          idx sh, idx sw, idx ph, idx pw, idx dh, idx dw, float *col,
                          float *y, int act)
{
    idx Cg = C / G, OCg = OC / G, K = Cg * KH * KW, P = OH * OW;
    for (idx g = 0; g < G; g++) {
        const float *xg = x + g * Cg * H * W;
        for (idx c = 0; c < Cg; c++)
            for (idx kh = 0; kh < KH; kh++)
                for (idx kw = 0; kw < KW; kw++) {
                    float *r = col + ((c * KH + kh) * KW + kw) * P;
                    idx off = kw * dw - pw;
                    for (idx oh = 0; oh < OH; oh++) {
                        idx ih = oh * sh - ph + kh * dh;
                        float *ro = r + oh * OW;
                        if (ih < 0 || ih >= H) {
                            for (idx ow = 0; ow < OW; ow++) ro[ow] = 0.0f;
                            continue;
                        }
                        const float *src = xg + (c * H + ih) * W;
                        for (idx ow = 0; ow < OW; ow++) {
                            idx iw = ow * sw + off;
                            ro[ow] = (iw >= 0 && iw < W) ? src[iw] : 0.0f;
                        }
                    }
                }
        k_gemm_wcol(OCg, P, K, w + g * OCg * K, col, bias ? bias + g * OCg : NULL,
                    y + g * OCg * P, act);
    }
}
"""

# the pooling, row (softmax, layernorm) and layout kernels: rowkernels.py
KERNELS.update(ROW_KERNELS)
