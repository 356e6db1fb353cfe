"""Dead-code elimination: drop nodes whose results nothing reads (ops are pure). In the
blocks of control-flow nodes too, and a captured input no block reads any more leaves
the node (so what computed it outside may go)."""
from __future__ import annotations

from ..ir.blocks import drop_unused_captures
from .manager import register_pass


@register_pass("dce", blocks=True)
def dce(g):
    """Remove nodes none of whose outputs is used, and unused constants."""
    live = {v.id for v in g.outputs}
    kept = []
    for n in reversed(g.nodes):
        if any(v.id in live for v in n.outputs):
            if n.blocks:
                drop_unused_captures(n)
            kept.append(n)
            live.update(v.id for v in n.inputs)
    g.nodes = kept[::-1]
    g.prune_consts()
    return g
