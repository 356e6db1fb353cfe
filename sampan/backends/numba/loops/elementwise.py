"""numba loops of `where`, of sums over leading axes and of float32 <-> bfloat16 casts
(`sampan.ops.elementwise`, `sampan.ops.reduce`): selects, row additions and bit
conversions LLVM vectorises, bit for bit what the ops' numpy kernels compute; other calls
go to those kernels."""
from __future__ import annotations

import math

import numpy as np

from .... import dtypes as _dt
from ....ops import elementwise as _e
from ....ops import reduce as _r
from ....ops.conv import _f32_call as _conv_f32_call
from ....ops.conv import _is_half as _e_half
from ....ops._nb import njit, run_flat
from ..mathlib import bf16_load, bf16_store

_FLOATS = {np.dtype(np.float32), np.dtype(np.float64)}
_F32, _BF16 = np.dtype(np.float32), np.dtype(_dt.bfloat16)


@njit(cache=True, nogil=True, error_model="numpy")
def _where_loop(c, a, b, out, full_a, full_b):
    # c repeats every c.size elements of out; a and b are full (out.size) or one value.
    # Both sides are loaded before the select, so LLVM emits a vector blend: numpy's
    # where branches per element and ran 17x slower on random masks here.
    mc = c.size
    av = a[0]
    bv = b[0]
    for r in range(out.size // mc):
        base = r * mc
        if full_a and full_b:
            for j in range(mc):
                x = a[base + j]
                y = b[base + j]
                out[base + j] = x if c[j] else y
        elif full_a:
            for j in range(mc):
                x = a[base + j]
                out[base + j] = x if c[j] else bv
        elif full_b:
            for j in range(mc):
                y = b[base + j]
                out[base + j] = av if c[j] else y
        else:
            for j in range(mc):
                out[base + j] = av if c[j] else bv


def where(c, a, b):
    """np.where through `_where_loop` when the layout allows: a and b of one float dtype,
    each contiguous of the result's shape or a single value, and a contiguous condition
    broadcast only over leading dims."""
    if a.dtype in _FLOATS and b.dtype == a.dtype and c.dtype == np.bool_:
        shape = np.broadcast_shapes(c.shape, a.shape, b.shape)
        n = math.prod(shape)
        full_a, full_b = a.shape == shape, b.shape == shape
        cs = c.shape
        while cs and cs[0] == 1:
            cs = cs[1:]
        if (n and (full_a or a.size == 1) and (full_b or b.size == 1)
                and (not full_a or a.flags.c_contiguous) and (not full_b or b.flags.c_contiguous)
                and c.flags.c_contiguous and c.size and cs == shape[len(shape) - len(cs):]):
            out = np.empty(shape, a.dtype)
            _where_loop(c.reshape(-1), a.reshape(-1), b.reshape(-1), out.reshape(-1),
                        full_a, full_b)
            return out
    return _e._where_kernel(c, a, b)


@njit(cache=True, nogil=True)
def _colsum_loop(a, out):
    # rows added into the output in order, as numpy's reduction over leading axes does
    # (bit-identical), with the column loop vectorised
    nr, nc = a.shape
    for j in range(nc):
        out[j] = a[0, j]
    for i in range(1, nr):
        for j in range(nc):
            out[j] += a[i, j]


def sum_(a, axis=None, keepdims=False):
    """Sums over leading axes (bias and layer-norm gradients) as one pass of row additions:
    numpy's strided reduction ran at about half its speed here."""
    if (a.dtype in _FLOATS and isinstance(axis, tuple) and axis
            and axis == tuple(range(len(axis))) and len(axis) < a.ndim and a.size
            and a.flags.c_contiguous):
        nc = 1
        for d in a.shape[len(axis):]:
            nc *= d
        out = np.empty(a.shape[len(axis):], a.dtype)
        _colsum_loop(a.reshape(-1, nc), out.reshape(-1))
        return out.reshape(_r._red_shape(a, axis, True)) if keepdims else out
    return _r._sum_kernel(a, axis, keepdims)


# float32 -> bfloat16 (what every bf16 GEMM operand under autocast pays) as a loop over
# the bits: ml_dtypes' astype rounds element by element, ~3.5x slower here; the same
# bits: to nearest, ties to even (mathlib's bf16_store), and a NaN as ml_dtypes writes it,
# the quiet NaN of its sign (bf16_store keeps the payload's top bits). Widening
# bfloat16 -> float32 is as fast in ml_dtypes and stays there.
@njit(cache=True, nogil=True, error_model="numpy")
def _to_bf16_loop(a, out):
    for i in range(a.size):
        v = a[i]
        q = bf16_store(v)
        out[i] = (q & np.uint16(0x8000)) | np.uint16(0x7FC0) if v != v else q


def cast(a, dtype):
    if a.dtype == _F32 and a.size and np.dtype(dtype) == _BF16:
        return run_flat(_to_bf16_loop, np.uint16, a).view(_BF16)
    return _e._cast_kernel(a, dtype)


def in_float32(kernel):
    """`kernel` (a float32 loop) for half-precision inputs as `ops.conv._f32` runs it,
    widened to float32 and the result rounded back, a bfloat16 result rounded by
    `_to_bf16_loop` (ml_dtypes' astype took ~3.5x as long: the pooling and convolution
    loops of W2's bf16 step paid it on every call)."""
    def k(*arrays, **attrs):
        d = arrays[0].dtype if _e_half(arrays[0].dtype) else arrays[-1].dtype
        if d != _BF16:
            return _conv_f32_call(kernel, arrays, attrs)
        up = [a.astype(np.float32) if _e_half(a.dtype) else a for a in arrays]
        return cast(np.asarray(kernel(*up, **attrs), np.float32), _BF16)
    k.__name__ = kernel.__name__
    k.__doc__ = kernel.__doc__
    return k


# bfloat16 add / sub / mul: ml_dtypes' ufunc loops convert and round element by element,
# 10-20x slower than float32's (issue 31: W2's bf16 bias adds took 1.4 ms against 0.15 ms
# in float32, on this AMD Zen 4). One loop over the bits, each operand widened exactly,
# the float32 result rounded once, as ml_dtypes computes it (to nearest even, a NaN as
# the quiet NaN of its sign). Broadcasting: the operands' element strides over the
# result's dims, adjacent dims merged, at most three left (a bias over N, C, H*W).
@njit(inline="always", cache=True)
def _bits_arith(op, u, v):
    # bfloat16 bits u, v -> the bits of (u op v) computed in float32 and rounded once
    x = bf16_load(u)
    y = bf16_load(v)
    r = x + y if op == 0 else (x - y if op == 1 else x * y)
    q = bf16_store(r)
    return (q & np.uint16(0x8000)) | np.uint16(0x7FC0) if r != r else q


@njit(inline="always", cache=True)
def _binary_bits_rows(op, a, b, n0, n1, n2, a0, a1, a2, b0, b1, b2, out):
    # inlined into one entry point per operation, `op` a constant there (the branches on
    # it fold away). Each row is sliced first, so the inner loop indexes by its range
    # variable alone (no negative-index checks on offset arithmetic); unit and zero
    # inner strides then vectorise
    for i in range(n0):
        for j in range(n1):
            pa = i * a0 + j * a1
            pb = i * b0 + j * b1
            o = out[(i * n1 + j) * n2:(i * n1 + j + 1) * n2]
            if a2 == 1 and b2 == 1:
                ar = a[pa:pa + n2]
                br = b[pb:pb + n2]
                for t in range(n2):
                    o[t] = _bits_arith(op, ar[t], br[t])
            elif a2 == 1 and b2 == 0:
                ar = a[pa:pa + n2]
                v = b[pb]
                for t in range(n2):
                    o[t] = _bits_arith(op, ar[t], v)
            elif a2 == 0 and b2 == 1:
                u = a[pa]
                br = b[pb:pb + n2]
                for t in range(n2):
                    o[t] = _bits_arith(op, u, br[t])
            else:
                for t in range(n2):
                    o[t] = _bits_arith(op, a[pa + t * a2], b[pb + t * b2])


@njit(cache=True, nogil=True, error_model="numpy")
def _add_bits(a, b, n0, n1, n2, a0, a1, a2, b0, b1, b2, out):
    _binary_bits_rows(0, a, b, n0, n1, n2, a0, a1, a2, b0, b1, b2, out)


@njit(cache=True, nogil=True, error_model="numpy")
def _sub_bits(a, b, n0, n1, n2, a0, a1, a2, b0, b1, b2, out):
    _binary_bits_rows(1, a, b, n0, n1, n2, a0, a1, a2, b0, b1, b2, out)


@njit(cache=True, nogil=True, error_model="numpy")
def _mul_bits(a, b, n0, n1, n2, a0, a1, a2, b0, b1, b2, out):
    _binary_bits_rows(2, a, b, n0, n1, n2, a0, a1, a2, b0, b1, b2, out)


def _flat_bits(a):
    """bfloat16 `a`'s memory from its first element to its last as one uint16 vector
    (strides non-negative element multiples: checked by the caller)."""
    span = 1 + sum((n - 1) * (s // 2) for n, s in zip(a.shape, a.strides))
    return np.lib.stride_tricks.as_strided(a.view(np.uint16) if a.ndim else
                                           a.reshape(1).view(np.uint16),
                                           shape=(span,), strides=(2,))


def _merged_dims(shape, arrays):
    """[(size, [element stride of each array])] over `shape`'s dims of size > 1, the
    arrays broadcast to it, adjacent dims that walk memory alike merged; None where a
    stride is negative or not whole elements."""
    nd = len(shape)
    per = []
    for a in arrays:
        st = [0] * nd
        off = nd - a.ndim
        for i, (n, s) in enumerate(zip(a.shape, a.strides)):
            if n != 1:
                if s < 0 or s % a.itemsize:
                    return None
                st[off + i] = s // a.itemsize
        per.append(st)
    dims = []
    for i, n in enumerate(shape):
        if n == 1:
            continue
        ss = [st[i] for st in per]
        if dims and all(p == s * n for p, s in zip(dims[-1][1], ss)):
            dims[-1] = (dims[-1][0] * n, ss)
        else:
            dims.append((n, ss))
    return dims


_SMALL = 4096       # below: the ufunc (its per-call cost is lower than this wrapper's)
_BINARY_OPS = {"add": (_add_bits, np.add), "sub": (_sub_bits, np.subtract),
               "mul": (_mul_bits, np.multiply)}


def _bf16_binary(name):
    loop, ufunc = _BINARY_OPS[name]

    def kernel(a, b):
        if a.dtype is not _BF16 or b.dtype is not _BF16:
            return ufunc(a, b)
        shape = np.broadcast_shapes(a.shape, b.shape)
        dims = _merged_dims(shape, (a, b))
        if dims is None or len(dims) > 3 or math.prod(shape) < _SMALL:
            return ufunc(a, b)
        dims = [(1, [0, 0])] * (3 - len(dims)) + dims
        out = np.empty(shape, _BF16)
        (n0, (a0, b0)), (n1, (a1, b1)), (n2, (a2, b2)) = dims
        loop(_flat_bits(a), _flat_bits(b), n0, n1, n2, a0, a1, a2, b0, b1, b2,
             out.reshape(-1).view(np.uint16))
        return out
    kernel.__name__ = name
    kernel.__doc__ = f"np.{ufunc.__name__}; bfloat16 pairs through one loop over the bits."
    return kernel


KERNELS = {"where": where, "sum": sum_, "cast": cast,
           **{name: _bf16_binary(name) for name in _BINARY_OPS}}
