"""`attention(q, k, v[, bias], heads=, scale=)`: BERT's masked multi-head self-attention in
one node (issue 31, W8). The Predictor's `fuse_attention` pass writes it in place of the
chain the encoder traces: the head-major copies of q, k^T and v, ``(q * scale) @ k^T``,
the additive key mask, softmax over the keys, ``@ v`` and the copy back to token-major
rows. One node lets the numba kernel keep one (batch, head)'s S x S scores in cache and
read q, k and v straight from the projections' rows, with no head-major copies.

    attention(q (B, S, H), k (B, S, H), v (B, S, H), bias (B, 1, 1, S), heads=h, scale=c)
        -> (B, S, H): head j of token t is softmax((q_j * c) @ k_j^T + bias) @ v_j at t

where x_j is columns [j*d, (j+1)*d) of x, d = H / h. `bias` (optional) is added to every
head's scores of a sequence, one value per key (HF's extended attention mask: 0 or the
dtype's most negative value). float32 or float64, one dtype for all. The numpy kernel is
the unfused chain's arithmetic in numpy (q scaled first, the scores' sums in BLAS order);
the numba kernel sums in its own order, so the two agree within float32 rounding, not
bit for bit. Only a pass writes this op (no user API); not differentiable (an inference
node: training keeps the chain); ONNX export writes the chain back (Reshape, Transpose,
Mul, MatMul, Add, Softmax: `onnx/lower/attention.py`).
"""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError, op_error
from ._util import Sample, rng
from .registry import NOT_DIFFERENTIABLE, Spec, defop

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
OP = "attention"


def _known(*dims):
    return all(isinstance(d, int) for d in dims)


def _rule(q, k, v, bias=None, heads=1, scale=1.0):
    got = f"q {q.dtype}{tuple(q.shape)}, k {k.dtype}{tuple(k.shape)}, v {v.dtype}" \
          f"{tuple(v.shape)}" + ("" if bias is None else f", bias {bias.dtype}"
                                 f"{tuple(bias.shape)}")
    if q.dtype not in _FLOATS or k.dtype != q.dtype or v.dtype != q.dtype or (
            bias is not None and bias.dtype != q.dtype):
        raise op_error(DTypeError, OP, got, "one float32 or float64 dtype for all inputs")
    if len(q.shape) != 3 or tuple(k.shape) != tuple(q.shape) or \
            tuple(v.shape) != tuple(q.shape):
        raise op_error(ShapeError, OP, got, "q, k and v of one shape (batch, seq, hidden)")
    b, s, h = q.shape
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or (
            _known(h) and h % heads):
        raise op_error(ShapeError, OP, f"{got}, heads={heads!r}",
                       "heads a positive int that divides the hidden size")
    if bias is not None:
        bs = tuple(bias.shape)
        want = (b, 1, 1, s)
        if len(bs) != 4 or bs[1:3] != (1, 1) or any(
                _known(x, y) and x != y for x, y in zip(bs, want)):
            raise op_error(ShapeError, OP, got, f"bias of shape (batch, 1, 1, seq) = {want}")
    return Spec((b, s, h), q.dtype)


def attention_reference(q, k, v, bias=None, heads=1, scale=1.0):
    """numpy: the unfused chain (q scaled, scores, + bias, softmax, @ v), in a new array."""
    b, s, h = q.shape
    d = h // heads
    dt = q.dtype.type

    def split(x):
        return x.reshape(b, s, heads, d).transpose(0, 2, 1, 3)
    sc = np.matmul(split(q) * dt(scale), split(k).transpose(0, 1, 3, 2))
    if bias is not None:
        sc = sc + bias
    e = np.exp(sc - sc.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    o = np.matmul(p, split(v))
    return np.ascontiguousarray(o.transpose(0, 2, 1, 3).reshape(b, s, h))


def _flops(q, k, v, bias=None, heads=1, scale=1.0):
    b, s, h = (d if isinstance(d, int) else 1 for d in q.shape)
    # two GEMMs of 2 * S * S * H each, and ~5 per score (bias, max, exp, sum, scale)
    return 4 * b * s * s * h + 5 * b * heads * s * s


def _samples():
    r = rng(531)

    def f(*shape, dt=np.float32):
        return r.standard_normal(shape).astype(dt)

    def mask(b, s, dt=np.float32):
        m = np.ones((b, s), dt)
        m[-1, s // 2:] = 0                    # the last sequence ends in padding
        return ((1 - m) * np.finfo(dt).min).reshape(b, 1, 1, s)
    return [Sample((f(2, 7, 8), f(2, 7, 8), f(2, 7, 8), mask(2, 7)),
                   {"heads": 2, "scale": 0.5}, diff=()),
            Sample((f(1, 5, 12), f(1, 5, 12), f(1, 5, 12)), {"heads": 3, "scale": 0.5},
                   diff=()),
            Sample((f(3, 4, 6, dt=np.float64), f(3, 4, 6, dt=np.float64),
                    f(3, 4, 6, dt=np.float64), mask(3, 4, np.float64)),
                   {"heads": 1, "scale": 0.4}, diff=())]


ATTENTION = defop(
    OP, _rule, kernel=attention_reference, grad=NOT_DIFFERENTIABLE, flops=_flops, samples=_samples,
    gemm=True,
    doc="masked multi-head self-attention softmax((q*scale) @ k^T + bias) @ v per head, "
        "token-major in and out (written by the Predictor's fuse_attention pass)")
