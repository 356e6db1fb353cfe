"""numba loops of max pooling (`sampan.ops.pool`): 2x2 windows at stride 2 in two
vectorised loops, and the gradient of any window as one scatter loop. Other calls go to
the op's numpy kernels (taps as strided slices). bfloat16/float16 compute in float32."""
from __future__ import annotations

import numpy as np

from .... import dtypes as _dt
from ....ops import pool as _p
from ....ops._nb import njit
from .elementwise import in_float32


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
    return (x.dtype in (np.float32, np.float64, np.uint8, np.int8)
            and tuple(kernel_size) == (2, 2) and tuple(stride) == (2, 2)
            and tuple(padding) == (0, 0) and tuple(dilation) == (1, 1)
            and not (ceil_mode and (x.shape[2] % 2 or x.shape[3] % 2)))


def max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode=False):
    if _is_2x2(x, kernel_size, stride, padding, dilation, ceil_mode):
        ho, wo = _p._hw(x, kernel_size, stride, padding, dilation, ceil_mode)
        out = np.empty(x.shape[:2] + (ho, wo), x.dtype)
        _max_2x2(np.ascontiguousarray(x), out)
        return out
    return _p._max_kernel(x, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool2d_grad(x, g, kernel_size, stride, padding, dilation, ceil_mode=False):
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
    if x.dtype in (np.float32, np.float64) and g.dtype == x.dtype:
        xp = np.ascontiguousarray(_p._padw(x, padding, g.shape[2:], kernel_size, stride,
                                           dilation, _p._lowest(x.dtype)))
        buf = np.zeros(xp.shape, g.dtype)
        _max_grad_loop(xp, np.ascontiguousarray(g), kernel_size[0], kernel_size[1],
                       stride[0], stride[1], dilation[0], dilation[1], buf)
        return np.ascontiguousarray(buf[:, :, ph:ph + h, pw:pw + w])
    return _p._max_grad_kernel(x, g, kernel_size, stride, padding, dilation, ceil_mode)


_BF16 = np.dtype(_dt.bfloat16)
_grad_in_f32 = in_float32(max_pool2d_grad)


def max_pool2d_grad_any(x, g, kernel_size, stride, padding, dilation, ceil_mode=False):
    """max_pool2d_grad; bfloat16 2x2 windows compare x in float32 and move g's bits
    (the gradient only copies values: no widening of g, no rounding of the result)."""
    if x.dtype == _BF16 and g.dtype == _BF16 and x.size:
        xf = x.astype(np.float32)
        if _is_2x2(xf, kernel_size, stride, padding, dilation, ceil_mode):
            out = np.empty(x.shape, np.uint16)
            ho, wo = g.shape[2], g.shape[3]
            out[:, :, 2 * ho:] = 0
            out[:, :, :, 2 * wo:] = 0
            if not _max_grad_2x2(xf, np.ascontiguousarray(g).view(np.uint16), np.uint16(0),
                                 out):
                return out.view(_BF16)
    return _grad_in_f32(x, g, kernel_size=kernel_size, stride=stride, padding=padding,
                        dilation=dilation, ceil_mode=ceil_mode)


KERNELS = {"max_pool2d": in_float32(max_pool2d), "max_pool2d_grad": max_pool2d_grad_any}
