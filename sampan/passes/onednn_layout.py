"""`onednn_layout`: connected float32 convolutions and their epilogues become one `engine`
node (engine="onednn") that runs them in oneDNN's blocked layouts.

oneDNN's float32 convolutions are about twice as fast in the layouts they pick (nChw16c
on AVX-512) as on plain NCHW; a reorder at every convolution would spend that. So the
pass finds the nodes that can run as oneDNN convolution primitives with post-ops:

1. candidates: `conv2d` of a float32 NCHW tensor by a constant weight, the
   elementwise nodes (add, sub, mul, div, relu, tanh, sigmoid, or a `fused` node of
   those) that may be a convolution's epilogue (bias, residual add, ReLU, SiLU ...),
   and what runs in the blocked layouts between convolutions: `max_pool2d` (with the
   -inf `pad` before it as its padding), channel slices (`getitem` at multiples of 16
   channels: views, no copy), channel `concat`, a squeeze-excite block's `mean`
   over height and width and its per-channel `mul`, and a nearest upsample (two
   `index_select`s of repeated rows and columns);
2. groups: candidates joined along producer -> consumer edges, merged only where the
   graph of groups stays acyclic (the partition `onnxruntime_offload` uses);
3. each group's body is planned as oneDNN units (`sampan.backends.onednn.blocked.plan`):
   a node the planner cannot express (an epilogue on no convolution, an op with no
   post-op form) leaves its group, and the groups are formed again;
4. each group of at least `min_convs` convolutions becomes one engine node: its nodes as
   plain data in `body`, its weights as inputs read from the graph's constants.

The onednn provider binds the node (`blocked.Region`: primitives, weight reorders and
buffers made once per shape; reorders only at the region's plain inputs and outputs).
Where the provider is not in the list, the same body runs in onnxruntime.

Options: `min_convs` (default 1: one convolution with its reorders is still faster
here), `min_mflops` (default 2: the region's convolutions per image; a smaller one stays
with the op table's kernels), `providers` (the Predictor's list: the pass does nothing
without "onednn" in it).
The pass does nothing where oneDNN does not load. Its report is
`graph.meta["onednn_layout_report"]`: (node line, "region k" or why it stayed).

Example::

    >>> g2 = PassManager(["fuse_elementwise", "onednn_layout"]).run(g)
    >>> [n.attrs.get("engine") for n in g2.nodes if n.op == "engine"]
"""
from __future__ import annotations

import numpy as np

from ..ir.text import node_str
from .manager import PassError, register_pass
from .offload import _engine_node, _order, group_body, partition

REPORT = "onednn_layout_report"
# a region smaller than this (MFLOP per image) stays with the op-table kernels: oneDNN's
# call and reorder costs (~10 us a primitive) lose to numba's direct loops on LeNet-sized
# layers (conv 1->6 5x5 on 28x28: 0.17 MFLOP in 6 us)
MIN_MFLOPS = 2.0
F32 = np.dtype(np.float32)
_ELEMENTWISE = ("add", "sub", "mul", "div", "relu", "tanh", "sigmoid")


@register_pass("onednn_layout", options={"min_convs": 1, "min_mflops": MIN_MFLOPS,
                                         "providers": None})
def onednn_layout(g, min_convs=1, min_mflops=MIN_MFLOPS, providers=None):
    """Run connected float32 convolutions and their epilogues in oneDNN's layouts."""
    if isinstance(min_convs, bool) or not isinstance(min_convs, int) or min_convs < 1:
        raise PassError(f"onednn_layout: min_convs must be a positive int; got {min_convs!r}")
    if isinstance(min_mflops, bool) or not isinstance(min_mflops, (int, float)) \
            or min_mflops < 0:
        raise PassError(f"onednn_layout: min_mflops must be a number >= 0; got "
                        f"{min_mflops!r}")
    if providers is not None and "onednn" not in providers:
        return g
    from ..backends import onednn
    if not onednn.available() or not any(n.op == "conv2d" for n in g.nodes):
        return g
    from ..backends.onednn.plan import PlanError, plan
    lines = [node_str(n) for n in g.nodes]
    ok = [_candidate(n) for n in g.nodes]
    why = [None if k else "not a float32 conv2d or conv epilogue" for k in ok]
    for _ in range(len(g.nodes) + 1):
        groups = [grp for grp in partition(g, ok)
                  if any(g.nodes[i].op == "conv2d" for i in grp)]
        for i, k in enumerate(ok):          # candidates left alone: no conv to join
            if k and not any(i in grp for grp in groups):
                ok[i], why[i] = False, "an epilogue next to no convolution"
        failed = False
        for grp in groups:
            body, consts, outputs, shapes = _body(g, grp)
            try:
                plan(body, consts, outputs, shapes)
            except PlanError as e:
                bad = grp if e.entry is None else [grp[e.entry]]
                for i in bad:
                    ok[i], why[i] = False, str(e)
                failed = True
                break
        if not failed:
            break
    else:
        raise PassError("onednn_layout: planning did not settle; this is a bug")
    keep = [grp for grp in groups
            if sum(g.nodes[i].op == "conv2d" for i in grp) >= min_convs
            and sum(_mflops(g.nodes[i]) for i in grp) >= min_mflops]
    replaced = {}
    report = list(why)
    for k, grp in enumerate(keep):
        node = _engine_node(g, grp, "onednn", k)
        for i in grp:
            replaced[i] = node
            report[i] = f"region {k}"
    for grp in groups:
        if grp not in keep:
            for i in grp:
                report[i] = (f"a region of fewer than min_convs={min_convs} convolutions "
                             f"or min_mflops={min_mflops} MFLOP per image")
    if keep:
        g.nodes = _order(g, replaced)
    g.meta[REPORT] = list(zip(lines, report))
    return g


def _mflops(n) -> float:
    """A conv2d node's MFLOP per image (inf where the output's size is symbolic)."""
    if n.op != "conv2d":
        return 0.0
    o, cg, kh, kw = n.inputs[1].shape
    ho, wo = n.outputs[0].shape[2:]
    if not (isinstance(ho, int) and isinstance(wo, int)):
        return float("inf")
    return 2.0 * o * cg * kh * kw * ho * wo / 1e6


def _f32_nchw(v) -> bool:
    return v.dtype == F32 and len(v.shape) == 4 and isinstance(v.shape[1], int)


def _candidate(n) -> bool:
    if len(n.outputs) != 1 or not _f32_nchw(n.outputs[0]):
        return False
    if n.op == "conv2d":
        x, w = n.inputs[0], n.inputs[1]
        return (len(n.inputs) == 2 and w.is_const and not x.is_const and _f32_nchw(x)
                and w.dtype == F32 and all(isinstance(d, int) for d in w.shape))
    if n.op == "index_select":             # a nearest upsample's rows or columns
        from ..backends.onednn.plan import nearest_factor
        x, idx = n.inputs[0], n.inputs[-1]
        axis = n.attrs.get("axis")
        return (len(n.inputs) == 2 and idx.is_const and not x.is_const and _f32_nchw(x)
                and isinstance(axis, int) and axis % 4 in (2, 3)
                and isinstance(x.shape[axis % 4], int)
                and nearest_factor(idx.const, x.shape[axis % 4]) is not None)
    if n.op == "mean":                     # global average pooling (squeeze-excite)
        return (_f32_nchw(n.inputs[0]) and bool(n.attrs.get("keepdims"))
                and tuple(a % 4 for a in n.attrs.get("axis", ())) == (2, 3))
    if n.op in ("pad", "max_pool2d", "getitem", "concat"):
        from ..backends.onednn.plan import ALIGN, channel_slice, neg_inf_pad
        x = n.inputs[0]
        if not all(_f32_nchw(v) for v in n.inputs):
            return False
        if n.op == "pad":
            return neg_inf_pad(n.attrs)
        if n.op == "max_pool2d":
            return not n.attrs.get("ceil_mode") and tuple(n.attrs.get("dilation", (1, 1))) \
                == (1, 1)
        if n.op == "getitem":
            cs = channel_slice(n.attrs.get("index", ()), tuple(x.shape))
            return len(n.inputs) == 1 and cs is not None and not (cs[0] % ALIGN
                                                                   or cs[1] % ALIGN)
        return n.attrs.get("axis") in (1, -3)
    if n.op == "fused":
        body = n.attrs.get("body", ())
        return len(n.attrs.get("outputs", ())) == 1 and all(
            e[0] in _ELEMENTWISE + ("lt", "gt", "where") for e in body)   # clip, hardswish
    return n.op in _ELEMENTWISE


def _dims_key(g):
    """shape -> a tuple where a symbolic dim is its values at two sets of sizes, so that two
    spellings of one size ('(h-1)//2+1-1+1', '(h-1)//2+1') compare equal (the planner
    compares the shapes of residual terms)."""
    from ..ir import symbolic as _sym
    syms = sorted(_sym.symbols_of(g))
    envs = [{s: 61 + 7 * i for i, s in enumerate(syms)},
            {s: 113 + 11 * i for i, s in enumerate(syms)}]

    def key(shape):
        out = []
        for d in shape:
            if isinstance(d, int):
                out.append(d)
                continue
            try:
                out.append(("sym",) + tuple(_sym.size_at(d, e) for e in envs))
            except Exception:  # noqa: BLE001 - a dim it cannot evaluate stays as written
                out.append(d)
        return tuple(out)
    return key


def _body(g, grp):
    """(body, per input its constant or None, outputs, shapes) of group `grp`, indexed as
    `offload._engine_node` indexes the engine node it makes."""
    members, inputs, body, outs, index = group_body(g, grp)
    same = _dims_key(g)
    shapes = {i: same(v.shape) for i, v in enumerate(inputs)}
    shapes.update({index[v.id]: same(v.shape) for n in members for v in n.outputs})
    consts = [v.const if v.is_const else None for v in inputs]
    return body, consts, tuple(index[v.id] for v in outs), shapes
