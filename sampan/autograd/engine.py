"""Reverse-mode engine: iterative topological walk over tape nodes.

No recursion (a chain of 10^5 ops backpropagates fine). Gradient rules are run
with grad recording on only when `create_graph=True`, which is what makes
higher-order gradients work: the rules are written with ordinary ops.
"""
from __future__ import annotations

import numpy as np

from ..errors import AutogradError
from ..ops.registry import STATE
from .. import _recorder as _rec
from . import hooks as _hooks
from .tape import _ver


def _ones_like(t):
    from ..tensor import wrap
    return wrap(np.ones(t.shape, t.dtype))


def _zeros(shape, dtype):
    from ..tensor import wrap
    return wrap(np.zeros(shape, dtype))


class SliceGrads:
    """Eager backward only: the gradient of a tensor that was read through basic-index
    slices (``q, k, v = qkv[0], qkv[1], qkv[2]``), kept as (index, array) parts while the
    engine accumulates them. Materialised once, when the node consumes its gradient:
    one zero fill and each part added into its slice, instead of one full-size zero
    tensor per slice and a full-size add per extra slice."""

    __slots__ = ("shape", "dtype", "parts")

    def __init__(self, shape, dtype, parts):
        self.shape, self.dtype, self.parts = tuple(shape), dtype, parts

    def merge(self, other):
        return SliceGrads(self.shape, self.dtype, self.parts + other.parts)

    def tensor(self):
        from ..tensor import wrap
        out = np.zeros(self.shape, self.dtype)
        for idx, a in self.parts:
            out[idx] += a          # basic indexing selects each element once per part
        return wrap(out)


def _dense(g):
    return g.tensor() if type(g) is SliceGrads else g


def _sum(cur, g):
    if type(cur) is SliceGrads:
        if type(g) is SliceGrads and g.shape == cur.shape and g.dtype == cur.dtype:
            return cur.merge(g)
        cur = cur.tensor()
    return cur + _dense(g)


def _check_saved(node):
    # the check of every backward step: versions compared in place, without building
    # node.saved_pairs()'s list (about 7% of a small-op backward); the same pairs, in order
    saved = node.saved
    if saved is not None:
        op = node.op
        inputs = node.inputs
        if op.saves_per_input:
            for i, v in saved:
                t = inputs[i]
                b = t._base
                if (t if b is None else b)._version != v:
                    _saved_changed(node, t, v)
        else:
            idx = op.saves if op.saves is not None else range(len(inputs))
            for i, v in zip(idx, saved):
                t = inputs[i]
                b = t._base
                if (t if b is None else b)._version != v:
                    _saved_changed(node, t, v)
    if node.outs is not None:
        for r, v in zip(node.outs, node.out_versions):
            t = r()
            if t is not None and _ver(t) != v:
                _saved_changed(node, t, v)


def _saved_changed(node, t, v):
    raise AutogradError(
        f"backward through {node.op.name}: a tensor of shape {tuple(t.shape)} that "
        f"{node.op.name} saved for its gradient was modified in place afterwards "
        f"(version {v} -> {_ver(t)}); clone it before modifying it in place")


def run_backward(roots, grad_roots, retain_graph, create_graph, capture=None):
    """Core engine. `capture`: list of tensors whose gradients to return instead of
    accumulating into leaves' `.grad`. Returns the captured grads (or None).
    Callbacks queued during it (`hooks.queue_callback`) run when it has finished."""
    outer = getattr(_hooks._TL, "queue", None)
    q = _hooks._TL.queue = []
    try:
        out = _run_backward(roots, grad_roots, retain_graph, create_graph, capture)
    finally:
        _hooks._TL.queue = outer
    for fn in q:
        fn()
    return out


def _finish_leaf(t, g, create_graph):
    """Tensor hooks, then accumulation into `.grad`, then the ready hooks of leaf `t`."""
    if t._hooks:
        for fn in list(t._hooks.values()):
            r = fn(g)
            if r is not None:
                g = r
    if not create_graph:
        g = g.detach() if g._node is not None else g
    t.grad = g if t.grad is None else t.grad + g
    ready = t.__dict__.get("_ready_hooks")
    if ready:
        for fn in list(ready.values()):
            fn(t)


def _run_backward(roots, grad_roots, retain_graph, create_graph, capture=None):
    from ..tensor import Tensor, as_tensor, refresh_view
    if retain_graph is None:
        retain_graph = create_graph
    # seed gradients
    node_grads = {}
    leaf_grads = {}
    starts = []
    for r, g in zip(roots, grad_roots):
        if r._view is not None and r._vsync != r._base._version:
            refresh_view(r)     # a view whose base was written since: its history is the base's
        if not r.requires_grad:
            raise AutogradError("backward: tensor does not require grad and has no grad_fn")
        if g is None:
            if r.numel() != 1:
                raise AutogradError(
                    f"backward: grad can be implicitly created only for one-element outputs; "
                    f"got shape {tuple(r.shape)}: pass a gradient")
            g = _ones_like(r)
        else:
            g = as_tensor(g, r.dtype)
        if r._node is None:
            _acc(leaf_grads, id(r), r, g)
        else:
            _acc_node(node_grads, r._node, r._idx, g)
            starts.append(r._node)
    # nodes are dict keys by identity (Node defines no __eq__/__hash__)

    cap_leaf = {}
    cap_node = {}
    if capture is not None:
        for i, t in enumerate(capture):
            if t._node is None:
                cap_leaf[id(t)] = i
            else:
                cap_node.setdefault((t._node, t._idx), []).append(i)
        captured = [None] * len(capture)

    # dependency counts over the reachable graph; with ready hooks somewhere, also how
    # many edges reach each hooked leaf, so its .grad is final (and its hooks run) as
    # soon as the last one is walked instead of after the whole backward
    deps = {}
    leaf_deps = {} if _hooks.READY["leaves"] and capture is None else None
    seen = set()
    stack = list(starts)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.freed:
            raise AutogradError(
                f"backward through {n.op.name} a second time: its saved values were freed "
                "after the first backward; pass retain_graph=True to the first call")
        for m in n.edges[::2]:
            if m is not None:
                deps[m] = deps.get(m, 0) + 1
                if m not in seen:
                    stack.append(m)
        if leaf_deps is not None:
            e = n.edges
            for j in range(1, len(e), 2):
                k = e[j]
                if e[j - 1] is None and k is not None and k.__dict__.get("_ready_hooks"):
                    leaf_deps[id(k)] = leaf_deps.get(id(k), 0) + 1

    ready = [n for n in dict.fromkeys(starts) if deps.get(n, 0) == 0]
    recording = _rec.ACTIVE     # sampan.profiler: read once per walk, not per node
    t_start = _rec.now() if recording else 0
    prev = STATE.grad_enabled
    STATE.grad_enabled = bool(create_graph)
    sliced = False          # whether any SliceGrads is pending in node_grads
    try:
        while ready:
            node = ready.pop()
            gs = node_grads.pop(node, None)
            if sliced and gs is not None:
                gs = [_dense(g) for g in gs]
            if gs is not None and node.hooks:
                for idx, fns in node.hooks.items():
                    if gs[idx] is not None:
                        for fn in list(fns.values()):
                            r = fn(gs[idx])
                            if r is not None:
                                gs[idx] = r
            if gs is not None and cap_node:
                for idx, g in enumerate(gs):
                    for ci in cap_node.get((node, idx), ()):
                        captured[ci] = g
            op = node.op
            inputs = node.inputs
            if gs is not None:
                if node.saved or node.outs is not None:
                    _check_saved(node)
                if op.n_out == 1:
                    g_in = gs[0]
                    y = node.output(0) if node.outs is not None else None
                else:
                    g_in = tuple(g if g is not None else _zeros(*spec)
                                 for g, spec in zip(gs, node.out_specs))
                    y = (tuple(node.output(i) for i in range(len(node.outs)))
                         if node.outs is not None else None)
                attrs = node.attrs
                if recording:
                    t0 = _rec.now()
                    in_grads = op.grad(g_in, y, *inputs, **attrs)
                    _rec.emit(op.name + "_backward", "backward", t0, _rec.now() - t0,
                              op=op.name)
                else:
                    in_grads = (op.grad(g_in, y, *inputs, **attrs) if attrs else
                                op.grad(g_in, y, *inputs))
                if not isinstance(in_grads, (tuple, list)):
                    in_grads = (in_grads,)
            else:
                in_grads = (None,) * len(inputs)
            edges = node.edges
            n_g = len(in_grads)
            for j in range(len(inputs)):
                gi = in_grads[j] if j < n_g else None
                m = edges[2 * j]
                k = edges[2 * j + 1]
                if gi is not None and (m is not None or k is not None):
                    t = inputs[j]
                    if type(gi) is SliceGrads:
                        if m is not None and gi.dtype == t._data.dtype:
                            sliced = True     # stays pending: nodes materialise their grads
                        else:
                            gi = gi.tensor()
                    if type(gi) is not SliceGrads and gi._data.dtype is not t._data.dtype \
                            and gi._data.dtype != t._data.dtype:
                        gi = gi.to(t.dtype)
                    if m is None:
                        _acc(leaf_grads, id(k), k, gi)
                    else:
                        gm = node_grads.get(m)
                        if gm is None:
                            if m.op.n_out == 1:
                                node_grads[m] = [gi]
                            else:
                                gm = node_grads[m] = [None] * m.op.n_out
                                gm[k] = gi
                        else:
                            cur = gm[k]
                            gm[k] = gi if cur is None else _sum(cur, gi)
                if m is not None:
                    c = deps[m] - 1
                    deps[m] = c
                    if c == 0:
                        ready.append(m)
                elif leaf_deps and k is not None and id(k) in leaf_deps:
                    c = leaf_deps[id(k)] - 1
                    leaf_deps[id(k)] = c
                    if c == 0 and id(k) in leaf_grads:
                        _finish_leaf(k, leaf_grads.pop(id(k))[1], create_graph)
            if not retain_graph:
                node.freed = True
                node.saved = None
    finally:
        STATE.grad_enabled = prev
        if recording:   # the whole walk, around its nodes' events
            _rec.emit("backward", "backward", t_start, _rec.now() - t_start, nodes=len(seen))

    # leaves
    for key, (t, g) in leaf_grads.items():
        if capture is None:
            _finish_leaf(t, g, create_graph)
            continue
        if t._hooks:
            for fn in list(t._hooks.values()):
                r = fn(g)
                if r is not None:
                    g = r
        ci = cap_leaf.get(key)
        if ci is not None:
            captured[ci] = g
    return captured if capture is not None else None


def _acc(d, key, t, g):
    cur = d.get(key)
    d[key] = (t, g) if cur is None else (t, cur[1] + g)


def _acc_node(d, node, idx, g):
    gs = d.get(node)
    if gs is None:
        gs = [None] * node.op.n_out
        d[node] = gs
    gs[idx] = g if gs[idx] is None else gs[idx] + g


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    """Accumulate gradients of `tensors` into the `.grad` of the leaves."""
    if grad_tensors is None:
        grad_tensors = [None] * len(tensors)
    if inputs is not None:
        gs = run_backward(tensors, grad_tensors, retain_graph, create_graph, capture=inputs)
        for t, g in zip(inputs, gs):
            if g is not None:
                g = g if create_graph else g.detach()
                t.grad = g if t.grad is None else t.grad + g
        return
    run_backward(tensors, grad_tensors, retain_graph, create_graph)


def grad(outputs, inputs, grad_outputs=None, create_graph=False, retain_graph=None,
         allow_unused=False):
    """Gradients of `outputs` with respect to `inputs`, returned (not accumulated).

    Example::

        >>> x = sampan.tensor(3.0, requires_grad=True)
        >>> (g,) = sampan.grad(x * x, [x], create_graph=True)   # 6.0
        >>> sampan.grad(g, [x])                                   # (2.0,)
    """
    from ..tensor import Tensor
    single_out = isinstance(outputs, Tensor)
    outputs = [outputs] if single_out else list(outputs)
    single_in = isinstance(inputs, Tensor)
    inputs = [inputs] if single_in else list(inputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    for t in inputs:
        if not t.requires_grad:
            raise AutogradError("grad: one of the inputs does not require grad")
    gs = run_backward(outputs, list(grad_outputs), retain_graph, create_graph, capture=inputs)
    out = []
    for t, g in zip(inputs, gs):
        if g is None and not allow_unused:
            raise AutogradError(
                "grad: one of the inputs was not used to compute the outputs; "
                "pass allow_unused=True to get None for it")
        if g is not None and not create_graph and g._node is not None:
            g = g.detach()
        out.append(g)
    return tuple(out)


class no_grad:
    """Context manager / decorator that turns off tape recording."""

    def __init__(self, func=None):
        self._func = func

    def __enter__(self):
        self.prev = STATE.grad_enabled
        STATE.grad_enabled = False

    def __exit__(self, *exc):
        STATE.grad_enabled = self.prev

    def __call__(self, func):
        import functools

        @functools.wraps(func)
        def wrapper(*a, **k):
            with type(self)():
                return func(*a, **k)
        return wrapper


class enable_grad(no_grad):
    """Context manager / decorator that turns tape recording back on."""

    def __enter__(self):
        self.prev = STATE.grad_enabled
        STATE.grad_enabled = True


class set_grad_enabled(no_grad):
    def __init__(self, mode: bool):
        self.mode = mode
        self.prev = STATE.grad_enabled
        STATE.grad_enabled = mode

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        STATE.grad_enabled = self.prev


def is_grad_enabled() -> bool:
    return STATE.grad_enabled
