"""`quantize`: put quantise/dequantise (QDQ) nodes around every matmul and conv2d with a
constant float32 weight, as ONNX's QDQ format does.

The weight becomes an int8 constant (symmetric, one scale per output channel: the columns
of a matmul weight, dim 0 of a conv weight) read through a `dequantize` node; the
activation input, when `graph.meta["quant"]["acts"]` has calibrated parameters for it
(`sampan.quant.calibrate`), passes through `quantize` then `dequantize` with them.
`graph.meta["quant"]["weight_only"]` leaves activations in float. The graph still computes
in float32 (with int8 rounding): `fuse_quant` then turns each QDQ group into one int8 op.

Example::

    >>> g.meta["quant"] = {"acts": cal.acts, "weight_only": False}
    >>> g2 = PassManager(["quantize", "fuse_quant", "dce"]).run(g)
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Node, Value
from .manager import register_pass


def _node(g, op, inputs, attrs, like, loc):
    n = Node(op, inputs, attrs, loc)
    n.outputs.append(Value(g._new_id(), like.shape, like.dtype if op != "quantize" else
                           inputs[2].dtype, node=n))
    return n


@register_pass("quantize")
def quantize(g):
    """Insert QDQ nodes around matmul/conv2d (int8 weights per channel, calibrated
    activations per tensor) from graph.meta['quant']."""
    from ..quant.calibrate import anchors
    from ..quant.observers import quantize_weight
    cfg = g.meta.get("quant")
    if not cfg:
        return g
    acts = cfg.get("acts") or {}
    weight_only = bool(cfg.get("weight_only"))
    done = {}           # activation value id -> its dequantised value (one QDQ per value)
    wcache = {}         # weight const id -> dequantised value
    new_nodes = {}      # id(anchor) -> nodes to insert before it
    for n, axis in anchors(g):
        x, w = n.inputs
        ins = []
        if not weight_only and x.id in acts:
            if x.id not in done:
                s, z = acts[x.id]
                sc = g.add_const(np.asarray(s, np.float32))
                zc = g.add_const(np.asarray(z, np.int8))
                q = _node(g, "quantize", [x, sc, zc], {"axis": 1}, x, n.loc)
                dq = _node(g, "dequantize", [q.outputs[0], sc, zc], {"axis": 1}, x, n.loc)
                ins += [q, dq]
                done[x.id] = dq.outputs[0]
            x = done[x.id]
        if w.id not in wcache:
            wq, ws, wz = quantize_weight(w.const, axis)
            name = f"{w.name}.int8" if w.name else None
            wqc = g.add_const(wq, name=name)
            dq = _node(g, "dequantize", [wqc, g.add_const(ws), g.add_const(wz)],
                       {"axis": axis}, w, n.loc)
            ins.append(dq)
            wcache[w.id] = dq.outputs[0]
        n.inputs = [x, wcache[w.id]]
        new_nodes[id(n)] = ins
    if not new_nodes:
        return g
    nodes = []
    for n in g.nodes:
        nodes.extend(new_nodes.get(id(n), ()))
        nodes.append(n)
    g.nodes = nodes
    g.meta.pop("quant", None)
    g.meta["quantized"] = "weight_only" if weight_only else "qdq"
    g.prune_consts()
    return g
