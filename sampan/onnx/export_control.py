"""Export of the control-flow nodes (issue 34): `cond` -> If, `while_loop` -> Loop,
`scan` -> Scan.

A sampan block reads nothing from the enclosing graph: what it needs is an input of the
node (operands, carry, slices, captures). An ONNX subgraph names the enclosing graph's
values directly (outer scope), so a block's operand and capture inputs are lowered as
the ONNX names of the node's inputs, and only what ONNX passes in (a Loop's iteration
number and condition, the carried values, a Scan's slices) are subgraph inputs.

- `cond(pred, *operands, *captures)` -> `If(pred)` (a numeric predicate is cast to bool:
  nonzero is true), both branches subgraphs without inputs.
- `while_loop(carry, captures)` -> `Loop(M, c0, *carry)`: M is `max_iterations` (absent
  without one), c0 the cond block lowered in the enclosing graph, and the body subgraph
  runs the body block and then the cond block on the new carry (its condition output):
  sampan checks the condition before every iteration, as ONNX's Loop does with its
  condition input and each iteration's condition output.
- `scan(carry, xs, captures)` -> `Scan(*carry, *xs)` with `num_scan_inputs`; `reverse`
  reverses every scan input and every scan output (sampan stacks ys in xs order), which
  onnxruntime runs as it is.

Every name is fresh across the model (ONNX forbids a subgraph reusing an outer name), and
the names a subgraph reads from the enclosing graph are recorded (`ctx.outer_reads`) so
the exporter's peephole and output renaming leave them be.
"""
from __future__ import annotations

import re

import numpy as np

from ..ops.registry import NO_ONNX, OPS, Spec
from .errors import OnnxError
from .lower.context import LOC

_SIG = re.compile(r"[^A-Za-z0-9_.:/-]")


def lower_control(ctx, n, ins):
    """The ONNX outputs of control-flow node `n` whose inputs are the ONNX names `ins`."""
    fn = {"cond": _cond, "while_loop": _while, "scan": _scan}.get(n.op)
    if fn is None:
        raise OnnxError(f"sampan.onnx.export: op {n.op!r} at {n.loc or '?'} holds blocks but "
                        "is not cond, while_loop or scan; it has no ONNX mapping")
    op, loc = ctx.op, ctx.loc
    try:
        outs = fn(ctx, n, list(ins))
    finally:
        ctx.op, ctx.loc = op, loc
    outs = [outs] if isinstance(outs, str) else list(outs)
    for o, v in zip(outs, n.outputs):
        ctx.specs[o] = Spec(v.shape, v.dtype)
    return outs


# ---------------------------------------------------------------------- graphs and blocks
def lower_nodes(ctx, g, names):
    """Lower the nodes of Graph `g` (a program or a block) into `ctx.nodes`; `names` maps
    value ids to ONNX names (its inputs' and constants' on entry, every output's after).
    A node holding blocks (cond, while_loop, scan) becomes If / Loop / Scan
    (`export_control.py`)."""
    for n in g.nodes:
        ctx.op, ctx.loc = n.op, n.loc
        if getattr(n, "blocks", None):
            outs = lower_control(ctx, n, [names[v.id] for v in n.inputs])
        else:
            op = OPS.get(n.op)
            fn = op.onnx if op is not None else None
            if fn is None or fn == NO_ONNX:
                raise OnnxError(f"sampan.onnx.export: op {n.op!r} at {n.loc or '?'} has no "
                                f"ONNX mapping (asked for opset {ctx.opset}); it cannot be "
                                "exported")
            outs = ctx.lower(n.op, [names[v.id] for v in n.inputs], n.attrs,
                             [Spec(v.shape, v.dtype) for v in n.outputs])
        if len(outs) < len(n.outputs):
            raise OnnxError(f"sampan.onnx.export: the lowering of {n.op!r} at {n.loc or '?'} "
                            f"gave {len(outs)} outputs; expected {len(n.outputs)}")
        for v, o in zip(n.outputs, outs):
            names[v.id] = o
            ctx.specs[o] = Spec(v.shape, v.dtype)


def node_protos(nodes, prefix=""):
    """NodeProtos of the lowered (op type, inputs, outputs, attrs) tuples (named
    `<prefix><type>_<k>`); a node's source line becomes its doc_string."""
    from onnx import helper
    out = []
    for k, (t, ins, outs, attrs) in enumerate(nodes):
        attrs = dict(attrs)
        loc = attrs.pop(LOC, None)
        out.append(helper.make_node(t, ins, outs, name=f"{prefix}{t}_{k}",
                                    doc_string=loc, **attrs))
    return out


def _const_name(name):
    """A weight's ONNX name: its parameter name ('0.weight'), without freeze_state's
    'frozen.' prefix."""
    if not name:
        return "const"
    name = str(name)
    return _clean(name[len("frozen."):] if name.startswith("frozen.") else name)


def _dims(shape):
    return [d if isinstance(d, int) else str(d) for d in shape]


def _clean(name) -> str:
    return _SIG.sub("_", str(name))




def _lower_block(ctx, g, in_names, into=None):
    """Lower block `g` with its inputs named `in_names`; returns (nodes, output names).
    `into`: the node list to append to (`ctx.nodes`: inline, in the enclosing graph);
    default a list of its own (a subgraph's). Sizes read from input shapes in a subgraph
    are its own nodes, never reused outside it."""
    saved_nodes, saved_cache = ctx.nodes, ctx._dim_cache
    if into is not ctx.nodes:
        ctx.nodes, ctx._dim_cache = ([] if into is None else into), dict(saved_cache)
    try:
        names = {}
        for v, nm in zip(g.inputs, in_names):
            names[v.id] = nm
            ctx.specs.setdefault(nm, Spec(v.shape, v.dtype))
        for c in g.consts:
            nm = ctx.const(c.const, _const_name(c.name))
            names[c.id] = nm
            ctx.specs.setdefault(nm, Spec(c.shape, c.dtype))
        lower_nodes(ctx, g, names)
        outs = [names[v.id] for v in g.outputs]
        nodes = ctx.nodes
    finally:
        ctx.nodes, ctx._dim_cache = saved_nodes, saved_cache
    return nodes, outs


def _subgraph(ctx, nodes, outs, out_specs, formal, name):
    """The GraphProto of a subgraph: `formal` [(name, Spec)] its inputs, `outs` its
    outputs (an Identity where an output is not made by one of its own nodes, or is
    given twice: ONNX wants each output made inside, once)."""
    from onnx import helper
    from .lower.context import onnx_dtype
    made = {o for _, _, os_, _ in nodes for o in os_}
    final, seen = [], set()
    for o in outs:
        if o not in made or o in seen:
            o2 = ctx.fresh("out")
            nodes.append(("Identity", [o], [o2], {}))
            o = o2
        seen.add(o)
        final.append(o)
    for _, ins, _, _ in nodes:        # what a subgraph reads of the enclosing graphs
        ctx.outer_reads.update(i for i in ins if i)
    for _, _, _, attrs in nodes:      # and what its own subgraphs do
        for a in attrs.values():
            if hasattr(a, "node"):
                ctx.outer_reads.update(i for m in _all_nodes(a) for i in m.input if i)
    vi = [helper.make_tensor_value_info(nm, onnx_dtype(np.dtype(s.dtype)), _dims(s.shape))
          for nm, s in formal]
    vo = [helper.make_tensor_value_info(nm, onnx_dtype(np.dtype(s.dtype)), _dims(s.shape))
          for nm, s in zip(final, out_specs)]
    return helper.make_graph(node_protos(nodes, prefix=f"{name}/"), name, vi, vo)


def _all_nodes(g):
    for m in g.node:
        yield m
        for a in m.attribute:
            if a.type == a.GRAPH:
                yield from _all_nodes(a.g)


def _specs(values):
    return [Spec(v.shape, v.dtype) for v in values]


def _bool(ctx, name):
    s = ctx.spec(name)
    if np.dtype(s.dtype) != np.bool_:
        name = ctx.cast(name, np.bool_)
    if tuple(s.shape) != ():
        name = ctx.emit("Reshape", [name, ctx.ints([])])
    return name


# ---------------------------------------------------------------------- the three ops
def _cond(ctx, n, ins):
    then_b, else_b = n.blocks
    pred, rest = _bool(ctx, ins[0]), ins[1:]
    ctx.op, ctx.loc = n.op, n.loc
    branches = {}
    for key, b in (("then_branch", then_b), ("else_branch", else_b)):
        nodes, outs = _lower_block(ctx, b, rest)
        branches[key] = _subgraph(ctx, nodes, outs, _specs(n.outputs), [],
                                  ctx.fresh(key.split("_")[0]))
    ctx.op, ctx.loc = n.op, n.loc
    return ctx.emit("If", [pred], n_out=len(n.outputs), **branches)


def _while(ctx, n, ins):
    k = int(n.attrs["n_carry"])
    carry, caps = ins[:k], ins[k:]
    cond_b, body_b = n.blocks
    limit = n.attrs.get("max_iterations")
    _, (c0,) = _lower_block(ctx, cond_b, ins, into=ctx.nodes)
    c0 = _bool(ctx, c0)
    it, cin = ctx.fresh("iter"), ctx.fresh("cond_in")
    v_in = [ctx.fresh("carry_in") for _ in carry]
    specs = _specs(body_b.inputs[:k])
    for nm, s in zip(v_in, specs):
        ctx.specs[nm] = s
    ctx.specs[it] = Spec((), np.dtype(np.int64))
    ctx.specs[cin] = Spec((), np.dtype(np.bool_))
    nodes, new = _lower_block(ctx, body_b, v_in + caps)
    # the condition of the next iteration, in the body
    _, (c1,) = _lower_block(ctx, cond_b, new + caps, into=nodes)
    saved, ctx.nodes = ctx.nodes, nodes
    try:
        c1 = _bool(ctx, c1)
    finally:
        ctx.nodes = saved
    formal = [(it, ctx.specs[it]), (cin, ctx.specs[cin])] + list(zip(v_in, specs))
    body = _subgraph(ctx, nodes, [c1] + new, [Spec((), np.dtype(np.bool_))] + specs,
                     formal, ctx.fresh("loop_body"))
    m = ctx.const(np.array(int(limit), np.int64), "max_iterations") \
        if limit is not None else None
    ctx.op, ctx.loc = n.op, n.loc
    outs = ctx.emit("Loop", [m if m is not None else "", c0, *carry], n_out=k, body=body)
    return [outs] if isinstance(outs, str) else outs


def _scan(ctx, n, ins):
    k, m = int(n.attrs["n_carry"]), int(n.attrs["n_xs"])
    reverse = bool(n.attrs.get("reverse", False))
    (body_b,) = n.blocks
    carry, xs, caps = ins[:k], ins[k:k + m], ins[k + m:]
    if m == 0:
        raise OnnxError(f"sampan.onnx.export: scan at {n.loc or '?'} scans no input; ONNX's "
                        "Scan needs at least one")
    n_ys = len(body_b.outputs) - k
    formal = []
    for v in body_b.inputs[:k + m]:
        nm = ctx.fresh("carry_in" if len(formal) < k else "x_t")
        ctx.specs[nm] = Spec(v.shape, v.dtype)
        formal.append((nm, ctx.specs[nm]))
    nodes, outs = _lower_block(ctx, body_b, [nm for nm, _ in formal] + caps)
    body = _subgraph(ctx, nodes, outs, _specs(body_b.outputs), formal, ctx.fresh("scan_body"))
    ctx.op, ctx.loc = n.op, n.loc
    res = ctx.emit("Scan", [*carry, *xs], n_out=k + n_ys, body=body, num_scan_inputs=m,
                   scan_input_directions=[1] * m if reverse else None,
                   scan_output_directions=([1] * n_ys if reverse and n_ys else None))
    return [res] if isinstance(res, str) else res
