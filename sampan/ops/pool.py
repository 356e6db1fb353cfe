"""Pooling primitives (NCHW): max_pool2d, avg_pool2d and their gradients;
adaptive_avg_pool2d is a function over them.

Every kernel is a loop over the kh*kw kernel taps, each one a strided slice of the
(padded) input: kh*kw vectorised passes, no scatter. max_pool2d's gradient routes `g`
to the first maximum of each window (PyTorch's choice); that gradient is linear in `g`
and its own gradient is `max_pool2d_gather` (pick the value at each window's maximum),
whose gradient is `max_pool2d_grad` again, so second order works. avg_pool2d and
avg_pool2d_grad are each other's adjoints.

PyTorch's ceil_mode (a last partial window, kept unless it would start in the right
padding) pads the planes on the right up to that window's end; avg_pool2d's divisor is
PyTorch's per-window count (or divisor_override). Both attributes are written only when
set. The indices of max pooling and unpooling live in pool_index.py.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, ShapeError, op_error
from ..tensor import apply
from ._nb import HAVE_NUMBA, njit
from ._util import Sample, randf, rng
from .conv import (_check_4d, _check_attrs, _check_out, _f32, _numel, _out_dim, _pad, _pair,
                   _t, _win, checked_apply)
from .registry import NO_ONNX, Spec, defop


def _out_len(n, k, s, p, d, ceil_mode):
    """PyTorch's pooled length: with ceil_mode a last partial window is kept, unless it
    would start past the input (in the right padding)."""
    if not ceil_mode:
        return _out_dim(n, k, s, p, d)
    if isinstance(n, str):
        raise op_error(ShapeError, "pool", f"symbolic size {n} with ceil_mode=True",
                       "static spatial sizes with ceil_mode")
    o = -(-(n + 2 * p - d * (k - 1) - 1) // s) + 1
    return o - 1 if (o - 1) * s >= n + p else o


def _pool_hw(op, x, kernel_size, stride, padding, dilation=(1, 1), ceil_mode=False):
    _check_4d(op, "input", x)
    _check_attrs(op, stride, padding, dilation)
    if min(kernel_size) < 1 or any(2 * p > k for p, k in zip(padding, kernel_size)):
        raise op_error(ShapeError, op, f"kernel_size={kernel_size}, padding={padding}",
                       "kernel_size >= 1 and padding at most half the kernel size")
    hw = tuple(_out_len(n, k, s, p, d, ceil_mode) for n, k, s, p, d in
               zip(x.shape[2:], kernel_size, stride, padding, dilation))
    _check_out(op, x, hw)
    return hw


def _padded_hw(in_hw, padding, hw, kernel_size, stride, dilation):
    """Size of the padded planes: the input plus padding, or up to the end of ceil_mode's
    last window where that reaches further."""
    return tuple(max(n + 2 * p, (o - 1) * s + d * (k - 1) + 1) for n, p, o, k, s, d in
                 zip(in_hw, padding, hw, kernel_size, stride, dilation))


def _padw(x, padding, hw, kernel_size, stride, dilation, value):
    """x padded by `padding` on both sides and, where ceil_mode's last window reaches
    further, on the right up to that window's end (with `value`)."""
    n, c, h, w = x.shape
    ph, pw = padding
    lh, lw = _padded_hw((h, w), padding, hw, kernel_size, stride, dilation)
    if (lh, lw) == (h + 2 * ph, w + 2 * pw):
        return _pad(x, ph, pw, value)
    out = np.full((n, c, lh, lw), value, x.dtype)
    out[:, :, ph:ph + h, pw:pw + w] = x
    return out


def _taps(kernel_size):
    kh, kw = kernel_size
    return [(t, t // kw, t % kw) for t in range(kh * kw)]


def _pool_flops(x, kernel_size, stride, padding, **_):
    hw = _pool_hw("pool", x, kernel_size, stride, padding, _.get("dilation", (1, 1)),
                  _.get("ceil_mode", False))
    return _numel(tuple(x.shape[:2]) + hw) * kernel_size[0] * kernel_size[1]


def _grad_flops(x, g, kernel_size, **_):
    return _numel(g.shape) * kernel_size[0] * kernel_size[1]


# ---------------------------------------------------------------------- max_pool2d
def _lowest(d):
    return -np.inf if d.kind == "f" else np.iinfo(d).min


def _max_rule(x, kernel_size, stride, padding, dilation, ceil_mode=False):
    if x.dtype == np.bool_ or not (_dt.is_floating(x.dtype) or _dt.is_integer(x.dtype)):
        raise op_error(DTypeError, "max_pool2d", f"dtype {x.dtype}", "a numeric dtype")
    hw = _pool_hw("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode)
    return Spec(tuple(x.shape[:2]) + hw, x.dtype)


def _hw(x, kernel_size, stride, padding, dilation=(1, 1), ceil_mode=False):
    return tuple(_out_len(n, k, s, p, d, ceil_mode) for n, k, s, p, d in
                 zip(x.shape[2:], kernel_size, stride, padding, dilation))


def _max_kernel(x, kernel_size, stride, padding, dilation, ceil_mode=False):
    ho, wo = _hw(x, kernel_size, stride, padding, dilation, ceil_mode)
    if _is_2x2(x, kernel_size, stride, padding, dilation, ceil_mode):
        out = np.empty(x.shape[:2] + (ho, wo), x.dtype)
        _max_2x2(np.ascontiguousarray(x), out)
        return out
    xp = _padw(x, padding, (ho, wo), kernel_size, stride, dilation, _lowest(x.dtype))
    out = None
    for _k, i, j in _taps(kernel_size):
        s = xp[_win(i, j, ho, wo, stride, dilation)]
        out = s.copy() if out is None else np.maximum(out, s, out=out)
    return out


def _argmax(x, kernel_size, stride, padding, dilation, ceil_mode=False):
    """Tap index (0..kh*kw-1) of each window's first maximum (a NaN counts as maximum)."""
    ho, wo = _hw(x, kernel_size, stride, padding, dilation, ceil_mode)
    xp = _padw(x, padding, (ho, wo), kernel_size, stride, dilation, _lowest(x.dtype))
    best = arg = None
    for t, i, j in _taps(kernel_size):
        s = xp[_win(i, j, ho, wo, stride, dilation)]
        if best is None:
            best, arg = s.copy(), np.zeros(s.shape, np.int32)
            continue
        m = s > best
        if x.dtype.kind == "f":
            m |= np.isnan(s)
        np.copyto(best, s, where=m)
        np.copyto(arg, t, where=m)
    return arg, ho, wo


if HAVE_NUMBA:
    @njit(cache=True, nogil=True)
    def _max_grad_loop(xp, g, kh, kw, sh, sw, dh, dw, buf):
        # same choice as _argmax: taps in row-major order, the first maximum wins, a NaN
        # replaces the current best
        n, c, ho, wo = g.shape
        for a in range(n):
            for b in range(c):
                for i in range(ho):
                    for j in range(wo):
                        bi = i * sh
                        bj = j * sw
                        best = xp[a, b, bi, bj]
                        for ti in range(kh):
                            for tj in range(kw):
                                r = i * sh + ti * dh
                                q = j * sw + tj * dw
                                v = xp[a, b, r, q]
                                if v > best or v != v:
                                    best = v
                                    bi = r
                                    bj = q
                        buf[a, b, bi, bj] += g[a, b, i, j]


# 2x2 windows at stride 2 without padding (the common pooling) in two loops. Indices are
# unsigned flat offsets: numba adds a negative-index check to signed index arithmetic,
# which kept the loops scalar. Forward: NaN-propagating selects, vectorised (W2's layers
# 0.34 -> 0.13 ms and 0.25 -> 0.07 ms). Gradient: the winning tap's offset computed
# arithmetically and one store per window into zeroed rows. Selects there made
# branches in the scalar tail of each short row (14 and 5 windows in LeNet), which
# mispredict on real data: 1.24 -> 0.35 ms and 0.44 -> 0.13 ms. The gradient loop
# reports whether a window held a NaN (or +inf and -inf), and the caller then uses the
# general loop, whose choice of tap it matches everywhere else (first maximum in
# row-major order).
if HAVE_NUMBA:
    _U = np.uint64

    @njit(inline="always", cache=True)
    def _window(xf, r0, r1, q):
        """The 2x2 window at column q of rows starting at flat offsets r0 and r1."""
        return xf[r0 + q], xf[r0 + q + _U(1)], xf[r1 + q], xf[r1 + q + _U(1)]

    @njit(cache=True, nogil=True, error_model="numpy")
    def _max_2x2(x, out):
        n, c, ho, wo = out.shape
        h, w = _U(x.shape[2]), _U(x.shape[3])
        ho, wo = _U(ho), _U(wo)
        xf = x.ravel()
        of = out.ravel()
        two = _U(2)
        for p in range(_U(n * c)):
            for i in range(ho):
                r0 = p * h * w + two * i * w
                r1 = r0 + w
                orow = (p * ho + i) * wo
                for j in range(wo):
                    q = two * j
                    v0, v1, v2, v3 = _window(xf, r0, r1, q)
                    a = v1 if (v1 > v0) | (v1 != v1) else v0
                    b = v3 if (v3 > v2) | (v3 != v3) else v2
                    of[orow + j] = b if (b > a) | (b != b) else a

    @njit(cache=True, nogil=True, error_model="numpy")
    def _max_grad_2x2(x, g, zero, out):
        n, c, ho, wo = g.shape
        h, w = _U(x.shape[2]), _U(x.shape[3])
        ho, wo = _U(ho), _U(wo)
        xf = x.ravel()
        gf = g.ravel()
        of = out.ravel()
        two = _U(2)
        odd = False
        for p in range(_U(n * c)):
            for i in range(ho):
                r0 = p * h * w + two * i * w
                r1 = r0 + w
                grow = (p * ho + i) * wo
                for j in range(two * wo):
                    of[r0 + j] = zero
                    of[r1 + j] = zero
                for j in range(wo):
                    q = two * j
                    v0, v1, v2, v3 = _window(xf, r0, r1, q)
                    t = v0 + v1 + v2 + v3
                    odd |= t != t
                    c1 = _U(v1 > v0)
                    c3 = _U(v3 > v2)
                    cb = _U(max(v2, v3) > max(v0, v1))
                    of[r0 + q + c1 + cb * (w + c3 - c1)] = gf[grow + j]
        return odd


def _is_2x2(x, kernel_size, stride, padding, dilation, ceil_mode=False):
    # uint8 / int8: the int8 chain's max-pool (issue 31), on the same loop
    return (HAVE_NUMBA and x.dtype in (np.float32, np.float64, np.uint8, np.int8)
            and tuple(kernel_size) == (2, 2) and tuple(stride) == (2, 2)
            and tuple(padding) == (0, 0) and tuple(dilation) == (1, 1)
            and not (ceil_mode and (x.shape[2] % 2 or x.shape[3] % 2)))


def _max_grad_kernel(x, g, kernel_size, stride, padding, dilation, ceil_mode=False):
    n, c, h, w = x.shape
    (ph, pw) = padding
    if _is_2x2(x, kernel_size, stride, padding, dilation, ceil_mode) and g.dtype == x.dtype:
        out = np.empty(x.shape, x.dtype)
        ho, wo = g.shape[2], g.shape[3]
        out[:, :, 2 * ho:] = 0   # rows and columns no window covers (odd sizes)
        out[:, :, :, 2 * wo:] = 0
        if not _max_grad_2x2(np.ascontiguousarray(x), np.ascontiguousarray(g),
                             x.dtype.type(0), out):
            return out
    if HAVE_NUMBA and x.dtype in (np.float32, np.float64) and g.dtype == x.dtype:
        xp = np.ascontiguousarray(_padw(x, padding, g.shape[2:], kernel_size, stride,
                                        dilation, _lowest(x.dtype)))
        buf = np.zeros(xp.shape, g.dtype)
        _max_grad_loop(xp, np.ascontiguousarray(g), kernel_size[0], kernel_size[1],
                       stride[0], stride[1], dilation[0], dilation[1], buf)
        return np.ascontiguousarray(buf[:, :, ph:ph + h, pw:pw + w])
    arg, ho, wo = _argmax(x, kernel_size, stride, padding, dilation, ceil_mode)
    buf = np.zeros((n, c) + _padded_hw((h, w), padding, (ho, wo), kernel_size, stride,
                                       dilation), g.dtype)
    zero = g.dtype.type(0)
    for t, i, j in _taps(kernel_size):
        buf[_win(i, j, ho, wo, stride, dilation)] += np.where(arg == t, g, zero)
    return np.ascontiguousarray(buf[:, :, ph:ph + h, pw:pw + w])


def _max_gather_kernel(x, v, kernel_size, stride, padding, dilation, ceil_mode=False):
    arg, ho, wo = _argmax(x, kernel_size, stride, padding, dilation, ceil_mode)
    vp = _padw(v, padding, (ho, wo), kernel_size, stride, dilation, 0)
    out = np.zeros(arg.shape, v.dtype)
    for t, i, j in _taps(kernel_size):
        np.copyto(out, vp[_win(i, j, ho, wo, stride, dilation)], where=arg == t)
    return out


def _max_grad_rule(x, g, kernel_size, stride, padding, dilation, ceil_mode=False):
    y = _max_rule(x, kernel_size, stride, padding, dilation, ceil_mode)
    if tuple(g.shape) != tuple(y.shape):
        raise op_error(ShapeError, "max_pool2d_grad", f"input {tuple(x.shape)} and grad "
                       f"{tuple(g.shape)}", f"a grad of the pooled shape {tuple(y.shape)}")
    return Spec(tuple(x.shape), g.dtype)


def _max_gather_rule(x, v, kernel_size, stride, padding, dilation, ceil_mode=False):
    y = _max_rule(x, kernel_size, stride, padding, dilation, ceil_mode)
    if tuple(v.shape) != tuple(x.shape):
        raise op_error(ShapeError, "max_pool2d_gather", f"input {tuple(x.shape)} and values "
                       f"{tuple(v.shape)}", "values shaped like the input")
    return Spec(tuple(y.shape), v.dtype)


def _pattrs(kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    k = _pair(kernel_size, "max_pool2d", "kernel_size")
    a = {"kernel_size": k, "stride": k if stride is None or stride == () else _pair(stride),
         "padding": _pair(padding), "dilation": _pair(dilation)}
    if ceil_mode:   # only when set: graphs and oracles without it stay as they were
        a["ceil_mode"] = True
    return a


def _max_samples():
    r = rng(70)
    return [Sample((randf(r, 2, 3, 6, 6),), _pattrs(2)),
            Sample((randf(r, 2, 2, 7, 8),), _pattrs(3, 2, 1)),
            Sample((randf(r, 1, 2, 9, 7),), _pattrs((3, 2), (2, 1), (1, 0), (2, 1))),
            Sample((randf(r, 1, 3, 5, 5),), _pattrs(3, 1, 1)),
            Sample((randf(r, 0, 2, 4, 4),), _pattrs(2)),
            Sample((randf(r, 1, 2, 5, 7),), _pattrs(2, ceil_mode=True)),
            Sample((randf(r, 1, 1, 6, 5),), _pattrs(3, 2, 1, ceil_mode=True))]


def _with_grad(samples, name):
    def make():
        out = []
        for s in samples():
            x = s.args[0]
            y = _max_kernel(x, **s.attrs)
            v = randf(rng(71), *(y.shape if name == "grad" else x.shape))
            out.append(Sample((x, v), s.attrs, diff=(1,)))
        return out
    return make


def _max_grad_grad(gg, y, x, g, **attrs):
    return None, apply(MAX_POOL2D_GATHER, (x, gg), attrs)


def _max_gather_grad(gy, y, x, v, **attrs):
    return None, apply(MAX_POOL2D_GRAD, (x, gy), attrs)


MAX_POOL2D = defop("max_pool2d", _max_rule, kernel=_f32(_max_kernel),
                   grad=lambda g, y, x, **a: (apply(MAX_POOL2D_GRAD, (x, g), a),),
                   flops=_pool_flops, onnx="MaxPool", samples=_max_samples)
MAX_POOL2D_GRAD = defop("max_pool2d_grad", _max_grad_rule, kernel=_f32(_max_grad_kernel),
                        grad=_max_grad_grad, nondiff_inputs=(0,), saves=(0,),
                        flops=_grad_flops, onnx=NO_ONNX,
                        samples=_with_grad(_max_samples, "grad"))
MAX_POOL2D_GATHER = defop("max_pool2d_gather", _max_gather_rule,
                          kernel=_f32(_max_gather_kernel), grad=_max_gather_grad,
                          nondiff_inputs=(0,), saves=(0,),
                          flops=lambda x, v, kernel_size, **_: _numel(x.shape), onnx=NO_ONNX,
                          samples=_with_grad(_max_samples, "gather"))


# ---------------------------------------------------------------------- avg_pool2d
# ceil_mode and divisor_override appear in the attributes only when set (0: no override),
# so graphs written before them read the same
def _avg_rule(x, kernel_size, stride, padding, count_include_pad, ceil_mode=False,
              divisor_override=0):
    if not _dt.is_floating(x.dtype):
        raise op_error(DTypeError, "avg_pool2d", f"dtype {x.dtype}", "a floating dtype")
    if not isinstance(divisor_override, (int, np.integer)) or divisor_override < 0:
        raise op_error(ShapeError, "avg_pool2d", f"divisor_override={divisor_override!r}",
                       "a positive int or None")
    hw = _pool_hw("avg_pool2d", x, kernel_size, stride, padding, (1, 1), ceil_mode)
    return Spec(tuple(x.shape[:2]) + hw, x.dtype)


def _divisor(h, w, ho, wo, kernel_size, stride, padding, count_include_pad, dtype,
             divisor_override=0):
    """PyTorch's divisor per window: the window clipped to the padded input (its padding
    counted), or to the input itself without count_include_pad, or the override."""
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


def _avg_kernel(x, kernel_size, stride, padding, count_include_pad, ceil_mode=False,
                divisor_override=0):
    ho, wo = _hw(x, kernel_size, stride, padding, (1, 1), ceil_mode)
    xp = _padw(x, padding, (ho, wo), kernel_size, stride, (1, 1), 0)
    out = None
    for _k, i, j in _taps(kernel_size):
        s = xp[_win(i, j, ho, wo, stride, (1, 1))]
        out = s.copy() if out is None else np.add(out, s, out=out)
    out /= _divisor(x.shape[2], x.shape[3], ho, wo, kernel_size, stride, padding,
                    count_include_pad, out.dtype, divisor_override)
    return out


def _avg_grad_rule(g, input_size, kernel_size, stride, padding, count_include_pad,
                   ceil_mode=False, divisor_override=0):
    x = Spec(tuple(g.shape[:2]) + tuple(input_size), g.dtype)
    y = _avg_rule(x, kernel_size, stride, padding, count_include_pad, ceil_mode,
                  divisor_override)
    if tuple(g.shape) != tuple(y.shape):
        raise op_error(ShapeError, "avg_pool2d_grad", f"grad {tuple(g.shape)} for input size "
                       f"{tuple(input_size)}", f"a grad of the pooled shape {tuple(y.shape)}")
    return x


def _avg_grad_kernel(g, input_size, kernel_size, stride, padding, count_include_pad,
                     ceil_mode=False, divisor_override=0):
    n, c, ho, wo = g.shape
    h, w = input_size
    ph, pw = padding
    gs = g / _divisor(h, w, ho, wo, kernel_size, stride, padding, count_include_pad, g.dtype,
                      divisor_override)
    buf = np.zeros((n, c) + _padded_hw((h, w), padding, (ho, wo), kernel_size, stride,
                                       (1, 1)), g.dtype)
    for _k, i, j in _taps(kernel_size):
        buf[_win(i, j, ho, wo, stride, (1, 1))] += gs
    return np.ascontiguousarray(buf[:, :, ph:ph + h, pw:pw + w])


def _aattrs(kernel_size, stride=None, padding=0, count_include_pad=True, ceil_mode=False,
            divisor_override=None):
    k = _pair(kernel_size, "avg_pool2d", "kernel_size")
    a = {"kernel_size": k, "stride": k if stride is None or stride == () else _pair(stride),
         "padding": _pair(padding), "count_include_pad": bool(count_include_pad)}
    if ceil_mode:
        a["ceil_mode"] = True
    if divisor_override is not None:
        if isinstance(divisor_override, bool) or not isinstance(
                divisor_override, (int, np.integer)) or divisor_override < 1:
            raise op_error(ShapeError, "avg_pool2d", f"divisor_override={divisor_override!r}",
                           "a positive int or None")
        a["divisor_override"] = int(divisor_override)
    return a


def _avg_samples():
    r = rng(72)
    return [Sample((randf(r, 2, 3, 6, 6),), _aattrs(2)),
            Sample((randf(r, 2, 2, 7, 8),), _aattrs(3, 2, 1)),
            Sample((randf(r, 1, 2, 7, 8),), _aattrs(3, 2, 1, False)),
            Sample((randf(r, 1, 2, 9, 7),), _aattrs((3, 2), (2, 1), (1, 0), False)),
            Sample((randf(r, 0, 2, 4, 4),), _aattrs(2)),
            Sample((randf(r, 1, 2, 6, 5),), _aattrs(3, 2, 1, True, True)),
            Sample((randf(r, 1, 1, 5, 7),), _aattrs(2, 2, 1, False, True, 3))]


def _avg_grad_samples():
    out = []
    for s in _avg_samples():
        x = s.args[0]
        y = _avg_kernel(x, **s.attrs)
        out.append(Sample((randf(rng(73), *y.shape),),
                          dict(s.attrs, input_size=tuple(x.shape[2:]))))
    return out


def _avg_grad(g, y, x, **attrs):
    return (apply(AVG_POOL2D_GRAD, (g,), dict(attrs, input_size=tuple(x.shape[2:]))),)


def _avg_grad_grad(gg, y, g, input_size, **attrs):
    return (apply(AVG_POOL2D, (gg,), attrs),)


AVG_POOL2D = defop("avg_pool2d", _avg_rule, kernel=_f32(_avg_kernel), grad=_avg_grad, saves=(),
                   flops=_pool_flops, onnx="AveragePool", samples=_avg_samples)
AVG_POOL2D_GRAD = defop("avg_pool2d_grad", _avg_grad_rule, kernel=_f32(_avg_grad_kernel),
                        grad=_avg_grad_grad, saves=(),
                        flops=lambda g, input_size, kernel_size, **_: _numel(g.shape) *
                        kernel_size[0] * kernel_size[1],
                        onnx=NO_ONNX, samples=_avg_grad_samples)


# ---------------------------------------------------------------------- frontends
def _nchw(x, op):
    """Accept (C, H, W) like PyTorch by adding a batch dim; returns (x4, squeeze_back)."""
    from .shape import unsqueeze
    x = _t(x)
    if x.ndim == 3:
        return unsqueeze(x, 0), True
    if x.ndim != 4:
        raise op_error(ShapeError, op, f"input of shape {tuple(x.shape)}",
                       "a 3-d (C, H, W) or 4-d (N, C, H, W) input")
    return x, False


def _back(y, squeeze):
    from .shape import squeeze as sq
    return sq(y, 0) if squeeze else y


# The poolings that also return indices (pool_index.py, which builds on this module, puts
# them here when the op table loads: its module is one of ops.FAMILIES)
WITH_INDICES: dict = {}


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """Max over kh x kw windows (padding counts as -inf); PyTorch's signature.

    ceil_mode keeps a last partial window; return_indices also returns the int64 flat
    per-plane index (row * W + col) of each window's maximum.

    Example::

        >>> sampan.max_pool2d(sampan.randn(1, 3, 8, 8), 2).shape
        (1, 3, 4, 4)
    """
    if return_indices:
        return WITH_INDICES["max_pool2d"](x, kernel_size, stride, padding, dilation, ceil_mode)
    x, sq = _nchw(x, "max_pool2d")
    y = checked_apply(MAX_POOL2D, (x,), _pattrs(kernel_size, stride, padding, dilation,
                                                ceil_mode))
    return _back(y, sq)


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """Mean over kh x kw windows (PyTorch's signature and divisor): padding counts as zeros
    unless count_include_pad=False; ceil_mode keeps a last partial window;
    divisor_override divides every window's sum by that number instead.

    Example::

        >>> sampan.avg_pool2d(sampan.randn(1, 3, 8, 8), 2).shape
        (1, 3, 4, 4)
    """
    from .elementwise import cast
    x, sq = _nchw(x, "avg_pool2d")
    if not _dt.is_floating(x.dtype):
        x = cast(x, _dt.get_default_dtype())
    attrs = _aattrs(kernel_size, stride, padding, count_include_pad, ceil_mode,
                    divisor_override)
    return _back(checked_apply(AVG_POOL2D, (x,), attrs), sq)


def _adaptive_axis(x, axis, n_out):
    """Mean over PyTorch's adaptive windows [floor(i*n/o), ceil((i+1)*n/o)) along `axis`."""
    from .reduce import mean
    from .shape import concat, narrow
    n = x.shape[axis]
    if n == n_out:
        return x
    parts = []
    for i in range(n_out):
        a, b = (i * n) // n_out, -((-(i + 1) * n) // n_out)
        parts.append(mean(narrow(x, axis, a, b - a), axis, keepdims=True))
    return concat(parts, axis)


def adaptive_avg_pool2d(x, output_size):
    """Average pooling to a fixed output size (None keeps that dim), as PyTorch.

    One avg_pool2d when the sizes divide evenly, else a composite of slices and means.

    Example::

        >>> sampan.adaptive_avg_pool2d(sampan.randn(2, 8, 7, 7), 1).shape
        (2, 8, 1, 1)
    """
    x, sq = _nchw(x, "adaptive_avg_pool2d")
    h, w = x.shape[2:]
    if isinstance(output_size, (int, np.integer)) or output_size is None:
        output_size = (output_size, output_size)
    oh, ow = (h if output_size[0] is None else int(output_size[0]),
              w if output_size[1] is None else int(output_size[1]))
    if oh < 1 or ow < 1:
        raise op_error(ShapeError, "adaptive_avg_pool2d", f"output_size={output_size}",
                       "positive output sizes")
    if h % oh == 0 and w % ow == 0:
        y = avg_pool2d(x, (h // oh, w // ow)) if (oh, ow) != (h, w) else x
    else:
        y = _adaptive_axis(_adaptive_axis(x, 2, oh), 3, ow)
    return _back(y, sq)
