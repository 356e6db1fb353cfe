"""Dead-code elimination: drop nodes whose results nothing reads (ops are pure)."""
from __future__ import annotations

from .manager import register_pass


@register_pass("dce")
def dce(g):
    """Remove nodes none of whose outputs is used, and unused constants."""
    live = {v.id for v in g.outputs}
    kept = []
    for n in reversed(g.nodes):
        if any(v.id in live for v in n.outputs):
            kept.append(n)
            live.update(v.id for v in n.inputs)
    g.nodes = kept[::-1]
    g.prune_consts()
    return g
