"""matmul (batched, broadcasting). bfloat16/float16 compute in float32 (numpy's
bfloat16 dot is ~180x slower than float32) and round the result."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import ShapeError, op_error
from ..tensor import Tensor, apply
from ._util import Sample, broadcast_shapes, lead_size, randf, rng, same_dtype, unbroadcast
from .elementwise import operands
from .modes import HOOKS, as_inputs_of
from .registry import Spec, defop
from .shape import reshape, transpose


def _matmul_rule(a, b):
    d = same_dtype("matmul", a, b)
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise op_error(ShapeError, "matmul", f"shapes {tuple(a.shape)} and {tuple(b.shape)}",
                       "at least 2-d inputs (1-d inputs are reshaped by sampan.matmul)")
    if a.shape[-1] != b.shape[-2]:
        raise op_error(ShapeError, "matmul", f"shapes {tuple(a.shape)} @ {tuple(b.shape)}",
                       f"a.shape[-1] == b.shape[-2] (got {a.shape[-1]} and {b.shape[-2]})")
    batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    return Spec(tuple(batch) + (a.shape[-2], b.shape[-1]), d)


def _matmul_kernel(a, b):
    if a.dtype.itemsize == 2 and a.dtype.name in ("float16", "bfloat16"):
        return _matmul_kernel(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    if a.ndim > 2 and b.ndim == 2:
        # (..., m, k) @ (k, n) as one (M, k) @ (k, n) GEMM: numpy would loop over the batch
        # with small GEMMs, about 4x slower for transformer-sized activations
        m = 1
        for d in a.shape[:-1]:
            m *= d
        return np.matmul(a.reshape(m, a.shape[-1]), b).reshape(a.shape[:-1] + (b.shape[1],))
    return np.matmul(a, b)


def matmul_out_kernel(a, b, out):
    """float32/64 matmul written into `out` (a buffer of the memory plan: the runtime's
    out= kernel): (..., m, k) @ (k, n) as one GEMM when a and out are contiguous; a
    non-contiguous a stays a batch of products (np.matmul), as numpy runs it."""
    if a.ndim > 2 and b.ndim == 2 and a.flags.c_contiguous and out.flags.c_contiguous:
        m = 1
        for d in a.shape[:-1]:
            m *= d
        np.matmul(a.reshape(m, a.shape[-1]), b, out=out.reshape(m, out.shape[-1]))
        return out
    return np.matmul(a, b, out=out)


def matmul_planned(a, b, min_bytes=256):
    """matmul as the memory-planned runtime runs a node the plan may give a buffer (an
    output of at least `min_bytes`, float32/64): `matmul_out_kernel` into a new array;
    otherwise the op's kernel. `sampan deploy` calls it for such nodes."""
    if a.dtype.kind != "f" or b.dtype.kind != "f" or a.dtype.itemsize < 4 or b.ndim != 2:
        return _matmul_kernel(a, b)
    shape = a.shape[:-1] + (b.shape[1],)
    dtype = np.result_type(a, b)
    n = dtype.itemsize
    for d in shape:
        n *= d
    if n < min_bytes:
        return _matmul_kernel(a, b)
    return matmul_out_kernel(a, b, np.empty(shape, dtype))


def _mT(x):
    return transpose(x, -2, -1)


def _matmul_grad(g, y, a, b):
    ga = unbroadcast(matmul(g, _mT(b)), a.shape) if a.requires_grad else None
    if not b.requires_grad:
        gb = None
    elif len(a.shape) > 2 and len(b.shape) == 2:
        # weight gradient of a batch of products by one matrix: one (k, M) @ (M, n) GEMM
        # instead of a batched product and a sum over the batch
        k, n = b.shape
        m = lead_size(a.shape[:-1])
        gb = matmul(_mT(reshape(a, (m, k))), reshape(g, (m, n)))
    else:
        gb = unbroadcast(matmul(_mT(a), g), b.shape)
    return ga, gb


def _matmul_flops(a, b):
    s = _matmul_rule(a, b).shape
    n = 1
    for d in s:
        n *= d if isinstance(d, int) else 1
    return 2 * n * (a.shape[-1] if isinstance(a.shape[-1], int) else 1)


def _samples():
    r = rng(50)
    return [Sample((randf(r, 3, 4), randf(r, 4, 5))),
            Sample((randf(r, 2, 3, 4), randf(r, 4, 2))),
            Sample((randf(r, 2, 1, 3, 4), randf(r, 3, 4, 2))),
            Sample((randf(r, 0, 4), randf(r, 4, 3))),
            # a zero inner dim: zeros, as in PyTorch (the batch-by-matrix path too)
            Sample((randf(r, 3, 0), randf(r, 0, 2))),
            Sample((randf(r, 2, 3, 0), randf(r, 0, 2)))]


MATMUL = defop("matmul", _matmul_rule, kernel=_matmul_kernel, grad=_matmul_grad,
               flops=_matmul_flops, onnx="MatMul", samples=_samples, amp="lower", gemm=True)


_LOWERABLE = frozenset(np.dtype(d) for d in (np.float32, np.float16, _dt.bfloat16))


def matmul(a, b):
    """Matrix product with batch broadcasting; 1-d operands as in numpy. Example: ``x @ w``."""
    if HOOKS.active and isinstance(a, Tensor) and isinstance(b, Tensor) \
            and a._data.dtype != b._data.dtype and a._data.dtype in _LOWERABLE \
            and b._data.dtype in _LOWERABLE:
        # under autocast both operands are cast to its dtype before promotion: a bfloat16
        # activation times a float32 weight went bf16 -> f32 -> bf16 (two passes, no bit
        # changed) when promotion ran first. Only float32 / bfloat16 / float16 pairs: a
        # float64 or integer operand is promoted first, as before
        a, b = as_inputs_of(MATMUL, a, b)
    a, b = operands(a, b)
    if a.ndim >= 2 and b.ndim >= 2:
        return apply(MATMUL, (a, b), {})
    if a.ndim == 0 or b.ndim == 0:
        raise op_error(ShapeError, "matmul", f"shapes {a.shape} and {b.shape}",
                       "at least 1-d inputs")
    a2 = reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
    b2 = reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
    y = apply(MATMUL, (a2, b2), {})
    shape = tuple(y.shape)
    if a.ndim == 1:
        shape = shape[:-2] + shape[-1:]
    if b.ndim == 1:
        shape = shape[:-1]
    return reshape(y, shape)
