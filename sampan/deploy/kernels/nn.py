"""Convolution, pooling and row (softmax, layer-norm) kernels (numpy only).

Each mirrors the numpy path (without numba) of the op's kernel in `sampan/ops/conv.py`,
`pool.py` and `rowwise.py`: im2col as a strided window view made contiguous and one
batched GEMM, pooling as a loop over the kernel taps, rows as numpy reductions. Half
precision computes in float32 and rounds the result, as there."""
import numpy as np

_HALF = (np.dtype(np.float16),)
_CHUNK_ABOVE = 64 << 20
_CHUNK_BYTES = 8 << 20


def _up(arrays):
    return [a.astype(np.float32) if a.dtype in _HALF else a for a in arrays]


def _pad(x, ph, pw, value=0):
    if not ph and not pw:
        return x
    n, c, h, w = x.shape
    out = np.full((n, c, h + 2 * ph, w + 2 * pw), value, x.dtype)
    out[:, :, ph:ph + h, pw:pw + w] = x
    return out


def _win(i, j, ho, wo, stride, dilation):
    (sh, sw), (dh, dw) = stride, dilation
    return (slice(None), slice(None), slice(i * dh, i * dh + sh * (ho - 1) + 1, sh),
            slice(j * dw, j * dw + sw * (wo - 1) + 1, sw))


def _im2col(xp, kh, kw, ho, wo, stride, dilation):
    (sh, sw), (dh, dw) = stride, dilation
    v = np.lib.stride_tricks.sliding_window_view(
        xp, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(2, 3))
    v = v[:, :, :sh * (ho - 1) + 1:sh, :sw * (wo - 1) + 1:sw, ::dh, ::dw]
    return np.ascontiguousarray(v.transpose(0, 1, 4, 5, 2, 3))


def _conv2d(x, w, stride, padding, dilation, groups):
    n, _c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if kh == kw == 1 and tuple(stride) == (1, 1) and tuple(padding) == (0, 0):
        col = x.reshape(n, groups, cg, h * wd)
    else:
        per = cg * groups * kh * kw * ho * wo * x.dtype.itemsize
        b = n if n * per <= _CHUNK_ABOVE else max(1, _CHUNK_BYTES // max(per, 1))
        if b < n:
            y = np.empty((n, o, ho, wo), x.dtype)
            for b0 in range(0, n, b):
                y[b0:b0 + b] = _conv2d(x[b0:b0 + b], w, stride, padding, dilation, groups)
            return y
        col = _im2col(_pad(x, *padding), kh, kw, ho, wo, stride, dilation)
        col = col.reshape(n, groups, cg * kh * kw, ho * wo)
    y = np.matmul(w.reshape(groups, o // groups, cg * kh * kw), col)
    return y.reshape(n, o, ho, wo)


def k_conv2d(x, w, stride, padding, dilation, groups):
    d = x.dtype if x.dtype in _HALF else w.dtype
    if d not in _HALF:
        return _conv2d(x, w, stride, padding, dilation, groups)
    return _conv2d(*_up((x, w)), stride, padding, dilation, groups).astype(d)


def _out_len(n, k, s, p, d, ceil_mode):
    if not ceil_mode:
        return (n + 2 * p - d * (k - 1) - 1) // s + 1
    o = -(-(n + 2 * p - d * (k - 1) - 1) // s) + 1
    return o - 1 if (o - 1) * s >= n + p else o


def _hw(x, kernel_size, stride, padding, dilation, ceil_mode):
    return tuple(_out_len(n, k, s, p, d, ceil_mode) for n, k, s, p, d in
                 zip(x.shape[2:], kernel_size, stride, padding, dilation))


def _padw(x, padding, hw, kernel_size, stride, dilation, value):
    n, c, h, w = x.shape
    ph, pw = padding
    lh, lw = (max(m + 2 * p, (o - 1) * s + d * (k - 1) + 1) for m, p, o, k, s, d in
              zip((h, w), padding, hw, kernel_size, stride, dilation))
    if (lh, lw) == (h + 2 * ph, w + 2 * pw):
        return _pad(x, ph, pw, value)
    out = np.full((n, c, lh, lw), value, x.dtype)
    out[:, :, ph:ph + h, pw:pw + w] = x
    return out


def _max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode=False):
    ho, wo = _hw(x, kernel_size, stride, padding, dilation, ceil_mode)
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = _padw(x, padding, (ho, wo), kernel_size, stride, dilation, low)
    out = None
    for t in range(kernel_size[0] * kernel_size[1]):
        s = xp[_win(t // kernel_size[1], t % kernel_size[1], ho, wo, stride, dilation)]
        out = s.copy() if out is None else np.maximum(out, s, out=out)
    return out


def k_max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode=False):
    if x.dtype not in _HALF:
        return _max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode)
    return _max_pool2d(*_up((x,)), kernel_size, stride, padding, dilation,
                       ceil_mode).astype(x.dtype)


def _divisor(h, w, ho, wo, kernel_size, stride, padding, count_include_pad, dtype,
             divisor_override=0):
    if divisor_override:
        return dtype.type(divisor_override)

    def counts(n, no, k, s, p):
        start = np.arange(no) * s - p
        end = np.minimum(start + k, n + p)
        if count_include_pad:
            return end - start
        return np.minimum(end, n) - np.maximum(start, 0)
    return np.outer(counts(h, ho, kernel_size[0], stride[0], padding[0]),
                    counts(w, wo, kernel_size[1], stride[1], padding[1])).astype(dtype)


def _avg_pool2d(x, kernel_size, stride, padding, count_include_pad, ceil_mode=False,
                divisor_override=0):
    ho, wo = _hw(x, kernel_size, stride, padding, (1, 1), ceil_mode)
    xp = _padw(x, padding, (ho, wo), kernel_size, stride, (1, 1), 0)
    out = None
    for t in range(kernel_size[0] * kernel_size[1]):
        s = xp[_win(t // kernel_size[1], t % kernel_size[1], ho, wo, stride, (1, 1))]
        out = s.copy() if out is None else np.add(out, s, out=out)
    out /= _divisor(x.shape[2], x.shape[3], ho, wo, kernel_size, stride, padding,
                    count_include_pad, out.dtype, divisor_override)
    return out


def k_avg_pool2d(x, kernel_size, stride, padding, count_include_pad, ceil_mode=False,
                 divisor_override=0):
    a = (kernel_size, stride, padding, count_include_pad, ceil_mode, divisor_override)
    if x.dtype not in _HALF:
        return _avg_pool2d(x, *a)
    return _avg_pool2d(*_up((x,)), *a).astype(x.dtype)


def _half_rows(f, arrays, *attrs):
    d = arrays[0].dtype
    if d.kind != "f" or d.itemsize < 4:
        return f(*(a.astype(np.float32) for a in arrays), *attrs).astype(d)
    return f(*arrays, *attrs)


def _softmax(x, log):
    if not x.size:
        return np.empty(x.shape, x.dtype)
    m = np.max(x, axis=-1, keepdims=True)
    z = x - m
    if log:
        return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))
    e = np.exp(z)
    return e / np.sum(e, axis=-1, keepdims=True)


def k_softmax(x):
    return _half_rows(_softmax, (x,), False)


def k_log_softmax(x):
    return _half_rows(_softmax, (x,), True)


def _standardize(x, eps):
    if not x.size:
        return np.empty(x.shape, x.dtype)
    d = x - x.mean(-1, keepdims=True)
    r = 1 / np.sqrt((d * d).mean(-1, keepdims=True) + x.dtype.type(eps))
    return d * r


def _layer_norm(x, w, b, eps):
    return _standardize(x, eps) * w + b


def k_standardize(x, eps):
    return _half_rows(_standardize, (x,), eps)


def k_layer_norm_affine(x, w, b, eps):
    return _half_rows(_layer_norm, (x, w, b), eps)
