"""`licm`: loop-invariant code motion out of `while_loop` and `scan` blocks.

A node of a loop's block whose inputs are all the same at every iteration (captures,
constants, or results of nodes already hoisted) computes the same value every time: it
moves before the loop node, and its results enter the blocks as new captures (one more
input of the node, and of each of its blocks, at the end). Random ops never move (a
block holds none). Nested loops are handled inside out: the pass runs on the blocks
first (`register_pass(..., blocks=True)`), so an invariant of an inner loop that is also
invariant in the outer one leaves both.

Example: in ``scan(lambda h, x: (h @ w.T + x, ...), h0, xs)``, ``w.T`` is computed once.
"""
from __future__ import annotations

from ..ir.blocks import loop_varying
from ..ir.graph import Node, Value
from ..ops.registry import OPS
from .manager import register_pass


@register_pass("licm", blocks=True)
def licm(g):
    """Hoist loop-invariant nodes out of while_loop/scan blocks."""
    if not any(n.op in ("while_loop", "scan") for n in g.nodes):
        return g
    nodes = []
    for n in g.nodes:
        if n.op in ("while_loop", "scan"):
            for b in list(n.blocks):
                nodes.extend(_hoist(g, n, b))
        nodes.append(n)
    g.nodes = nodes
    return g


def _hoist(g, n, b):
    """Move the invariant nodes of block `b` of loop node `n` out; returns the new nodes
    of `g` (to place before `n`)."""
    k = loop_varying(n)
    outer = {id(v): x for v, x in zip(b.inputs[k:], n.inputs[k:])}   # captures
    consts = {}
    moved, kept = [], []
    for m in b.nodes:
        ok = not OPS[m.op].random and all(id(v) in outer or v.is_const for v in m.inputs)
        if not ok:
            kept.append(m)
            continue
        ins = []
        for v in m.inputs:
            if id(v) in outer:
                ins.append(outer[id(v)])
            else:
                c = consts.get(id(v))
                if c is None:
                    c = consts[id(v)] = g.add_const(v.const, name=v.name)
                ins.append(c)
        nn = Node(m.op, ins, m.attrs, m.loc, [x.copy() for x in m.blocks])
        nn.meta = dict(m.meta)
        for v in m.outputs:
            w = Value(g._new_id(), v.shape, v.dtype, node=nn, index=v.index)
            nn.outputs.append(w)
            outer[id(v)] = w
        moved.append((m, nn))
    if not moved:
        return []
    b.nodes = kept
    used = {id(v) for m in kept for v in m.inputs} | {id(v) for v in b.outputs}
    rep = {}
    for m, nn in moved:
        for v, w in zip(m.outputs, nn.outputs):
            if id(v) not in used:
                continue
            for blk in n.blocks:          # the blocks of a node share its inputs
                x = Value(blk._new_id(), v.shape, v.dtype)
                blk.inputs.append(x)
                if blk is b:
                    rep[id(v)] = x
            n.inputs.append(w)
    for m in kept:
        m.inputs = [rep.get(id(v), v) for v in m.inputs]
    b.outputs = [rep.get(id(v), v) for v in b.outputs]
    b.prune_consts()
    return [nn for _, nn in moved]
