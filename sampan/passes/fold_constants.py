"""Constant folding: run nodes whose inputs are all constants at compile time; a `cond`
whose predicate is a constant is replaced by the nodes of the branch it takes.

Nullary fills (`full`, `arange`) are folded only when small, so a graph does not
trade a cheap fill for a large stored array."""
from __future__ import annotations

import numpy as np

from ..ir.blocks import inline
from ..ir.symbolic import is_attr
from ..ir.symint import SymFloat, SymInt
from ..ops.registry import OPS
from .manager import register_pass

SMALL = 4096


@register_pass("fold_constants", blocks=True)
def fold_constants(g):
    """Replace all-constant nodes by their computed values."""
    rep = {}

    def r(v):          # an inlined branch's output may itself fold later: follow chains
        while v.id in rep:
            v = rep[v.id]
        return v
    nodes = []
    work = g.nodes[::-1]
    while work:
        n = work.pop()
        n.inputs = [r(v) for v in n.inputs]
        op = OPS[n.op]
        if n.op == "cond" and n.inputs[0].is_const:   # the branch it takes, inlined
            made, outs = inline(g, n.blocks[0 if bool(n.inputs[0].const) else 1],
                                n.inputs[1:])
            work.extend(made[::-1])
            for v, w in zip(n.outputs, outs):
                rep[v.id] = w
            continue
        limit = max([SMALL] + [v.size for v in n.inputs]) if n.inputs else 64
        if (op.random or op.n_out != 1 or not all(v.is_const for v in n.inputs)
                or not all(type(d) is int for d in n.outputs[0].shape)  # symbolic dims
                or _symbolic(n.attrs)
                or n.outputs[0].size > limit or op.kernel is None):
            nodes.append(n)
            continue
        out = np.asarray(op.kernel(*[v.const for v in n.inputs], **n.attrs))
        v = n.outputs[0]
        if out.shape != v.shape or out.dtype != v.dtype:
            nodes.append(n)
            continue
        if out.base is not None or any(out is c.const for c in n.inputs):
            out = out.copy()
        rep[v.id] = g.add_const(out)
    g.nodes = nodes
    g.outputs = [r(v) for v in g.outputs]
    g.prune_consts()
    return g


def _symbolic(x) -> bool:
    """Whether attributes hold a symbolic size ("$batch": see sampan/jit/dynamic.py; or,
    in a graph being traced with dynamic dims, a SymInt: sampan/ir/symbolic.py)."""
    if isinstance(x, (SymInt, SymFloat)):
        return True
    if isinstance(x, str):
        return is_attr(x)
    if isinstance(x, dict):
        return any(_symbolic(v) for v in x.values())
    if isinstance(x, (tuple, list)):
        return any(_symbolic(v) for v in x)
    return False
