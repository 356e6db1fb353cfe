"""Algebraic simplification: x*1, 1*x, x/1, x+0, 0+x, x-0, cast to the same dtype,
a round trip through a wider float (bfloat16 -> float32 -> bfloat16: autocast's),
reshape/expand to the same shape, reshape chains, permute chains (double transpose).

An identity is applied only when the result has exactly x's shape and dtype, so
broadcasting and promotion never change."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from .manager import register_pass


_F16, _BF16 = np.dtype(np.float16), _dt.bfloat16
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
_WIDER = {(_BF16, _F32), (_BF16, _F64), (_F16, _F32), (_F16, _F64), (_F32, _F64)}


def _all(v, x):
    return v.is_const and v.const.size > 0 and bool(np.all(v.const == x))


@register_pass("simplify", blocks=True)
def simplify(g):
    """Rewrite algebraic identities away (see module doc)."""
    rep = {}
    nodes = []
    for n in g.nodes:
        n.inputs = [rep.get(v.id, v) for v in n.inputs]
        out = n.outputs[0]
        new = _rewrite(g, n)
        if new is not None and new is not out:
            if new.shape == out.shape and new.dtype == out.dtype:
                rep[out.id] = new
                continue
        nodes.append(n)
    g.nodes = nodes
    g.outputs = [rep.get(v.id, v) for v in g.outputs]
    return g


def _rewrite(g, n):
    op, ins, a = n.op, n.inputs, n.attrs
    if op == "mul":
        if _all(ins[1], 1):
            return ins[0]
        if _all(ins[0], 1):
            return ins[1]
    elif op == "div" and _all(ins[1], 1):
        return ins[0]
    elif op == "add":
        if _all(ins[1], 0):
            return ins[0]
        if _all(ins[0], 0):
            return ins[1]
    elif op == "sub" and _all(ins[1], 0):
        return ins[0]
    elif op == "cast" and ins[0].dtype == n.outputs[0].dtype:
        return ins[0]
    elif op == "cast" and ins[0].node is not None and ins[0].node.op == "cast":
        x = ins[0].node.inputs[0]     # cast(cast(x, wide), x.dtype) with wide exact for x
        if x.dtype == n.outputs[0].dtype and (x.dtype, ins[0].dtype) in _WIDER:
            return x
    elif op in ("reshape", "expand") and tuple(ins[0].shape) == tuple(a["shape"]):
        return ins[0]
    elif op == "reshape":
        src = ins[0].node
        if src is not None and src.op == "reshape":
            if tuple(src.inputs[0].shape) == tuple(a["shape"]):
                return src.inputs[0]
            n.inputs = [src.inputs[0]]          # reshape(reshape(x)) -> reshape(x)
    elif op == "permute":
        dims = tuple(a["dims"])
        if dims == tuple(range(len(dims))):
            return ins[0]
        src = ins[0].node
        if src is not None and src.op == "permute":
            inner = tuple(src.attrs["dims"])
            composed = tuple(inner[d] for d in dims)
            if composed == tuple(range(len(composed))):
                return src.inputs[0]            # double transpose
            n.inputs = [src.inputs[0]]
            n.attrs = {"dims": composed}
    return None
