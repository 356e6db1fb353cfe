"""Kernels bound per node when a graph is compiled once for concrete shapes and served many
times (the Predictor's executors: `compile_graph(g, specialize=True)`).

An op-table kernel decides on every call what its shapes and attributes allow (which loop,
which layout, whether to pad); at batch 1 those decisions cost as much as the arithmetic.
Here they are made once, at compile time, from the node's concrete types, and the
executor calls the chosen loop directly. Measured on LeNet-5 at batch 1 (2-core AMD EPYC,
2026-12-01): max_pool2d 2x2 4.5 -> ~1 us (the same numba loop, so bit-identical);
conv2d 1->6 5x5 12.9 -> 6.4 us (the direct kernel that the op already runs from batch ~14
up, skipped below that because its compile cost would not be repaid by a few calls;
a served program repays it). matmul of 1..8 rows against a constant weight: the
small-GEMM loop over the weight packed once (`backends/numba/gemv.py`; W5 MLP's 784x512
at 2 rows, 88 -> 19 us).

Each rule returns None where its conditions are not all met, and the node keeps its
op-table kernel. Example: ``fn = node_kernel(node)`` -> a callable over the node's inputs.
"""
from __future__ import annotations

import numpy as np

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_INT8 = (np.dtype(np.uint8), np.dtype(np.int8))


def _concrete(*values) -> bool:
    return all(isinstance(d, int) for v in values for d in v.shape)


def _max_pool2d(node):
    from ..backends.numba import available
    if not available():
        return None
    from ..backends.numba.loops import pool as _pool
    x, y = node.inputs[0], node.outputs[0]
    a = node.attrs
    # uint8 / int8 too: the int8 chain's max-pool (issue 31)
    if x.dtype not in _FLOATS + _INT8 or not _concrete(x, y) or len(x.shape) != 4:
        return None
    if not _pool._is_2x2(x, a["kernel_size"], a["stride"], a["padding"], a["dilation"],
                         a.get("ceil_mode", False)):
        return None
    loop, shape, dtype = _pool._max_2x2, tuple(y.shape), y.dtype
    contiguous = np.ascontiguousarray

    def max_pool2d_2x2(x):
        out = np.empty(shape, dtype)
        loop(contiguous(x), out)
        return out
    return max_pool2d_2x2


def _conv2d(node):
    from ..backends.numba import available
    if not available():
        return None
    from ..backends.numba.loops import conv as _conv
    x, w = node.inputs
    y = node.outputs[0]
    a = node.attrs
    if (x.dtype not in _FLOATS or w.dtype != x.dtype or w.const is None
            or not _concrete(x, w, y) or len(x.shape) != 4):
        return None
    o, cg, kh, kw = w.shape
    g = a["groups"]
    stride, dilation = tuple(a["stride"]), tuple(a["dilation"])
    n, ho, wo = x.shape[0], y.shape[2], y.shape[3]
    # the op's own test for its direct kernels, without the size below which it skips
    # them (their compile time; the default `outputs` passes that test); a stride-2
    # depthwise layer too (PP-OCR's (2, 1) and (2, 2) 5x5 ones: 5x faster at batch 1)
    if not (_conv._direct(x.dtype, stride, dilation, cg, o // g, kh, kw)
            or _conv._direct_strided(x.dtype, stride, dilation, cg, o // g, kh, kw,
                                     _conv.DIRECT_MIN_OUTPUTS)):
        if _conv._one_gemm(x.dtype, stride, dilation, g, ho * wo) and kh * kw > 1:
            return _conv2d_one_gemm(node, n, o, cg, kh, kw, ho, wo)
        return None
    loop = _conv._direct_kernel("forward", x.dtype, o // g, kh, kw)
    w2 = np.ascontiguousarray(w.const).reshape(o, -1)
    (ph, pw), (sh, sw) = a["padding"], a["stride"]
    shape, dtype = tuple(y.shape), y.dtype
    contiguous = np.ascontiguousarray

    def conv2d_direct(x, w):
        out = np.empty(shape, dtype)
        loop(contiguous(x), w2, out, ph, pw, sh, sw)
        return out
    return conv2d_direct


def _conv2d_one_gemm(node, n, o, cg, kh, kw, ho, wo):
    """The op's one-GEMM layout (columns of every image side by side, one product) with
    the reshaped weight and the column buffer made once; at batch 1 the product is
    written straight into the output (the (O, N) -> (N, O) transpose is a no-op)."""
    from ..backends.numba import convloops as _loops
    from ..ops import conv as _conv
    x, w = node.inputs
    y = node.outputs[0]
    ph, pw = node.attrs["padding"]
    w2 = np.ascontiguousarray(w.const).reshape(o, cg * kh * kw)
    col = np.empty((cg * kh * kw, n * ho * wo), x.dtype)   # this executor's scratch
    cols, pad, matmul = _loops.im2col_rows, _conv._pad, np.matmul
    shape, dtype = tuple(y.shape), y.dtype
    contiguous = np.ascontiguousarray

    def conv2d_one_gemm(x, w):
        cols(contiguous(pad(x, ph, pw)), kh, kw, ho, wo, col)
        out = np.empty(shape, dtype)
        if n == 1:
            matmul(w2, col, out=out.reshape(o, ho * wo))
        else:
            out[...] = matmul(w2, col).reshape(o, n, ho, wo).transpose(1, 0, 2, 3)
        return out
    return conv2d_one_gemm


def small_matmul(node):
    """x (M <= 8, K) @ a constant w (K, N): the small-GEMM loop over the weight packed
    once (`backends/numba/gemv.py`), split over the process's threads where that ran
    faster; called as ``f(x, w, out=buffer)`` (a planned buffer) or ``f(x, w)``. None
    where BLAS measured faster for the shape, or `choice.prefer` names another backend."""
    from ..backends import choice
    from ..backends.numba import gemv
    if node.op != "matmul" or len(node.inputs) != 2:
        return None
    x, w = node.inputs
    y = node.outputs[0]
    if w.const is None or not gemv.fits(x.shape, w.shape, x.dtype, w.dtype):
        return None
    if choice.preferred("matmul") is not None:     # the user said where matmuls run
        return None
    m, k = x.shape
    loop = gemv.loop_for(m, k, w.shape[1], w.dtype)
    if loop is None:                  # BLAS measured faster for this shape here
        return None
    wt = gemv.pack(w.const)
    shape, dtype = tuple(y.shape), y.dtype
    contiguous, empty = np.ascontiguousarray, np.empty

    def matmul_small(x, w, out=None):
        if out is None:
            out = empty(shape, dtype)
        loop(contiguous(x), wt, out)
        return out
    return matmul_small


_RULES = {"max_pool2d": _max_pool2d, "conv2d": _conv2d, "matmul": small_matmul}


def node_kernel(node):
    """A callable over the node's input arrays for its concrete types, or None."""
    rule = _RULES.get(node.op)
    if rule is None:
        return None
    try:
        return rule(node)
    except (ImportError, KeyError, TypeError, ValueError):   # no numba, odd attributes
        return None


def out_matmul(node):
    """np.matmul itself for a 2-d @ 2-d product into a planned buffer (the general
    out-variant first tests for a batch of products), unless the kernel choice
    (backends/choice.py) runs this class elsewhere: the general out-variant asks it."""
    if node.op == "matmul" and all(len(v.shape) == 2 for v in node.inputs):
        if _chosen_elsewhere(node):
            return None
        return np.matmul
    return None


def _chosen_elsewhere(node) -> bool:
    from ..ops.registry import OPS
    pick = getattr(OPS["matmul"].kernel, "pick", None)
    if pick is None:
        return False
    try:
        arrays = tuple(np.zeros(v.shape, v.dtype) for v in node.inputs)
    except TypeError:          # a symbolic dimension: the general variant decides per call
        return True
    return pick(arrays) is not None
