"""`quantize`: put quantise/dequantise (QDQ) nodes around every matmul and conv2d with a
constant float32 weight, as ONNX's QDQ format does.

The weight becomes an int8 constant (symmetric, one scale per output channel: the columns
of a matmul weight, dim 0 of a conv weight) read through a `dequantize` node; the
activation input, when the pass's `acts` option has calibrated parameters for it (value
id -> (scale, zero point), `sampan.quant.calibrate`), passes through `quantize` then
`dequantize` with them. `calibrate` (a callable, graph -> such a dict) computes them on
the graph as the pass sees it, wherever it sits in a pipeline (the Predictor's
`set_precision("int8")` sets it). `weight_only=True` leaves activations in float. The
graph still computes in float32 (with int8 rounding): `fuse_quant` then turns each QDQ
group into one int8 op. A graph that is int8 already is left as it is.

The rewrite's own rules live here, below `sampan.quant` (which re-exports them): which
nodes are quantised (`anchors`) and how a weight is (`weight_qparams`, `quantize_weight`).
Options given the old way, in `graph.meta["quant"]`, are still read (deprecated).

Example::

    >>> opts = {"quantize": {"acts": cal.acts}}
    >>> g2 = PassManager(["quantize", "fuse_quant", "dce"], options=opts).run(g)
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


INT8_OPS = ("qmatmul", "qconv2d", "qlinear_matmul", "qlinear_conv", "matmul_integer",
            "conv_integer", "dequantize", "qlinear_dense", "qdense", "qlinear_conv2d",
            "qdense_dynamic")


def is_quantized(g) -> bool:
    """Whether `g` computes in int8 already (written by `sampan.quant`, or ONNX QDQ)."""
    return any(n.op in INT8_OPS for n in g.nodes)


def anchors(g):
    """The matmul / conv2d nodes of `g` that quantisation rewrites, with the axis of their
    constant float weight that holds the output channels."""
    out = []
    for n in g.nodes:
        if n.op not in ("matmul", "conv2d") or len(n.inputs) != 2:
            continue
        x, w = n.inputs
        if not w.is_const or x.is_const or x.dtype != np.float32 or w.dtype != np.float32:
            continue
        if n.op == "matmul" and w.ndim == 2 and x.ndim == 2:
            out.append((n, 1))
        elif n.op == "conv2d" and w.ndim == 4:
            out.append((n, 0))
    return out


def weight_qparams(w, axis):
    """Per-channel symmetric int8 parameters of weight `w` along `axis`: scale
    max|w| / 127 per channel (1 where a channel is all zeros), zero points 0."""
    w = np.asarray(w, np.float32)
    red = tuple(d for d in range(w.ndim) if d != axis)
    m = np.abs(w).max(axis=red) if w.size else np.zeros(w.shape[axis], np.float32)
    scale = np.where(m > 0, m / 127.0, 1.0).astype(np.float32)
    return scale, np.zeros(scale.shape, np.int8)


def quantize_weight(w, axis):
    """(int8 weight, scale, zero point): `w` per channel along `axis`, symmetric."""
    from ..ops import _qref as K
    scale, zp = weight_qparams(w, axis)
    q = K.quantize(np.asarray(w, np.float32), scale, zp, axis, -127, 127, np.int8)
    return q, scale, zp


@register_pass("quantize", options={"acts": None, "calibrate": None, "weight_only": False,
                                    "dynamic": False},
               legacy_meta="quant")
def quantize(g, acts=None, calibrate=None, weight_only=False, dynamic=False):
    """Insert QDQ nodes around matmul/conv2d: int8 weights, calibrated int8 activations.

    Weights per channel; activations per tensor, by the `acts` option or what
    `calibrate(graph)` gives; `weight_only` leaves activations in float; `dynamic`
    (no calibration) makes each 2-d matmul with a constant weight one `qdense_dynamic`
    (int8 weight, activations quantised per row when it runs)."""
    g.meta.pop("quant", None)
    if is_quantized(g):
        return g
    if dynamic:
        return quantize_dynamic(g)
    if acts is None and calibrate is None and not weight_only:
        return g            # nothing to quantise with
    weight_only = bool(weight_only)
    if acts is None and calibrate is not None and not weight_only:
        acts = calibrate(g)
    acts = acts or {}
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
    g.meta["quantized"] = "weight_only" if weight_only else "qdq"
    g.prune_consts()
    return g


def quantize_dynamic(g):
    """Dynamic quantisation (as onnxruntime's quantize_dynamic, with per-row activation
    scales): every 2-d matmul of a float32 activation by a constant float32 weight
    becomes `qdense_dynamic(x, Wq^T, sw)`, the weight int8 per output channel (stored
    (N, K)); the activations are quantised inside the kernel, row by row. A constant
    bias added to the result moves into the node (`_absorb_bias`), and nodes reading one
    activation share its quantisation (`_share_rows`)."""
    wcache = {}
    done = False
    for n, axis in anchors(g):
        if n.op != "matmul":
            continue
        x, w = n.inputs
        if w.id not in wcache:
            wq, ws, _ = quantize_weight(w.const, axis)
            name = f"{w.name}.int8.T" if w.name else None
            wcache[w.id] = (g.add_const(np.ascontiguousarray(wq.T), name=name),
                            g.add_const(ws))
        n.op = "qdense_dynamic"
        n.inputs = [x, *wcache[w.id]]
        n.attrs = {}
        done = True
    if done and not any(n.blocks for n in g.nodes):   # uses read at the top level only
        _absorb_bias(g)
        _share_rows(g)
        g.meta["quantized"] = "dynamic"
        g.prune_consts()
    return g


def _absorb_bias(g):
    """`add(qdense_dynamic(x, w, s), b)`, b a float32 constant (N,) and the add the only
    reader, becomes `qdense_dynamic(x, w, s, b)`: the kernel adds it as it writes each
    output (the same float32 add), one pass over the output fewer."""
    users = g.users()
    outs = {v.id for v in g.outputs}
    drop = set()
    for n in g.nodes:
        if n.op != "qdense_dynamic" or len(n.inputs) != 3:
            continue
        y = n.outputs[0]
        us = users.get(y.id, [])
        if len(us) != 1 or y.id in outs:
            continue
        a = us[0]
        if a.op != "add" or len(a.inputs) != 2 or a.attrs or a.blocks:
            continue
        b = a.inputs[1] if a.inputs[0] is y else a.inputs[0]
        if (b is y or not b.is_const or b.dtype != np.float32
                or tuple(b.shape) != (int(n.inputs[1].shape[0]),)
                or tuple(a.outputs[0].shape) != tuple(y.shape)
                or a.outputs[0].dtype != np.float32):
            continue
        n.inputs = n.inputs + [b]
        g.replace_all_uses_with(a.outputs[0], y)
        drop.add(id(a))
    if drop:
        g.nodes = [n for n in g.nodes if id(n) not in drop]


def _share_rows(g):
    """The `qdense_dynamic` nodes reading one activation (an attention's query, key and
    value projections) become one node over their weights stacked along N, and a column
    slice (`getitem`) for each: the rows are quantised once, not once per projection, and
    the GEMM is wider. Each output column is the same sum, scaled the same way, so every
    number stays what it was."""
    groups = {}
    for n in g.nodes:
        if n.op == "qdense_dynamic" and all(v.is_const for v in n.inputs[1:]):
            groups.setdefault((n.inputs[0].id, len(n.inputs)), []).append(n)
    merged = {}     # id(first node of a group) -> the nodes replacing it; the others -> []
    rename = {}
    for nodes in groups.values():
        if len(nodes) < 2:
            continue
        x = nodes[0].inputs[0]
        w = np.concatenate([n.inputs[1].const for n in nodes], 0)
        ws = np.concatenate([n.inputs[2].const for n in nodes], 0)
        names = [n.inputs[1].name for n in nodes]
        name = "+".join(names) if all(names) else None
        first = nodes[0]
        ins = [x, g.add_const(w, name=name), g.add_const(ws)]
        if len(first.inputs) > 3:
            ins.append(g.add_const(np.concatenate([n.inputs[3].const for n in nodes], 0)))
        m = Node("qdense_dynamic", ins, {}, first.loc)
        m.outputs.append(Value(g._new_id(), (x.shape[0], int(w.shape[0])), np.float32,
                               node=m))
        new, off = [m], 0
        for n in nodes:
            width = int(n.inputs[1].shape[0])
            sl = Node("getitem", [m.outputs[0]],
                      {"index": (("s", None, None, None), ("s", off, off + width, None))},
                      n.loc)
            sl.outputs.append(Value(g._new_id(), n.outputs[0].shape, np.float32, node=sl))
            rename[n.outputs[0].id] = sl.outputs[0]
            new.append(sl)
            off += width
            merged[id(n)] = []
        merged[id(first)] = new
    if merged:
        g.splice(merged, rename)
