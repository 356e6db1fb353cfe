"""Helpers for the blocks of control-flow nodes (`Node.blocks`) that passes share.

`inline(g, block, args)` copies a block's constants and nodes into graph `g`, reading
`args` where the block reads its inputs (constant folding inlines the branch a constant
predicate takes); `loop_body(node)` names the block of a loop node that runs once per
iteration and how many of its inputs are loop-carried (loop-invariant code motion and
the memory plan read it).
"""
from __future__ import annotations

from .graph import Node, Value

# per loop op: (index of the body block, blocks sharing the node's inputs)
LOOPS = {"while_loop": 1, "scan": 0}


def inline(g, block, args):
    """New nodes (not yet placed in `g.nodes`) computing `block` on Values `args` of `g`,
    and the Values of `g` standing for the block's outputs. Constants are added to `g`."""
    m = {v.id: a for v, a in zip(block.inputs, args)}
    for c in block.consts:
        m[c.id] = g.add_const(c.const, name=c.name)
    nodes = []
    for n in block.nodes:
        nn = Node(n.op, [m[v.id] for v in n.inputs], n.attrs, n.loc,
                  [b.copy() for b in n.blocks])
        nn.meta = dict(n.meta)
        for v in n.outputs:
            m[v.id] = nv = Value(g._new_id(), v.shape, v.dtype, node=nn, index=v.index)
            nn.outputs.append(nv)
        nodes.append(nn)
    return nodes, [m[v.id] for v in block.outputs]


def loop_varying(node) -> int:
    """How many leading inputs of loop node `node` change per iteration (the carry, and
    for a scan the slices of xs); the rest are captures, the same every iteration."""
    if node.op == "while_loop":
        return node.attrs["n_carry"]
    return node.attrs["n_carry"] + node.attrs["n_xs"]


def captures_start(node) -> int:
    """The position of the first captured input of control node `node` (those after the
    user's operands, carry and xs); block input `j` reads node input `j + offset(node)`."""
    a = node.attrs
    if node.op == "cond":
        return 1 + a["n_operands"]
    return loop_varying(node)


def offset(node) -> int:
    """Node input position minus block input position (a cond's predicate is no block
    input)."""
    return 1 if node.op == "cond" else 0


def drop_unused_captures(node) -> bool:
    """Remove the captured inputs none of `node`'s blocks reads (from the node and every
    block); whether any went."""
    start, off = captures_start(node), offset(node)
    used = set()
    for b in node.blocks:
        used |= {id(v) for m in b.nodes for v in m.inputs} | {id(v) for v in b.outputs}
    keep = [j for j in range(start - off, len(node.blocks[0].inputs))
            if any(id(b.inputs[j]) in used for b in node.blocks)]
    if len(keep) == len(node.blocks[0].inputs) - (start - off):
        return False
    node.inputs = node.inputs[:start] + [node.inputs[j + off] for j in keep]
    for b in node.blocks:
        b.inputs = b.inputs[:start - off] + [b.inputs[j] for j in keep]
    return True
