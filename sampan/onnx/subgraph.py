"""Running ONNX nodes on the import side: the node loop of a graph (`run_nodes`, which
`OnnxModule.forward` runs on the main graph) and of a subgraph (`Subgraph`, `run_subgraph`:
the bodies of If, Loop and Scan and the modifier graphs of FlexAttention).

A subgraph reads values of the enclosing scopes by name (ONNX's outer-scope rule): it runs
in an environment that falls back on the enclosing one (`collections.ChainMap`). Under
`sampan.jit` tracing, a subgraph run inside `sampan.cond` / `while_loop` / `scan` closes
over those outer values, which the tracer turns into the node's captured inputs.

Sequences (ONNX `seq(tensor)`) are `Seq`: a Python list of Tensors of a length known when
the graph is built; optional values are `Opt` (a value or none). Both exist only while
the graph is built: a traced program holds their tensors, never them.
"""
from __future__ import annotations

from collections import ChainMap

from ..tensor import Tensor
from . import emulate as _em
from . import fold as _fold
from .nodes import Node, _array, _check_attrs_read, _check_bits, _run_static, _settle
from .values import Opt, Seq  # noqa: F401 - the sequence and optional values
from .ops import lookup

# nodes whose handlers run subgraphs (or read outer values): never folded as a whole,
# their inner nodes fold one by one
RUNS_SUBGRAPHS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


class Subgraph:
    """A GraphProto (a subgraph attribute) read once: its input and output names, its
    nodes and its initializers (static values); the outer names it reads resolve when it
    runs (`run_subgraph`)."""

    __slots__ = ("name", "inputs", "outputs", "nodes", "inits", "proto")

    def __init__(self, g):
        self.proto = g
        self.name = g.name or "subgraph"
        self.inputs = [i.name for i in g.input]
        self.outputs = [o.name for o in g.output]
        self.nodes = [Node(n) for n in g.node]
        self.inits = {t.name: _array(t) for t in g.initializer}

    def __repr__(self):
        return f"<onnx subgraph {self.name!r}: {self.inputs} -> {self.outputs}>"


def run_nodes(ctx, nodes, env, emulated=None):
    """Run `nodes` in order, reading and writing `env` (name -> Tensor / Seq / Opt / None);
    a node whose inputs are all static runs once now (folded). `emulated`: {value name:
    emulated format} of the main graph."""
    saved_env = ctx.env
    ctx.env = env
    try:
        for n in nodes:
            ctx.node = n
            opset = ctx.opsets.get(n.domain or "", ctx.opset)
            missing = [i for i in n.inputs if i not in env]
            if missing:
                raise ctx.error(f"reads {missing}, which no node, input or initializer of "
                                "its graph or the enclosing graphs defines")
            ins = [env[i] for i in n.inputs]
            fn = lookup(n.domain, n.op_type, opset, n.name)
            if emulated:
                _check_bits(ctx, n, ins, emulated)
            if n.op_type not in RUNS_SUBGRAPHS and all(
                    t is None or ctx.is_static(t) for t in ins):
                try:
                    outs = _run_static(fn, ctx, n, ins)
                except _fold.Unfolded:     # too big to make now: the node stays ops
                    outs = fn(ctx, n, *ins)
                    for t in outs if isinstance(outs, (tuple, list)) else (outs,):
                        if isinstance(t, Tensor):
                            ctx._unfolded[id(t)] = t
            else:
                outs = fn(ctx, n, *ins)
            if not n.checked:
                _check_attrs_read(n, opset)
            outs = outs if isinstance(outs, tuple) or type(outs) is list else (outs,)
            for name, t in zip(n.outputs, outs):
                if name:            # "" is an omitted output; env[""] must stay None
                    f = emulated.get(name) if emulated else None
                    if f is not None and n.op_type not in _em.PASSTHROUGH:
                        t = _settle(ctx, t, f)
                    env[name] = t
    finally:
        ctx.env = saved_env
    return env


def run_subgraph(ctx, sub, args, what=None):
    """Run Subgraph `sub` on `args` (one value per subgraph input) in a scope over the
    current one; returns its outputs as a list."""
    if len(args) != len(sub.inputs):
        raise ctx.error(f"{what or sub.name} takes {len(sub.inputs)} inputs "
                        f"({', '.join(sub.inputs) or 'none'}); it is given {len(args)}")
    outer = ctx.node
    local = {"": None}
    for name, a in sub.inits.items():
        local[name] = ctx.make_static(a)
    local.update(zip(sub.inputs, args))
    env = ChainMap(local, ctx.env if ctx.env is not None else {})
    try:
        run_nodes(ctx, sub.nodes, env)
    finally:
        ctx.node = outer
    missing = [o for o in sub.outputs if o not in env]
    if missing:
        raise ctx.error(f"{what or sub.name}'s outputs {missing} are never computed")
    return [env[o] for o in sub.outputs]


def subgraph_attr(ctx, node, name):
    """The Subgraph held by attribute `name` of `node` (read once, then kept on the node;
    a clear error if it has none)."""
    g = node.attrs.get(name)
    if g is not None and not isinstance(g, Subgraph) and hasattr(g, "node"):
        g = Subgraph(g)
        dict.__setitem__(node.attrs, name, g)
    if not isinstance(g, Subgraph):
        raise ctx.error(f"needs the graph attribute {name!r}")
    return g


__all__ = ["Seq", "Opt", "Subgraph", "run_nodes", "run_subgraph", "subgraph_attr",
           "RUNS_SUBGRAPHS"]
