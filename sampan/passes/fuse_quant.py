"""`fuse_quant`: turn each QDQ group around a matmul or conv2d into one int8 op.

    matmul(dequantize(quantize(x, sx, zx)), dequantize(Wq, sw, zw, axis=1))
        -> qmatmul(quantize(x, sx, zx), Wq^T, sx, zx, sw, zw, transposed=True)
    conv2d(dequantize(quantize(x, ...)), dequantize(Wq, sw, zw, axis=0), **attrs)
        -> qconv2d(quantize(x, ...), Wq, sx, zx, sw, zw, **attrs)

Both accumulate int8 x int8 in int32 and give float32 (sx * sw per output channel), so
the bias, activation and next layer's quantize that follow read the same values as
before: the rewrite is exact against the QDQ graph up to float32 summation order. The
matmul's weight is stored transposed, (N, K), the layout the int8 GEMM reads. The
dequantize nodes left unread are removed by `dce`.

Example: ``PassManager(["quantize", "fuse_quant", "dce"]).run(g)``
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Node, Value
from .manager import register_pass


def _producer(v, op):
    n = v.node
    return n if n is not None and n.op == op else None


def _const_qdq(v, axis):
    """(Wq, sw, zw) when v = dequantize(const int8 Wq, const sw, const zw, axis)."""
    dq = _producer(v, "dequantize")
    if dq is None or dq.attrs.get("axis", 1) % max(v.ndim, 1) != axis:
        return None
    if not all(u.is_const for u in dq.inputs) or dq.inputs[0].dtype != np.int8:
        return None
    return dq.inputs


def _act_qdq(v):
    """(q, sx, zx) when v = dequantize(q = quantize(x, sx, zx), sx, zx), per tensor."""
    dq = _producer(v, "dequantize")
    if dq is None:
        return None
    q = _producer(dq.inputs[0], "quantize")
    if q is None or dq.inputs[1].ndim or dq.inputs[2].ndim:
        return None
    if q.inputs[1] is not dq.inputs[1] or q.inputs[2] is not dq.inputs[2]:
        return None
    return dq.inputs[0], dq.inputs[1], dq.inputs[2]


@register_pass("fuse_quant")
def fuse_quant(g):
    """Replace QDQ around matmul/conv2d by int8 ops (qmatmul, qconv2d)."""
    transposed = {}
    rep = {}
    for i, n in enumerate(g.nodes):
        if n.op not in ("matmul", "conv2d") or len(n.inputs) != 2:
            continue
        axis = 1 if n.op == "matmul" else 0
        a, w = _act_qdq(n.inputs[0]), _const_qdq(n.inputs[1], axis)
        if a is None or w is None:
            continue
        q, sx, zx = a
        wq, sw, zw = w
        if n.op == "matmul":
            if n.inputs[0].ndim != 2 or wq.ndim != 2:
                continue
            if wq.id not in transposed:
                transposed[wq.id] = g.add_const(np.ascontiguousarray(wq.const.T),
                                                name=f"{wq.name}.T" if wq.name else None)
            new = Node("qmatmul", [q, transposed[wq.id], sx, zx, sw, zw],
                       {"transposed": True}, n.loc)
        else:
            new = Node("qconv2d", [q, wq, sx, zx, sw, zw], dict(n.attrs), n.loc)
        out = n.outputs[0]
        new.outputs.append(Value(out.id, out.shape, out.dtype, node=new))
        rep[i] = new
    if not rep:
        return g
    g.nodes = [rep.get(i, n) for i, n in enumerate(g.nodes)]
    ids = {n.outputs[0].id: n.outputs[0] for n in rep.values()}
    for n in g.nodes:
        n.inputs = [ids.get(v.id, v) if v.node is not None and v.id in ids else v
                    for v in n.inputs]
    g.outputs = [ids.get(v.id, v) for v in g.outputs]
    g.meta["quantized"] = "int8"
    return g
