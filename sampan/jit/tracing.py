"""Tracing one call: `trace(fn, args, kwargs, state)` runs `fn` under a `Tracer` and
returns its Graph with the slots that say what each graph input and output is in the call
(an argument, a state tensor, a `.grad`, a fed value, a generator's state, an output, a
residual of the call's traced gradient). `sampan.jit`, `sampan.jit.save`, ONNX export,
`sampan bisect` and `sampan.flops` trace through it."""
from __future__ import annotations

import numpy as np

from ..ops.registry import STATE
from ..tensor import Tensor
from .autodiff import born_leaves, ran_backward, trace_vjp
from .guards import tensor_guard
from .pytree import flatten, leaves_of, renumber, unflatten
from .slots import input_arrays
from .slots import ref_of as _ref_of
from .tracer import _OUTSIDE, Tracer


def trace(fn, args, kwargs=None, state=(), name="main", info=None, differentiable=False,
          dyn=None):
    """Trace `fn(*args, **kwargs)` into a Graph.

    `state` is a list of (name, tensor) to make graph inputs up front (a Layer's
    parameters and buffers). Returns (graph, in_slots, out_slots, out_tree, grad_none);
    `info`, a dict if given, receives the trace's guards. `graph.meta["donate"]` pairs
    each state output with the input holding that state's array. With `differentiable`
    (and grad mode on), a call reading tensors that require grad, and not running
    backward itself, also gets its gradient traced: `info["vjp"]` (see `autodiff`), and
    the graph returns the residuals that gradient reads (out slots "res"). `dyn`
    ({leaf: {dim: symbol}}) traces those dims as symbolic sizes (`dynamic.py`);
    `info["sym_guards"]` then lists the comparisons the code made on them."""
    kwargs = kwargs or {}
    leaves = []
    tree = flatten((tuple(args), kwargs), leaves)
    tr = Tracer(name)
    with tr:
        for i, t in enumerate(leaves):
            v = tr.lift(t, ("arg", i), None)
            if dyn and i in dyn:
                tr.symbolic(v, dyn[i])
        for nm, t in state:
            tr.lift(t, ("state", t), nm)
        a, k = unflatten(tree, leaves)
        if tr.env is not None:
            tr.env.recording = True
            try:
                result = fn(*a, **k)
            finally:
                tr.env.recording = False
        else:
            result = fn(*a, **k)
        out_leaves = []
        out_tree = flatten(result, out_leaves)
        g = tr.g
        out_slots = []
        final = []
        out_tensors = []
        first = {}           # id(tensor) -> its leaf: one tensor returned twice stays one
        for t in out_leaves:
            if id(t) in first:
                final.append(first[id(t)])
                continue
            if isinstance(t._data, np.ndarray):
                if not tr.is_born(t):  # a tensor from outside, untouched: return it as is
                    final.append(None)
                    continue
                v = tr.value_of_const(t)  # made from data by the call: a new one per call
            else:
                v = tr.value_of(t)
            first[id(t)] = len(out_slots)
            final.append(len(out_slots))
            g.outputs.append(v)
            out_slots.append(("out", None))
            out_tensors.append(t)
        out_tree = renumber(out_tree, out_leaves, final)
        grad_none = []
        donate = {}
        hist = []     # tensors an in-place op of the call gave a history (b.mul_(w))
        for L in tr.lifted.values():
            t = L.t
            ref = _ref_of(tr, t)
            if t._data is not L.value:
                donate[len(g.outputs)] = g.inputs.index(L.value)
                g.outputs.append(t._data)
                out_slots.append(("state", ref))
                if (t.requires_grad and t._node is not None and t._node is not L.node
                        and t._node in tr.tape and t._node.op is not _OUTSIDE):
                    hist.append((ref, t))
            gt = t.grad
            if gt is None:
                if L.grad is not None or id(t) in tr.grad_cleared:
                    grad_none.append(ref)
            elif not isinstance(gt._data, np.ndarray) and gt._data is not L.gvalue:
                g.outputs.append(tr.value_of(gt))
                out_slots.append(("grad", ref))
                if L.value in g.inputs:     # for the `distribute` pass: which param's grad
                    g.meta.setdefault("grads", []).append(
                        (len(g.outputs) - 1, g.inputs.index(L.value)))
        for t in tr.grad_cleared.values():  # dropped, and no new grad: drop it per call
            if id(t) not in tr.lifted:
                grad_none.append(t)
        for gen, v in tr.rng.values():
            g.outputs.append(v)
            out_slots.append(("rng", gen))
        vjp, pinned = None, set()
        runs_backward = (grad_none or tr.grad_cleared or any(k == "grad" for k, _ in out_slots)
                         or any(n.freed for n in tr.tape))   # a backward freed its nodes
        # their gradient is traced with the outputs' (the call's tape node is their
        # history after the call, as eager's in-place op is)
        diff_tensors = out_tensors + [t for _, t in hist]
        born = born_leaves(tr, out_tensors)
        if differentiable and STATE.grad_enabled and runs_backward:
            vjp = ran_backward(name, diff_tensors)
        elif differentiable and STATE.grad_enabled:
            r = trace_vjp(tr, name, diff_tensors, born)
            if r is not None:
                vjp, res = r
                for v in res:
                    g.outputs.append(v)
                    out_slots.append(("res", None))
                aliases = vjp.aliases
                pinned = {k for k in aliases if k is not None}
                written = set(donate.values())
                vjp.copy_res = frozenset(i for i, k in enumerate(aliases) if k in written)
        g.meta["donate"] = _safe_donations(donate, tr, pinned)
    if info is not None:
        info["vjp"] = vjp
        info["hist"] = tuple(ref for ref, _ in hist)
        info["leaf_outs"] = tuple(b.ref[1] for b in born)
        info["guards"] = list(tr.guards)
        info["pass_options"] = {k: dict(v) for k, v in tr.pass_options.items()}
        info["sym_guards"] = list(tr.env.guards) if tr.env is not None else []
        consts = []
        for _, d, t in list(tr.consts.values()) + tr.block_consts:
            if isinstance(t, Tensor) and t._data is d and not tr.is_born(t):
                b = t._base
                consts.append((t, d, (b if b is not None else t)._version))
        info["tensor_guard"] = tensor_guard(
            consts, [(L.t, L.rg) for L in tr.lifted.values()
                     if tr.slots[tr.g.inputs.index(L.value)][0] == "state"])
        info["grad_check"] = _grad_check(tr)
    return g, list(tr.slots), out_slots, out_tree, grad_none


def _grad_check(tr):
    """What the graph assumed about the .grad of lifted tensors (arguments and state).

    Code that reads or writes gradients (a backward, an optimiser step) traced with a
    grad present accumulates into it, traced with none starts it: the graph holds while
    each grad is present or absent as when lifted (unless the traced code dropped it
    before reading it). Code that seems not to touch a gradient may still have read
    whether there is one (`return p.grad`, `if p.grad is not None:`), which a trace
    cannot see: it holds on the same condition (a loop accumulating gradients over calls
    traces twice, once without grads and once with them)."""
    return [(_ref_of(tr, L.t), L.grad is not None) for L in tr.lifted.values()
            if (L.rg or L.grad is not None) and id(L.t) not in tr.grad_cleared]


def _safe_donations(donate, tr, pinned=()):
    """Donate only state arrays (not call arguments) that overlap no other input's, and
    that no residual of a traced gradient reads (`pinned` input positions)."""
    arrays = [L.data for L in tr.lifted.values()]
    by_value = {id(L.value): L.data for L in tr.lifted.values()}
    ok = {}
    for j, k in donate.items():
        a = by_value.get(id(tr.g.inputs[k]))
        if a is None or k in pinned or tr.slots[k][0] != "state" or not a.flags.writeable \
                or sum(np.may_share_memory(a, b) for b in arrays) != 1:
            continue
        ok[j] = k
    return ok


def traced_call(fn, inputs):
    """(Graph as traced, its input arrays) of `fn(*inputs)`: a function, a `sampan.jit`
    function (with its Layer's state) or a Layer (its parameters); what
    `sampan.passes.bisect` bisects."""
    state = []
    if getattr(type(fn), "jit_wrapped", False) is True:
        state, fn = fn.state_tensors(), fn.fn
    elif hasattr(fn, "named_parameters"):
        state = list(fn.named_parameters())
    inputs = tuple(inputs)
    g, slots, *_ = trace(fn, inputs, {}, state)
    return g, input_arrays(slots, leaves_of((inputs, {})))
