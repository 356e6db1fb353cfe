"""The C target's pooling, row (softmax, layernorm) and layout (gather, concat) kernels:
C99 text of the generator's own, merged into `templates.KERNELS` by name (see templates.py
for SP_KERNEL and the vector types)."""
from __future__ import annotations

ROW_KERNELS = {}

ROW_KERNELS["maxpool2d"] = r"""
SP_KERNEL void k_maxpool2d(idx NC, idx H, idx W, const float *x, idx OH, idx OW, idx KH, idx KW,
                        idx sh, idx sw, idx ph, idx pw, idx dh, idx dw, float *y)
{
    for (idx n = 0; n < NC; n++) {
        const float *xs = x + n * H * W;
        for (idx oh = 0; oh < OH; oh++)
            for (idx ow = 0; ow < OW; ow++) {
                float m = -INFINITY;
                for (idx i = 0; i < KH; i++) {
                    idx ih = oh * sh - ph + i * dh;
                    if (ih < 0 || ih >= H) continue;
                    for (idx j = 0; j < KW; j++) {
                        idx iw = ow * sw - pw + j * dw;
                        if (iw < 0 || iw >= W) continue;
                        float v = xs[ih * W + iw];
                        if (v > m || v != v) m = v;
                    }
                }
                y[(n * OH + oh) * OW + ow] = m;
            }
    }
}
"""

# avg_pool2d as PyTorch counts: the window clipped to the padded input (count_include_pad)
# or to the input; divisor_override > 0 replaces the count
ROW_KERNELS["avgpool2d"] = r"""
SP_KERNEL void k_avgpool2d(idx NC, idx H, idx W, const float *x, idx OH, idx OW, idx KH, idx KW,
                        idx sh, idx sw, idx ph, idx pw, int include_pad, idx divisor, float *y)
{
    for (idx n = 0; n < NC; n++) {
        const float *xs = x + n * H * W;
        for (idx oh = 0; oh < OH; oh++)
            for (idx ow = 0; ow < OW; ow++) {
                idx h0 = oh * sh - ph, w0 = ow * sw - pw;
                idx h1 = h0 + KH < H + ph ? h0 + KH : H + ph;
                idx w1 = w0 + KW < W + pw ? w0 + KW : W + pw;
                idx cnt = (h1 - h0) * (w1 - w0);
                idx a0 = h0 < 0 ? 0 : h0, b0 = w0 < 0 ? 0 : w0;
                idx a1 = h1 > H ? H : h1, b1 = w1 > W ? W : w1;
                float s = 0.0f;
                for (idx i = a0; i < a1; i++)
                    for (idx j = b0; j < b1; j++) s += xs[i * W + j];
                if (!include_pad) cnt = (a1 - a0) * (b1 - b0);
                if (divisor > 0) cnt = divisor;
                y[(n * OH + oh) * OW + ow] = s / (float)cnt;
            }
    }
}
"""

# softmax / log_softmax per row: the max and the sum in 8 lanes each (vectorised, sums
# in float: 8 partial sums of at most n/8 terms in [0, 1]), e^x by sp_expf into y first
# (the memory plan never lets y share x's bytes: log_softmax reads x again after)
ROW_KERNELS["softmax"] = r"""
SP_KERNEL void k_softmax_rows(idx rows, idx n, const float *x, float *y, int log_)
{
    for (idx r = 0; r < rows; r++) {
        const float *a = x + r * n;
        float *o = y + r * n;
        float mx[8], sm[8];
        idx j, n8 = n - n % 8;
        for (int l = 0; l < 8; l++) { mx[l] = -INFINITY; sm[l] = 0.0f; }
        for (j = 0; j < n8; j += 8)
            for (int l = 0; l < 8; l++) mx[l] = sp_maxf(mx[l], a[j + l]);
        float m = -INFINITY;
        for (j = n8; j < n; j++) m = sp_maxf(m, a[j]);
        for (int l = 0; l < 8; l++) m = sp_maxf(m, mx[l]);
        for (j = 0; j < n; j++) o[j] = sp_expf(a[j] - m);    /* a loop alone: vectorised */
        for (j = 0; j < n8; j += 8)
            for (int l = 0; l < 8; l++) sm[l] += o[j + l];
        double s = 0.0;
        for (j = n8; j < n; j++) s += o[j];
        for (int l = 0; l < 8; l++) s += sm[l];
        if (log_) {
            float lg = (float)log(s);
            for (j = 0; j < n; j++) o[j] = (a[j] - m) - lg;
        } else {
            float inv = (float)(1.0 / s);
            for (j = 0; j < n; j++) o[j] *= inv;
        }
    }
}
"""

# (x - mean) / sqrt(var + eps) per row, times w plus b (w, b NULL: no affine); the sums
# in 8 float lanes (vectorised), combined in double, the variance from the centred values
ROW_KERNELS["layernorm"] = r"""
SP_KERNEL void k_layernorm_rows(idx rows, idx n, const float *x, const float *w, const float *b,
                                float eps, float *y)
{
    idx n8 = n - n % 8;
    for (idx r = 0; r < rows; r++) {
        const float *a = x + r * n;
        float *o = y + r * n;
        float ls[8] = {0}, lq[8] = {0};
        double s = 0.0, q = 0.0;
        idx j;
        for (j = 0; j < n8; j += 8)
            for (int l = 0; l < 8; l++) ls[l] += a[j + l];
        for (j = n8; j < n; j++) s += a[j];
        for (int l = 0; l < 8; l++) s += ls[l];
        float mean = (float)(s / (double)n);
        for (j = 0; j < n8; j += 8)
            for (int l = 0; l < 8; l++) { float d = a[j + l] - mean; lq[l] += d * d; }
        for (j = n8; j < n; j++) { double d = a[j] - mean; q += d * d; }
        for (int l = 0; l < 8; l++) q += lq[l];
        float rs = 1.0f / sqrtf((float)(q / (double)n) + eps);
        if (w)
            for (j = 0; j < n; j++) o[j] = (a[j] - mean) * rs * w[j] + b[j];
        else
            for (j = 0; j < n; j++) o[j] = (a[j] - mean) * rs;
    }
}
"""

# y[o, t, i] = x[o, idx[t], i]; an index outside [-A, A) fails the call
ROW_KERNELS["gather"] = r"""
SP_KERNEL int k_gather(idx outer, idx A, idx inner, size_t esize, const unsigned char *x,
                    idx nidx, const int64_t *ix, unsigned char *y)
{
    for (idx t = 0; t < nidx; t++)
        if (ix[t] < -A || ix[t] >= A) return 1;
    for (idx o = 0; o < outer; o++)
        for (idx t = 0; t < nidx; t++) {
            idx j = (idx)ix[t] < 0 ? (idx)ix[t] + A : (idx)ix[t];
            memcpy(y + (o * nidx + t) * inner * esize, x + (o * A + j) * inner * esize,
                   (size_t)inner * esize);
        }
    return 0;
}
"""

# y = concatenation along an axis: `chunk` bytes of each input per outer index
ROW_KERNELS["concat"] = r"""
SP_KERNEL void k_concat_part(idx outer, size_t chunk, size_t total, size_t at,
                          const unsigned char *x, unsigned char *y)
{
    for (idx o = 0; o < outer; o++) memcpy(y + o * total + at, x + o * chunk, chunk);
}
"""
