"""Executor codegen: a Graph becomes a straight-line Python function that calls the
backend kernels of the op table, one line a node with the IR line as a comment.

Values are released (`del`) after their last use; values the memory plan gave a
buffer are written into it with `out=` (buffer views are made once, at compile
time). The source is registered with `linecache`, so a traceback from a kernel
lands on a readable line of generated code. Debug mode checks every intermediate
against its IR type (the op's shape rule).

While `sampan.profiler` records, a call runs a second executor made (once, on the first
profiled call) from the same lines with a clock read around every node, sharing the
first one's kernels and buffers: each node or fused kernel becomes a "kernel" event
with its IR line, the user's source line, FLOPs and bytes (`runtime/profiled.py`). The
normal executor has no timing code in it at all.

Every name, keyword, literal and comment of the source is made by `runtime/emit.py`: the
graph may come from a file (`sampan.jit.load`), so none of its text is pasted. Attribute
keys must pass the emitter's identifier check; attribute values are literals it formats,
and a value without a literal form (an object a pass attached) is bound in the executor's
globals under a name the emitter makes, never written by its `repr`.
"""
from __future__ import annotations

import contextlib
import itertools
import linecache
import math

import numpy as np

from ..backends.provider import frozen_consts
from ..errors import SampanError
from ..ir.text import node_str
from ..ops.registry import OPS
from . import emit
from .compiled import Compiled
from .control import control_lines
from .memory import inplace_ok, out_kernel
from .profiled import profiled_variant

_counter = itertools.count()

# op name -> fn(node, inplace=...) giving a callable over that node's input arrays, bound
# at compile time. Kept for binders registered from outside; sampan's own node kernels
# (generated fused kernels, engine sessions) come from their providers (`sampan.backends`:
# a provider's `node_kernels`), which is how a new one should be added.
class _NodeKernels(dict):
    """Binders registered here by name; `NODE_KERNELS["fused"]` (and "engine") still
    answers with the provider's binder, for code written before providers."""

    def __missing__(self, op):
        if op in _NODE_PROVIDER:
            from ..backends import get_provider
            return get_provider(_NODE_PROVIDER[op]).bind
        raise KeyError(op)


NODE_KERNELS: dict = _NodeKernels()
# providers bound as the op table's kernels (out= variants): numba's are its hand-written
# loops (`kernels["numba"]`, the ops' default kernels where numba is)
_TABLE = ("numpy", "onednn", "numba")
# the provider whose binder runs a node of these ops whatever the list says (their op
# table kernels are references that return tuples, not what an executor binds)
_NODE_PROVIDER = {"fused": "numba", "engine": "onnxruntime"}


class RuntimeCheckError(SampanError):
    """Debug mode: a kernel produced a value that disagrees with its IR type."""


def _attr_args(n, env, bound):
    """The node's attributes as (key, Code) keyword arguments: plain data as literals
    (`emit.lit`); a value that has no literal form (an object a pass put there) bound in
    the executor's globals under a name the emitter makes. Keys must be identifiers."""
    out = []
    for k, a in n.attrs.items():
        key = _attr_key(n, k)
        try:
            out.append((key, emit.lit(a, numpy="_np", what=f"attribute {key} of {n.op}")))
        except emit.EmitError:
            b = emit.fresh("_a", len(bound))
            bound.append(b)
            env[b] = a
            out.append((key, b))
    return out


def _attr_key(n, k):
    try:
        return emit.name(k, f"attribute key of {n.op}")
    except emit.EmitError as e:
        raise emit.EmitError(f"sampan.jit: node {n.op} at {emit.inert(n.loc or '?')}: "
                             f"{e}") from None


def _check(arr, shape, dtype, line):
    if not isinstance(arr, np.ndarray):
        raise RuntimeCheckError(f"kernel returned {type(arr).__name__}, not an array: {line}")
    ok = len(arr.shape) == len(shape) and all(
        isinstance(d, str) or d == a for d, a in zip(shape, arr.shape))
    if not ok or arr.dtype != dtype:
        raise RuntimeCheckError(f"kernel returned {arr.dtype}{list(arr.shape)}, the shape rule "
                                f"says {dtype}{list(shape)}: {line}")
    return arr


def compile_graph(g, *, debug: bool = False, use_plan: bool = True,
                  release: bool = True, name: str = "graph_fn",
                  specialize: bool = False, program: str | None = None) -> Compiled:
    """Generate, compile and return the executor of `g`.

    `specialize`: bind kernels chosen for the nodes' concrete types where
    `runtime/specialize.py` has one (executors that serve many calls: the Predictor).
    `program`: the name profiler events give this executor (default: the graph's).

    Example: ``c = compile_graph(g); outs = c(x_array)``; ``print(c.code)``"""
    from . import specialize as _spec
    plan = g.meta.get("memory_plan") if use_plan else None
    assign = plan["assign"] if plan else {}
    donate = plan.get("donate", {}) if plan else {}
    env = {"_asarray": np.asarray, "_inf": math.inf, "_nan": math.nan, "_check": _check,
           "_np": np}
    # every name, key, literal and comment below is made by `emit` (no graph text is
    # pasted: a graph may come from a file)
    fname = emit.name(name, "executor name")
    ren = {v.id: k for k, v in enumerate(g.values())}   # the printer's numbering
    names = {}
    for k, v in enumerate(g.inputs):
        names[v.id] = emit.fresh("x", k)
    for v in g.consts:
        names[v.id] = emit.fresh("c", ren[v.id])
        env[names[v.id]] = v.const
    from ..backends import get_provider
    from ..passes.partition import assign as _partition
    missing = [n for n in g.nodes if "provider" not in n.meta]
    if missing:              # the list the partition pass used, else the jit's list
        _partition(g, nodes=missing)     # (`sampan.backends.set_providers`)
    buffers = []
    if plan:
        buffers = [np.empty(max(s, 1), np.uint8) for s in plan["sizes"]]
    last = {}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            last[v.id] = i
    keep = {v.id for v in g.outputs} | {v.id for v in g.inputs if not release}
    keep |= {g.inputs[k].id for k in donate.values()}
    lines = [emit.fill("def {f}({params}):", f=fname,
                       params=emit.join(names[v.id] for v in g.inputs))]
    node_at = {}                     # line index -> node index (for the profiling variant)
    bound_as = {}                    # node index -> the executor's name of its kernel
    kernels = {}
    bound = []                       # names of attribute values bound in env
    def release_after(i, n, ir_text=None):
        if debug and ir_text is not None:
            for v in n.outputs:
                t = emit.fresh("_t", v.id)
                env[t] = (v.shape, v.dtype, ir_text)
                lines.append(emit.fill("    _check({v}, *{t})", v=names[v.id], t=t))
        if release:
            dead = [names[v.id] for v in dict.fromkeys(n.inputs) if last.get(v.id) == i
                    and v.id not in keep and v.const is None]
            dead += [names[v.id] for v in n.outputs if v.id not in last and v.id not in keep]
            if dead:
                lines.append(emit.fill("    del {dead}", dead=emit.join(dead)))
    options = {"debug": debug, "use_plan": use_plan, "specialize": specialize}
    for i, n in enumerate(g.nodes):
        op = OPS[n.op]
        opname = emit.name(n.op, "op name")
        for v in n.outputs:
            names[v.id] = emit.fresh("v", ren[v.id])
        ir_text = node_str(n, lambda v: f"%{ren[v.id]}")
        if n.blocks:       # control flow: a real if/while/for around the compiled blocks
            lines.append(emit.fill("    {c}", c=emit.comment(ir_text)))
            lines.extend(control_lines(n, i, names, env, options, compile_graph))
            release_after(i, n, ir_text)
            continue
        ir = emit.comment(ir_text)
        args = [names[v.id] for v in n.inputs]
        kwargs = []
        bufname = None
        first = n.outputs[0].id if n.outputs else None
        prov = get_provider(n.meta["provider"])
        if n.op in _NODE_PROVIDER and n.op not in prov.node_kernels:
            prov = get_provider(_NODE_PROVIDER[n.op])
        binder = NODE_KERNELS.get(n.op) or (prov.bind if n.op in prov.node_kernels else None)
        # the out= variants and specialised kernels below may run the measured choice
        # (oneDNN): not for a node the list kept off oneDNN on purpose
        own = binder is None and n.op in prov.bound_kernels   # made for this node
        table = binder is None and prov.name in _TABLE and not own and (
            prov.name == "onednn" or (n.op in prov.kernels and prov.kernel(n.op) is op.kernel)
            or not get_provider("onednn").supports(n))
        if (prov.name not in _TABLE or own) and binder is None:  # the provider's binding
            kname = emit.fresh("p", i, "_", opname)      # attributes bound at compile time
            env[kname] = prov.bind(n)
        elif binder is not None:  # a kernel made for this node (generated fused kernels)
            kname = emit.fresh("k", i, "_", opname)
            bufs, inplace = [], {}
            for j, v in enumerate(n.outputs):
                b = None
                if v.id in donate:     # into a donated input's array
                    x = g.inputs[donate[v.id]]
                    b = names[x.id]
                    same = [p for p, u in enumerate(n.inputs) if u is x]
                elif v.id in assign:   # into its planned buffer
                    b = emit.fresh("_b", ren[v.id])
                    env[b] = buffers[assign[v.id]][:v.nbytes].view(v.dtype).reshape(v.shape)
                    same = [p for p, u in enumerate(n.inputs)
                            if assign.get(u.id) == assign[v.id] and u.shape == v.shape
                            and u.dtype == v.dtype]
                if b is not None and same and inplace_ok(n):
                    inplace[j] = same[0]   # the kernel stores into that input itself
                    b = None
                bufs.append(b)
            with frozen_consts() if specialize else contextlib.nullcontext():
                env[kname] = binder(n, inplace=inplace)   # a served program's consts
            if any(bufs):
                kwargs.append(("out", emit.tuple_of(b or emit.lit(None) for b in bufs)))
        elif not table:            # the provider's own kernel, attributes as keywords
            kname = emit.fresh("k_", opname, "_", emit.name(prov.name, "provider"))
            env[kname] = prov.kernel(n.op)
            kwargs = _attr_args(n, env, bound)
        elif first in donate:  # computed in place into a donated input's array
            bufname = names[g.inputs[donate[first]].id]
            kname = emit.fresh("out_", opname)
            env[kname] = out_kernel(n)
            kwargs = _attr_args(n, env, bound) + [("out", bufname)]
        elif first in assign:
            v = n.outputs[0]
            b = buffers[assign[v.id]]
            bufname = emit.fresh("_b", ren[v.id])
            env[bufname] = b[:v.nbytes].view(v.dtype).reshape(v.shape)
            kname = emit.fresh("out_", opname)
            fn = specialize and _spec.small_matmul(n)
            if fn:                     # batch 1..8 against a constant weight
                kname = emit.fresh("s", i, "_", opname)
            elif fn := specialize and _spec.out_matmul(n):
                kname = emit.name("out_matmul2d")   # other matmuls keep the general one
            env[kname] = fn or out_kernel(n)
            kwargs = _attr_args(n, env, bound) + [("out", bufname)]
        elif specialize and (fn := _spec.node_kernel(n)) is not None:
            kname = emit.fresh("s", i, "_", opname)     # attributes bound at compile time
            env[kname] = fn
        else:
            fn = prov.kernel(n.op) if n.op in prov.kernels else None
            if fn is None:
                raise SampanError(f"op {n.op} has no numpy kernel")
            # eager's kernel keeps its plain name; another provider's is named after it
            kname = emit.fresh("k_", opname) if fn is op.kernel else emit.fresh(
                "k_", opname, "_", emit.name(prov.name, "provider"))
            if kname not in kernels:
                kernels[kname] = fn
                env[kname] = fn
            kwargs = _attr_args(n, env, bound)
        call = emit.call(kname, args, kwargs)
        bound_as[i] = str(kname)
        if op.n_out == 1:
            if n.outputs[0].ndim == 0 and bufname is None:
                call = emit.call(emit.name("_asarray"), [call])
            lhs = names[n.outputs[0].id]
        else:
            lhs = emit.join(names[v.id] for v in n.outputs)
        node_at[len(lines)] = i
        lines.append(emit.fill("    {lhs} = {call}  {ir}", lhs=lhs, call=call, ir=ir))
        release_after(i, n, ir_text)
    outs = emit.join(names[v.id] for v in g.outputs)
    lines.append(emit.fill("    return ({outs}{comma})", outs=outs,
                           comma=emit.own("," if len(g.outputs) == 1 else "")))
    src = emit.block(lines) + "\n"
    filename = f"<sampan-jit-{next(_counter)}:{emit.inert(g.name)}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), env)

    def remake():
        return profiled_variant(g, name, lines, node_at, env, plan, program, bound_as)
    return Compiled(env[name], src, filename, plan, remake)
