"""Capturing a program to keep: trace a function, jitted function or Layer once at its
example inputs, optimise the graph (without the memory plan: the reader plans), and for
`dynamic=` dims trace at more sizes and unify into one graph with symbolic dims
(`dynamic.py`). `sampan.jit.save` and `sampan.onnx.export` both capture this way.

Example::

    >>> c = capture(model, (x,), dynamic={"x": {0: "batch"}})
    >>> print(c.graph)          # f32[batch,10] = ...
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from . import dynamic as _dyn
from .pytree import flatten, unflatten
from .tracing import trace


@dataclass
class Captured:
    """What `capture` traced: the optimised graph, its input and output slots, the
    output tree, the example's tensor leaves, the parameter names and, for dynamic dims,
    the size guards every trace agreed on."""
    graph: object
    slots: list
    out_slots: list
    out_tree: tuple
    leaves: list
    params: list
    guards: list = field(default_factory=list)
    dynamic: bool = False


def unwrap(fn_or_layer, dynamic=None):
    """(function to trace, state [(name, tensor)], parameter names, dynamic) of a plain
    function, a `sampan.jit` function (its own `dynamic` unless one is given) or a
    Layer (its parameters and buffers are state)."""
    fn, state, params = fn_or_layer, [], []
    if getattr(type(fn), "jit_wrapped", False) is True:
        if dynamic is None:
            dynamic = fn.dynamic
        params, state, fn = fn.params, fn.state_tensors(), fn.fn
    elif hasattr(fn, "named_parameters"):
        state = list(fn.named_parameters())
        if hasattr(fn, "named_buffers"):
            state += [(n, b) for n, b in fn.named_buffers() if b is not None]
    if not params:
        try:
            params = list(inspect.signature(getattr(fn, "forward", fn)).parameters)
        except (TypeError, ValueError):
            params = []
    return fn, state, params, dynamic


def capture(fn_or_layer, example_inputs, passes="inference", dynamic=None,
            what="saved program", unguarded=False) -> Captured:
    """Trace and optimise `fn_or_layer(*example_inputs)` (see the module doc). State the
    program reads but never writes is marked frozen (`graph.meta["frozen"]`: the
    "inference" pipeline's `freeze_state` folds it). Raises DynamicShapeError, naming
    `what`, when the traces at the probe sizes decide differently on a size, and with
    `unguarded` (a reader that cannot check guards per call: ONNX) when any size breaks a
    branch of the user's code (`dynamic.check_unguarded`)."""
    from ..passes import PassManager, pipeline
    fn, state, params, dynamic = unwrap(fn_or_layer, dynamic)
    example_inputs = tuple(example_inputs)
    leaves = []
    tree = flatten((example_inputs, {}), leaves)
    dyn = _dyn.leaf_dims(dynamic, params, example_inputs, {})
    names = [p for p in (pipeline(passes) if isinstance(passes, str) else list(passes))
             if p != "plan_memory"]
    guards = []

    def traced(ins):
        info = {}
        g, slots, out_slots, out_tree, _ = trace(fn, ins, {}, state, info=info, dyn=dyn)
        guards.append(info["sym_guards"])
        written = {id(ref) for kind, ref in out_slots if kind == "state"}
        g.meta["frozen"] = {i: ref._data for i, (kind, ref) in enumerate(slots)
                            if kind == "state" and id(ref) not in written}
        return PassManager(names).run(g), slots, out_slots, out_tree
    g, slots, out_slots, out_tree = traced(example_inputs)
    found = []
    if dyn:   # one program for every size of the marked dims (see jit/dynamic.py)
        base, probes = _dyn.probe_sizes(_dyn.bind(leaves, dyn))
        runs = [traced(unflatten(tree, _dyn.resized(leaves, dyn, sz))[0])[0]
                for sz in [dict(base, **{s: n}) for s, n in probes]]
        if base != _dyn.bind(leaves, dyn):   # an example of size 1: trace the base at 2
            g = traced(unflatten(tree, _dyn.resized(leaves, dyn, base))[0])[0]
        meta_g = g.meta
        # the comparisons on sizes the traces made: the same answers at every probe, or
        # the code decides on the size and no one program serves it
        found, conflict = _dyn.merge_guards(guards[1:] if len(guards) > len(runs) + 1
                                            else guards, base, probes)
        if conflict is not None:
            raise _dyn.guard_error(*conflict, what=what)
        if unguarded:
            _dyn.check_unguarded(found, base, what)
        g = _dyn.unify(g, runs, base, probes, what=what)
        g.meta = meta_g
    return Captured(g, slots, out_slots, out_tree, leaves, params, found, bool(dyn))
