"""Convolution primitives (NCHW); pooling lives in pool.py and shares the helpers.

conv2d lowers to im2col and one batched GEMM per call. The input gradient of conv2d *is*
conv_transpose2d (one op, one IR spelling, ONNX ConvTranspose; in conv_transpose.py, which
imports this module: the gradients here find it by name in the op table); its kernel runs
the GEMM and then accumulates the kh*kw column planes into the output (col2im). Here
(the numpy kernels) im2col is a strided window view made contiguous and col2im adds
strided slices, still far faster than a scatter (np.add.at); a batch whose columns would
be large runs in chunks of images (_CHUNK_ABOVE below). Where numba is, the ops run
`backends/numba/loops/conv.py`: both data movements as loops (5-20x faster on small
layers), and generated direct kernels (no im2col) for layers with few taps per output
and depthwise ones. Every gradient op that is linear in its inputs has a gradient rule
of its own, so second order works for conv and average pooling.

bfloat16/float16 compute in float32 and round the result (see linalg.py).
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, ShapeError, op_error
from ..tensor import Tensor, apply
from ._util import Sample, randf, rng, same_dtype
from .registry import NO_ONNX, Spec, defop, get_op

_LOOP_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


# ---------------------------------------------------------------------- helpers
def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _pair(v, op="conv2d", name="stride"):
    """An int or a pair of ints as a tuple of two ints."""
    if isinstance(v, (int, np.integer)):
        return (int(v), int(v))
    v = tuple(int(a) for a in v)
    if len(v) != 2:
        raise op_error(ShapeError, op, f"{name}={v}", "an int or a pair of ints")
    return v


def _spec(t):
    return Spec(tuple(t.shape), t.dtype)


def checked_apply(op, inputs, attrs):
    """apply() after the shape rule: kernels would accept some bad attributes silently."""
    op.shape_rule(*[_spec(t) for t in inputs], **attrs)
    return apply(op, inputs, attrs)


def _is_half(d):
    return d.itemsize == 2 and d.name in ("float16", "bfloat16")


def _f32_call(kernel, arrays, attrs):
    """kernel(*arrays, **attrs) in float32 when its float inputs are half precision, the
    result rounded back (a plain function: `sampan deploy` copies the kernels using it)."""
    d = arrays[0].dtype if _is_half(arrays[0].dtype) else arrays[-1].dtype
    if not _is_half(d):
        return kernel(*arrays, **attrs)
    up = [a.astype(np.float32) if _is_half(a.dtype) else a for a in arrays]
    return kernel(*up, **attrs).astype(d)


def _f32(kernel):
    """`kernel` run through `_f32_call`."""
    def k(*arrays, **attrs):
        return _f32_call(kernel, arrays, attrs)
    k.__name__ = kernel.__name__
    return k


def _out_dim(n, k, s, p, d):
    """Output length of a window sweep; strings (symbolic dims) give an expression."""
    if isinstance(n, str):
        return f"({n}+{2 * p - d * (k - 1) - 1})//{s}+1"
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _tout_dim(n, k, s, p, op, d):
    if isinstance(n, str):
        return f"({n}-1)*{s}+{d * (k - 1) + op + 1 - 2 * p}"
    return (n - 1) * s - 2 * p + d * (k - 1) + op + 1


def _numel(shape):
    n = 1
    for d in shape:
        n *= d if isinstance(d, int) else 1
    return n


def _pad(x, ph, pw, value=0):
    if not ph and not pw:
        return x
    n, c, h, w = x.shape
    out = np.full((n, c, h + 2 * ph, w + 2 * pw), value, x.dtype)
    out[:, :, ph:ph + h, pw:pw + w] = x
    return out


def _win(i, j, ho, wo, stride, dilation):
    """Index of the (i, j) kernel tap's input plane for every output position."""
    (sh, sw), (dh, dw) = stride, dilation
    return (slice(None), slice(None), slice(i * dh, i * dh + sh * (ho - 1) + 1, sh),
            slice(j * dw, j * dw + sw * (wo - 1) + 1, sw))


def _upsample(g, stride, hw):
    """g (N, O, h, w) spread over a zero (N, O, *hw) at every stride-th position."""
    up = np.zeros(g.shape[:2] + tuple(hw), g.dtype)
    up[:, :, ::stride[0], ::stride[1]] = g
    return up


# The columns of a whole batch of large images are large (a 3x3 layer on 64 channels of
# 56x56: 7.2 MB an image, 115 MB at batch 16). Past _CHUNK_ABOVE bytes of columns, the
# general path runs the batch in chunks of about _CHUNK_BYTES, which stay in cache: on
# that layer the forward went from 66 to 47-68 ms, the input gradient from 71 to 46-53 ms
# (alternating runs), with 8 MB of columns instead of 115. Smaller layers were no faster
# in chunks, so they keep one call.
_CHUNK_ABOVE = 64 << 20
_CHUNK_BYTES = 8 << 20
# ... and one image past _CHUNK_ABOVE runs in bands of output rows of about this many
# bytes of columns (see _conv2d_bands)
_BAND_BYTES = 2 << 20


def _chunk(n, per_sample):
    """Images per chunk of a general-path call with `per_sample` bytes of columns."""
    if n * per_sample <= _CHUNK_ABOVE:
        return n
    return max(1, _CHUNK_BYTES // max(per_sample, 1))


def _crop(buf, ph, pw, ho, wo):
    """The (ho, wo) output at offset (ph, pw) of a col2im buffer, contiguous."""
    if ph or pw or buf.shape[2:] != (ho, wo):
        return np.ascontiguousarray(buf[:, :, ph:ph + ho, pw:pw + wo])
    return buf


def _samples_last(a):
    """(N, O, H, W) as a contiguous (O, N*H*W): the one-GEMM layout of a gradient."""
    n, o, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, o, h * w).transpose(1, 0, 2)).reshape(o, n * h * w)


def _im2col_numpy(xp, kh, kw, ho, wo, stride, dilation):
    """Columns (N, C, kh, kw, Ho, Wo) of a padded input: a strided window view made
    contiguous."""
    (sh, sw), (dh, dw) = stride, dilation
    v = np.lib.stride_tricks.sliding_window_view(
        xp, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(2, 3))
    v = v[:, :, :sh * (ho - 1) + 1:sh, :sw * (wo - 1) + 1:sw, ::dh, ::dw]
    return np.ascontiguousarray(v.transpose(0, 1, 4, 5, 2, 3))


def _outpad(in_hw, k_hw, stride, padding, dilation):
    """output_padding that makes conv_transpose2d restore a conv2d input's size."""
    return tuple((n + 2 * p - d * (k - 1) - 1) % s
                 for n, k, s, p, d in zip(in_hw, k_hw, stride, padding, dilation))


def _check_float(op, *specs):
    d = same_dtype(op, *specs)
    if not _dt.is_floating(d):
        raise op_error(DTypeError, op, f"dtype {d}", "a floating dtype")
    return d


def _check_4d(op, what, s):
    if len(s.shape) != 4:
        raise op_error(ShapeError, op, f"{what} of shape {tuple(s.shape)}",
                       f"a 4-d {what} ({'N, C, H, W' if what == 'input' else 'O, I, kh, kw'})")


def _check_attrs(op, stride, padding, dilation, groups=1):
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or groups < 1:
        raise op_error(ShapeError, op, f"stride={stride}, padding={padding}, "
                       f"dilation={dilation}, groups={groups}",
                       "stride, dilation, groups >= 1 and padding >= 0")


def _check_out(op, x, out_hw, what="input"):
    if any(isinstance(d, int) and d < 1 for d in out_hw):
        raise op_error(ShapeError, op, f"{what} of shape {tuple(x.shape)}",
                       f"an {what} large enough for the kernel (output would be {out_hw})")


# ---------------------------------------------------------------------- conv2d
def _conv2d_rule(x, w, stride, padding, dilation, groups):
    op = "conv2d"
    d = _check_float(op, x, w)
    _check_4d(op, "input", x)
    _check_4d(op, "weight", w)
    _check_attrs(op, stride, padding, dilation, groups)
    o, cg, kh, kw = w.shape
    if x.shape[1] != cg * groups or o % groups:
        raise op_error(ShapeError, op, f"input {tuple(x.shape)}, weight {tuple(w.shape)}, "
                       f"groups={groups}", "input channels == weight.shape[1] * groups and "
                       "out channels divisible by groups")
    hw = tuple(_out_dim(n, k, s, p, dd) for n, k, s, p, dd in
               zip(x.shape[2:], (kh, kw), stride, padding, dilation))
    _check_out(op, x, hw)
    return Spec((x.shape[0], o) + hw, d)


def _conv2d_cols(x, w, stride, padding, dilation, groups, im2col):
    """conv2d as im2col (`im2col`: the numpy or the numba column copy) and one batched
    GEMM; a 1x1 unit-stride layer reads x as its columns; a batch with large columns
    runs in chunks of images (_CHUNK_ABOVE)."""
    n, _c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if kh == kw == 1 and tuple(stride) == (1, 1) and tuple(padding) == (0, 0):
        col = x.reshape(n, groups, cg, h * wd)
    else:
        per_sample = cg * groups * kh * kw * ho * wo * x.dtype.itemsize
        b = _chunk(n, per_sample)
        if b < n:
            y = np.empty((n, o, ho, wo), x.dtype)
            for b0 in range(0, n, b):
                y[b0:b0 + b] = _conv2d_cols(x[b0:b0 + b], w, stride, padding, dilation,
                                            groups, im2col)
            return y
        if n == 1 and per_sample > _CHUNK_ABOVE and ho > 1:
            return _conv2d_bands(x, w, stride, padding, dilation, groups, ho,
                                 max(1, _BAND_BYTES * ho // per_sample), im2col)
        col = im2col(_pad(x, *padding), kh, kw, ho, wo, stride, dilation)
        col = col.reshape(n, groups, cg * kh * kw, ho * wo)
    y = np.matmul(w.reshape(groups, o // groups, cg * kh * kw), col)   # (N, g, O/g, L)
    return y.reshape(n, o, ho, wo)


def _conv2d_bands(x, w, stride, padding, dilation, groups, ho, rows, im2col):
    """One image whose columns pass _CHUNK_ABOVE (PP-OCRv4's detector: 96 channels of
    160x160 under a 3x3 kernel, 88 MB) in bands of `rows` output rows, each band's columns
    (about _BAND_BYTES) staying in cache: 56 -> 40 ms on that layer at batch 1, measured
    under load. The input is padded once; each band convolves its rows unpadded."""
    (sh, _), (ph, pw), (dh, _) = stride, padding, dilation
    kh = w.shape[2]
    xp = _pad(x, ph, pw)
    y = None
    for r0 in range(0, ho, rows):
        r1 = min(ho, r0 + rows)
        band = xp[:, :, r0 * sh:(r1 - 1) * sh + dh * (kh - 1) + 1]
        yb = _conv2d_cols(band, w, stride, (0, 0), dilation, groups, im2col)
        if y is None:
            y = np.empty(yb.shape[:2] + (ho, yb.shape[3]), yb.dtype)
        y[:, :, r0:r1] = yb
    return y


def _conv2d_numpy(x, w, stride, padding, dilation, groups):
    return _conv2d_cols(x, w, stride, padding, dilation, groups, _im2col_numpy)


def _conv2d_np_kernel(x, w, stride, padding, dilation, groups):
    """conv2d's numpy kernel (half precision in float32)."""
    return _f32_call(_conv2d_numpy, (x, w), {"stride": stride, "padding": padding,
                                             "dilation": dilation, "groups": groups})


def _conv2d_grad(g, y, x, w, stride, padding, dilation, groups):
    attrs = _attrs(stride, padding, dilation, groups)
    gx = gw = None
    if x.requires_grad:
        op = _outpad(x.shape[2:], w.shape[2:], stride, padding, dilation)
        gx = apply(get_op("conv_transpose2d"), (g, w), {**attrs, "output_padding": op})
    if w.requires_grad:
        gw = apply(CONV2D_GRAD_WEIGHT, (x, g), {**attrs, "kernel_size": tuple(w.shape[2:])})
    return gx, gw


def _conv2d_flops(x, w, stride, padding, dilation, groups):
    y = _conv2d_rule(x, w, stride, padding, dilation, groups)
    return 2 * _numel(y.shape) * _numel(w.shape[1:])


def _attrs(stride, padding, dilation, groups):
    return {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}


def _cattrs(stride=1, padding=0, dilation=1, groups=1):
    return _attrs(_pair(stride), _pair(padding), _pair(dilation), groups)


def _conv2d_samples():
    r = rng(60)
    return [Sample((randf(r, 2, 3, 7, 6), randf(r, 4, 3, 3, 3)), _cattrs()),
            Sample((randf(r, 2, 3, 7, 8), randf(r, 5, 3, 3, 2)), _cattrs((2, 1), (1, 2))),
            Sample((randf(r, 1, 2, 9, 9), randf(r, 3, 2, 3, 3)), _cattrs(2, 2, 2)),
            Sample((randf(r, 2, 4, 6, 5), randf(r, 6, 2, 2, 3)), _cattrs(1, (1, 0), 1, 2)),
            Sample((randf(r, 1, 4, 5, 5), randf(r, 4, 1, 3, 3)), _cattrs(1, 1, 1, 4)),
            Sample((randf(r, 2, 3, 4, 4), randf(r, 2, 3, 1, 1)), _cattrs()),
            Sample((randf(r, 0, 3, 5, 5), randf(r, 2, 3, 3, 3)), _cattrs(1, 1)),
            Sample((randf(r, 1, 2, 4, 4), randf(r, 2, 2, 2, 2)), _cattrs(2, 1))]  # 2nd order


CONV2D = defop("conv2d", _conv2d_rule, kernel=_conv2d_np_kernel, grad=_conv2d_grad,
               flops=_conv2d_flops, onnx="Conv", samples=_conv2d_samples, amp="lower", gemm=True)


# ---------------------------------------------------------------------- conv2d weight grad
def _gw_rule(x, g, kernel_size, stride, padding, dilation, groups):
    op = "conv2d_grad_weight"
    d = _check_float(op, x, g)
    _check_4d(op, "input", x)
    _check_4d(op, "input", g)
    kh, kw = kernel_size
    hw = tuple(_out_dim(n, k, s, p, dd) for n, k, s, p, dd in
               zip(x.shape[2:], kernel_size, stride, padding, dilation))
    if tuple(g.shape[2:]) != hw or g.shape[0] != x.shape[0] or x.shape[1] % groups \
            or g.shape[1] % groups:
        raise op_error(ShapeError, op, f"input {tuple(x.shape)} and output grad "
                       f"{tuple(g.shape)}", f"an output grad of shape (N, O, {hw[0]}, {hw[1]})")
    return Spec((g.shape[1], x.shape[1] // groups, kh, kw), d)


def _gw_cols(x, g, kernel_size, stride, padding, dilation, groups, im2col):
    """conv2d's weight gradient from columns (`im2col`: the numpy or the numba copy): one
    GEMM per sample then a sum over N; large batches in chunks of images."""
    n, c, h, wd = x.shape
    o, ho, wo = g.shape[1], g.shape[2], g.shape[3]
    kh, kw = kernel_size
    k = c // groups * kh * kw
    b = _chunk(n, c * kh * kw * ho * wo * x.dtype.itemsize)
    if b < n:
        gw = _gw_cols(x[:b], g[:b], kernel_size, stride, padding, dilation, groups, im2col)
        for b0 in range(b, n, b):
            gw += _gw_cols(x[b0:b0 + b], g[b0:b0 + b], kernel_size, stride, padding,
                           dilation, groups, im2col)
        return gw
    col = im2col(_pad(x, *padding), kh, kw, ho, wo, stride, dilation)
    col = col.reshape(n, groups, k, ho * wo)
    gm = g.reshape(n, groups, o // groups, ho * wo)
    # one GEMM per sample then a sum over N: OpenBLAS runs the single (O, N*L) @ (N*L, K)
    # GEMM (tensordot) up to 20x slower on these short-and-wide shapes
    gw = np.matmul(gm, col.transpose(0, 1, 3, 2)).sum(0)
    return gw.reshape(o, c // groups, kh, kw)


def _gw_kernel(x, g, kernel_size, stride, padding, dilation, groups):
    return _gw_cols(x, g, kernel_size, stride, padding, dilation, groups, _im2col_numpy)


def _gw_grad(gw, y, x, g, kernel_size, stride, padding, dilation, groups):
    attrs = _attrs(stride, padding, dilation, groups)
    gx = gg = None
    if x.requires_grad:
        op = _outpad(x.shape[2:], kernel_size, stride, padding, dilation)
        gx = apply(get_op("conv_transpose2d"), (g, gw), dict(attrs, output_padding=op))
    if g.requires_grad:
        gg = apply(CONV2D, (x, gw), attrs)
    return gx, gg


def _gw_flops(x, g, kernel_size, stride, padding, dilation, groups):
    return 2 * _numel(g.shape) * (x.shape[1] // groups) * kernel_size[0] * kernel_size[1]


def _gw_samples():
    out = []
    for s in _conv2d_samples():
        x, w = s.args
        y = _conv2d_numpy(x, w, **s.attrs)
        g = randf(rng(62), *y.shape)
        out.append(Sample((x, g), dict(s.attrs, kernel_size=tuple(w.shape[2:]))))
    return out


CONV2D_GRAD_WEIGHT = defop("conv2d_grad_weight", _gw_rule, kernel=_f32(_gw_kernel),
                           grad=_gw_grad, flops=_gw_flops, onnx=NO_ONNX, samples=_gw_samples,
                           gemm=True)


# ---------------------------------------------------------------------- frontends
def _bias(y, b, ndim, op):
    """y + b per channel; b is an input of `op` in PyTorch, so under autocast it is cast
    as op's own inputs are (its "lower" policy) and y keeps the autocast dtype."""
    if b is None:
        return y
    from .elementwise import add
    from .modes import as_inputs_of
    from .shape import reshape
    (b,) = as_inputs_of(op, _t(b))
    return add(y, reshape(b, (1, -1) + (1,) * (ndim - 2)))


def _same_padding(x, w, dilation):
    """padding='same' (stride 1): symmetric when possible, else pad the input first."""
    from .shape import pad
    total = [d * (k - 1) for k, d in zip(w.shape[2:], dilation)]
    if all(t % 2 == 0 for t in total):
        return x, tuple(t // 2 for t in total)
    pads = ((0, 0), (0, 0)) + tuple((t // 2, t - t // 2) for t in total)
    return pad(x, pads), (0, 0)


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """2-d convolution (cross-correlation) over NCHW input; weight (out, in/groups, kh, kw).

    Example::

        >>> y = sampan.conv2d(sampan.randn(8, 3, 32, 32), sampan.randn(16, 3, 3, 3), padding=1)
        >>> y.shape
        (8, 16, 32, 32)
    """
    from .elementwise import operands
    x, w = operands(_t(x), _t(w))
    dilation = _pair(dilation, "conv2d", "dilation")
    if isinstance(padding, str):
        if padding not in ("same", "valid") or (padding == "same" and _pair(stride) != (1, 1)):
            raise op_error(ShapeError, "conv2d", f"padding={padding!r}, stride={stride}",
                           "'valid', or 'same' with stride 1, or ints")
        x, padding = _same_padding(x, w, dilation) if padding == "same" else (x, (0, 0))
    attrs = _attrs(_pair(stride), _pair(padding, "conv2d", "padding"), dilation, int(groups))
    y = checked_apply(CONV2D, (x, w), attrs)
    return _bias(y, b, 4, CONV2D)


def conv1d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """1-d convolution over (N, C, L) input; weight (out, in/groups, k).

    Example::

        >>> sampan.conv1d(sampan.randn(2, 4, 10), sampan.randn(6, 4, 3)).shape
        (2, 6, 8)
    """
    from .shape import unsqueeze
    x, w = _t(x), _t(w)
    if x.ndim != 3 or w.ndim != 3:
        raise op_error(ShapeError, "conv1d", f"input {tuple(x.shape)}, weight {tuple(w.shape)}",
                       "input (N, C, L) and weight (O, C/groups, k)")
    if not isinstance(padding, str):
        padding = (0, int(padding if isinstance(padding, int) else padding[0]))

    def one(v):
        return (1, int(v if isinstance(v, int) else v[0]))
    y = conv2d(unsqueeze(x, 2), unsqueeze(w, 2), None, one(stride), padding, one(dilation),
               groups)
    from .shape import squeeze
    return _bias(squeeze(y, 2), b, 3, CONV2D)

