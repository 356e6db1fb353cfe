"""Common-subexpression elimination: one node per (op, inputs, attributes, blocks), one
constant per (dtype, shape, bytes). Random ops are keyed by their key input, so two
draws with the same key are the same numbers and merging them is exact."""
from __future__ import annotations

from ..ir.text import fmt_lit
from .manager import register_pass


@register_pass("cse", blocks=True)
def cse(g):
    """Merge identical nodes and identical constants."""
    rep = {}
    seen_c = {}
    consts = []
    for c in g.consts:
        k = (c.dtype.str, c.shape, c.const.tobytes()) if c.const.nbytes <= 1 << 16 else id(c)
        if k in seen_c:
            rep[c.id] = seen_c[k]
        else:
            seen_c[k] = c
            consts.append(c)
    g.consts = consts
    seen = {}
    nodes = []
    for n in g.nodes:
        n.inputs = [rep.get(v.id, v) for v in n.inputs]
        key = (n.op, tuple(v.id for v in n.inputs), fmt_lit(tuple(sorted(n.attrs.items()))),
               tuple(b._canon() for b in n.blocks))      # control flow: its blocks too
        prev = seen.get(key)
        if prev is not None:
            for a, b in zip(n.outputs, prev.outputs):
                rep[a.id] = b
            continue
        seen[key] = n
        nodes.append(n)
    g.nodes = nodes
    g.outputs = [rep.get(v.id, v) for v in g.outputs]
    return g
