"""`unfuse`: replace every `fused` node by the nodes of its body (op-table kernels only).

A saved program is fused when it is saved; the Predictor puts this pass first in its list
where generated kernels must not run or would hide the ops another pass rewrites: the
numpy and onnxruntime runtimes, `set_precision("bf16")` (the `amp` pass places casts
between op-table nodes) and onnxruntime offload (a fused node with one op onnxruntime
lacks would keep all of its ops out; `fuse_elementwise` after it fuses what stays sampan).
A graph without fused nodes is left as it is.

Example: ``g2 = PassManager(["unfuse"]).run(g)`` runs under the numpy runtime without numba.
"""
from __future__ import annotations

from ..ops.fused import body_attrs
from .manager import PassError, register_pass


@register_pass("unfuse", blocks=True)
def unfuse(g):
    """Expand every fused node into the op-table nodes of its body."""
    new_nodes, rep = [], {}
    for n in list(g.nodes):
        n.inputs = [rep.get(v.id, v) for v in n.inputs]
        if n.op != "fused":
            new_nodes.append(n)
            continue
        vals = list(n.inputs)
        for e in n.attrs["body"]:
            made = g.add_node(e[0], [vals[i] for i in e[1]], body_attrs(e), loc=n.loc)
            g.nodes.pop()                  # placed where the fused node was, below
            new_nodes.append(made)
            vals.append(made.outputs[0])
        for out, k in zip(n.outputs, n.attrs["outputs"]):
            r = vals[k]
            if (tuple(r.shape), r.dtype) != (tuple(out.shape), out.dtype):
                raise PassError(f"unfuse: body result {k} of the fused node at "
                                f"{n.loc or '?'} is {r.type_str()}, the node says "
                                f"{out.type_str()}")
            rep[out.id] = r
    g.nodes = new_nodes
    g.outputs = [rep.get(v.id, v) for v in g.outputs]
    return g
