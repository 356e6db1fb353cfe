"""numba loops of the unary family: relu and its gradient (selects LLVM vectorises),
erf and exact GELU in float32 through mathlib's erf32/dgelu32 (the values jit's fused
kernels compute; ~35x faster than scipy's scalar erf here). Each kernel hands what its
loop does not serve to the op's numpy kernel in `sampan.ops.unary`."""
from __future__ import annotations

import numpy as np

from .... import dtypes as _dt
from ....ops import unary as _u
from ....ops._nb import FASTMATH_IEEE, njit, run_flat
from ..mathlib import dgelu32 as _dgelu32
from ..mathlib import erf32 as _erf32

_FLOATS = {np.dtype(np.float32), np.dtype(np.float64)}
_F32 = np.dtype(np.float32)
_BF16 = np.dtype(_dt.bfloat16)


@njit(cache=True, nogil=True, error_model="numpy")
def _relu_loop(a, out):
    # np.maximum(a, 0) bit for bit (NaN kept, -0.0 -> +0.0) as selects LLVM vectorises:
    # numpy's maximum took ~4x as long here on activation-sized arrays
    z = a.dtype.type(0)
    for i in range(a.size):
        v = a[i]
        out[i] = v if v > z or v != v else z


@njit(cache=True, nogil=True, error_model="numpy")
def _relu_bits_loop(a, out):
    # bfloat16 as its uint16 bits: kept where positive (1 .. 0x7F80, up to +inf) or NaN
    # (exponent all ones, mantissa not zero: np.maximum passes a NaN on), else +0
    z = np.uint16(0)
    for i in range(a.size):
        u = a[i]
        keep = ((u >= np.uint16(1)) & (u <= np.uint16(0x7F80))) | \
            ((u & np.uint16(0x7FFF)) > np.uint16(0x7F80))
        out[i] = u if keep else z


def relu(a):
    if a.dtype in _FLOATS:
        return run_flat(_relu_loop, a.dtype, a)
    if a.dtype == _BF16 and a.size:
        # ml_dtypes' maximum converts per element: ~20x float32's time (issue 31, W2)
        return run_flat(_relu_bits_loop, np.uint16,
                        np.ascontiguousarray(a).view(np.uint16)).view(_BF16)
    return _u._relu(a)


# relu's gradient as one op: g where a > 0, else 0 (NaN inputs give 0, as gt(a, 0) did)
@njit(cache=True, nogil=True, error_model="numpy")
def _relu_grad_loop(a, g, out):
    z = g.dtype.type(0)
    for i in range(a.size):
        v = g[i]            # both loaded before the select: a vector blend, no branch
        out[i] = v if a[i] > 0 else z


@njit(cache=True, nogil=True, error_model="numpy")
def _relu_grad_bits_loop(a, g, out):
    # bfloat16 as its uint16 bits: a > 0 exactly when 1 <= bits <= 0x7F80 (positive
    # subnormal .. +inf; NaN, zeros and negatives are not), g's bits copied or zeroed
    z = np.uint16(0)
    for i in range(a.size):
        v = g[i]
        u = a[i]
        out[i] = v if (u >= np.uint16(1)) & (u <= np.uint16(0x7F80)) else z


def relu_grad(a, g):
    if a.shape == g.shape and a.dtype == g.dtype and g.dtype in _FLOATS:
        return run_flat(_relu_grad_loop, g.dtype, a, g)
    if a.shape == g.shape and a.dtype == g.dtype == _BF16:
        # ml_dtypes' comparison and where loop per element: ~10x slower (issue 31, W2's
        # bf16 backward); exact on the bits
        a16 = np.ascontiguousarray(a).view(np.uint16)
        g16 = np.ascontiguousarray(g).view(np.uint16)
        return run_flat(_relu_grad_bits_loop, np.uint16, a16, g16).view(_BF16)
    return _u._relu_grad_kernel(a, g)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH_IEEE)
def _erf32_loop(a, out):
    for i in range(a.size):
        out[i] = _erf32(a[i])


def _f32(*arrays):
    return all(a.dtype == _F32 for a in arrays) and arrays[0].size


def _erf_any(a):
    """erf: float32 through erf32 (a rational fit, within 6 ulps of the correctly rounded
    value); float64 through scipy (the numpy kernel)."""
    if _f32(a):
        return run_flat(_erf32_loop, np.float32, a)
    return _u._erf_kernel(a)


_R2 = _u._R2


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH_IEEE)
def _gelu32_loop(a, out):
    for i in range(a.size):
        x = a[i]
        out[i] = x * np.float32(0.5) * (np.float32(1.0) + _erf32(x * np.float32(_R2)))


@njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH_IEEE)
def _gelu_grad32_loop(a, g, out):
    for i in range(a.size):
        out[i] = g[i] * _dgelu32(a[i])


def _gelu_any(a):
    if _f32(a):   # erf32 as in `_erf_any`: the formula fused jit kernels use
        return run_flat(_gelu32_loop, np.float32, a)
    return _u._gelu_kernel(a)


def gelu_grad(a, g):
    if _f32(a, g) and a.shape == g.shape:
        return run_flat(_gelu_grad32_loop, np.float32, a, g)
    return _u._gelu_grad_kernel(a, g)


KERNELS = {"relu": relu, "relu_grad": relu_grad, "erf": _u._as_kernel(_erf_any),
           "gelu": _u._as_kernel(_gelu_any), "gelu_grad": gelu_grad}
