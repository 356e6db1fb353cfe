"""Gradients through a jitted call, taken from outside it (as `torch.compile`, `jax.jit`).

When a jitted call reads tensors that require grad (arguments, a Layer's Parameters) with
grad mode on, and the function does not run backward itself, the trace goes on past the
function's return: it adds one input per differentiable output (the cotangent) and runs
the tape backward over the traced tape, so that the gradient rules, which are ops, are
traced too. That joint graph is cut in two:

- the forward graph, which also returns the *residuals*: the values of the forward
  (inputs or intermediates) that the gradient reads;
- the backward graph, from (residuals, cotangents) to the gradient of each input.

Both are optimised and compiled once per signature, like any trace. Each call then
gives its outputs one tape node (`jit:<name>`) holding that call's residuals; the tape
engine runs the compiled backward when a gradient reaches it, and accumulates the result
into `.grad` (or into the tape of an argument computed eagerly) as eager would. The
tensors whose arrays are residuals are inputs of that node, so changing one in place
before backward raises, as in eager.

Example::

    >>> f = sampan.jit(lambda x: (x.tanh() * x).sum())
    >>> x = sampan.randn(3, requires_grad=True)
    >>> f(x).backward(); x.grad                  # = eager's gradient
    >>> print(f.backward_graph)
"""
from __future__ import annotations

import functools
import weakref

import numpy as np

from ..errors import AutogradError, SampanError
from ..ir.graph import Graph
from ..ops.registry import STATE, OpDef, Spec
from ..tensor import wrap


class VJP:
    """The traced gradient of one traced signature (see module doc)."""

    def __init__(self, name, graph, diff_out, wrt=(), keep=(), n_res=0, error=None):
        self.name = name
        self.graph = graph           # backward Graph: (residuals..., cotangents...) -> grads
        self.raw_graph = graph.copy() if graph is not None else None
        self.diff_out = diff_out     # positions (among the "out" leaves) that get a gradient
        self.wrt = wrt               # refs of the inputs whose gradients the graph returns
        self.keep = keep             # refs of other tensors whose arrays are residuals
        self.n_res = n_res
        self.error = error           # why there is no gradient to run (a message) or None
        # per gradient returned, the cotangents (output positions) it depends on: an
        # input that no output reached by a backward depends on gets None, as in eager
        self.deps = _cot_deps(graph, n_res) if graph is not None else ()
        self.compiled = None
        self.options = None          # (pipeline, debug, memory_plan): compiled on first use
        self.copy_res = frozenset()  # residuals the call's state write-back would overwrite
        self.aliases = []            # per residual: the input position it may share, or None
        saves = tuple(i for i, r in enumerate(list(wrt) + list(keep)) if r[1])
        self.refs = [r[0] for r in wrt] + [r[0] for r in keep]
        self.op = OpDef(f"jit:{name}", _no_shape_rule, grad=self._grad,
                        n_out=max(1, len(diff_out)), saves=saves)

    def compile(self, pipeline=None, debug=None, memory_plan=None):
        """Optimise and compile the backward graph (at the first backward through a call:
        calls that are never differentiated pay no compile time for it)."""
        from ..passes import PassManager
        from ..runtime import compile_graph
        if pipeline is None:
            if self.options is None or self.graph is None or self.compiled is not None:
                return
            pipeline, debug, memory_plan = self.options
        pm = PassManager(pipeline, debug=debug)
        if not memory_plan:
            pm.passes = [p for p in pm.passes if p != "plan_memory"]
        self.graph = pm.run(self.graph)
        self.timings = pm.timings
        self.compiled = compile_graph(self.graph, debug=debug, name="backward_fn")

    def attach(self, outs, args, res, watch=()):
        """Give this call's differentiable outputs (`outs`, the "out" leaves) a tape node
        that holds the call's residual arrays `res`. `watch`: (output, residual index)
        for outputs whose arrays are residuals: changing one in place before backward
        raises, as eager does for a saved output (tanh's, softmax's …)."""
        from ..autograd.tape import Node, _ver
        from .slots import target as _target
        ys = tuple(outs[i] for i in self.diff_out)
        if not ys:
            return
        inputs = tuple(outs[r[1]] if type(r) is tuple and r[0] == "out" else _target(r, args)
                       for r in self.refs)
        seen = tuple((weakref.ref(y), _ver(y)) for y, _ in watch)
        attrs = {"ctx": res, "outs": seen}
        if len(ys) > 1:
            # the engine gives outputs no gradient reached zeros: the node's hooks (run
            # with the gradients that did arrive) say which ones were reached
            attrs["reached"] = reached = set()
        node = Node(self.op, inputs, attrs, ys)
        if len(ys) > 1:
            for i in range(len(ys)):
                node.add_hook(i, functools.partial(_reach, reached, i))
        for i, y in enumerate(ys):
            y._node, y._idx, y.requires_grad = node, i, True

    def _grad(self, g, y, *inputs, ctx, outs=(), reached=None):
        if self.error is not None:
            raise AutogradError(self.error)
        from ..autograd.tape import _ver
        for ref, v in outs:
            t = ref()
            if t is not None and _ver(t) != v:
                raise AutogradError(
                    f"backward through the jitted call {self.name}: an output of shape "
                    f"{tuple(t.shape)} that its gradient reads was modified in place after "
                    f"the call (version {v} -> {_ver(t)}); clone it before modifying it "
                    "in place")
        if self.graph is None:        # nothing outside the call requires grad
            return (None,) * len(self.refs)
        if STATE.grad_enabled or STATE.tracer is not None:
            raise AutogradError(
                f"sampan.jit: a backward with create_graph=True (or inside another trace) "
                f"reached the jitted call {self.name}, whose compiled gradient is not itself "
                "differentiable. Jit the function that computes the gradient instead "
                "(e.g. sampan.jit(sampan.experimental.func.grad(f))), or call it eagerly.")
        if self.compiled is None:
            self.compile()
        gs = (g,) if len(self.diff_out) == 1 else tuple(g)
        cots = []
        for k, (gi, v) in enumerate(zip(gs, self.graph.inputs[self.n_res:])):
            a = gi._data if gi is not None else np.zeros(v.shape, v.dtype)
            if tuple(a.shape) != tuple(v.shape):
                raise AutogradError(
                    f"sampan.jit: the gradient reaching output {k} of {self.name} has shape "
                    f"{tuple(a.shape)}; expected {tuple(v.shape)}, the output's shape")
            cots.append(a if a.dtype == v.dtype else a.astype(v.dtype))
        outs = self.compiled(*ctx, *cots)
        grads = [wrap(a) for a in outs]
        if reached is not None:
            got = frozenset(reached)
            reached.clear()                 # for a later backward (retain_graph)
            grads = [None if d and not d & got else gi for gi, d in zip(grads, self.deps)]
        return tuple(grads) + (None,) * len(self.keep)


def _reach(reached, i, g):
    reached.add(i)


def _cot_deps(bw, n_res):
    """Per output of the backward graph `bw`, the frozenset of cotangent positions it
    reads (through any chain of nodes); read before passes fold anything away."""
    deps = {v.id: frozenset((k,)) for k, v in enumerate(bw.inputs[n_res:])}
    for n in bw.nodes:
        d = frozenset().union(*(deps.get(v.id, frozenset()) for v in n.inputs))
        for v in n.outputs:
            deps[v.id] = d
    return tuple(deps.get(v.id, frozenset()) for v in bw.outputs)


def _no_shape_rule(*a, **k):
    raise SampanError("a jit:<name> tape node is not an op of the table")


class _AtLine:
    """A tape node's op while the call's gradient is traced: the nodes its gradient rule
    adds take the source line of the forward op (`%9 = tanh_grad(..)  # model.py:12`)."""

    __slots__ = ("_op", "_tr", "_loc")

    def __init__(self, op, tr, loc):
        self._op, self._tr, self._loc = op, tr, loc

    def __getattr__(self, name):
        return getattr(self._op, name)

    def grad(self, *args, **kwargs):
        prev, self._tr.loc = self._tr.loc, self._loc or None
        try:
            return self._op.grad(*args, **kwargs)
        finally:
            self._tr.loc = prev


def _reaches_outside(tr, roots):
    """Whether the traced tape from `roots` reaches a node this trace did not record."""
    seen = set()
    stack = [t._node for t in roots if t._node is not None]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n not in tr.tape:
            return True
        stack.extend(m for m in n.edges[::2] if m is not None)
    return False


class _BornLeaf:
    """A leaf that requires grad, made by the traced code and returned (`w =
    sampan.ones(3, requires_grad=True)`): eager gives each call's a gradient, so the
    call's gradient has one for it (its ref: ("out", position among the out leaves))."""

    __slots__ = ("t", "ref", "root", "value")

    def __init__(self, t, k):
        self.t, self.ref, self.root, self.value = t, ("out", k), None, None


def born_leaves(tr, outs):
    """[_BornLeaf] of the "out" leaves `outs` that the traced code made as leaves requiring
    grad (from data, or by a creation op such as `sampan.ones`)."""
    return [_BornLeaf(t, k) for k, t in enumerate(outs)
            if t.requires_grad and t._node is None and id(t) not in tr.lifted]


def trace_vjp(tr, name, outs, born=()):
    """Trace the gradient of the call whose trace `tr` holds; `outs` are its "out" leaves
    (then tensors it gave a history in place), `born` its `born_leaves`.

    Cuts `tr.g` back to the forward graph and returns (VJP, residual Values) or None when
    nothing the call read requires grad."""
    from ..autograd.engine import run_backward
    g = tr.g
    mine = {id(b.t) for b in born}
    diff = [i for i, t in enumerate(outs) if t.requires_grad and not isinstance(
        t._data, np.ndarray) and id(t) not in mine]
    wrt = [L for L in tr.lifted.values() if L.rg and L.t.requires_grad
           and tr.slots[g.inputs.index(L.value)][0] in ("arg", "state")] + list(born)
    if not diff:
        return None
    if not wrt:      # the outputs require grad through tensors made inside the call only
        return VJP(name, None, diff), []
    from .slots import ref_of as _ref_of
    n_nodes, n_inputs = len(g.nodes), len(g.inputs)
    slots = list(tr.slots)
    error = None
    final = False
    grads = None
    hooks = [(L.t, L.t._hooks) for L in wrt]
    ops = [(n, n.op) for n in tr.tape]
    try:
        if _reaches_outside(tr, [outs[i] for i in diff]):
            raise AutogradError("an output depends on a tape recorded outside the call")
        cots = [wrap(tr._input(outs[i]._data.shape, outs[i]._data.dtype, ("cot", k),
                               f"grad_out{k}")) for k, i in enumerate(diff)]
        for t, _ in hooks:      # the engine runs the inputs' hooks when it gets there
            t._hooks = None
        tr.vjp_mode = True
        for n, op in ops:
            n.op = _AtLine(op, tr, tr.tape[n])
        grads = run_backward([outs[i] for i in diff], cots, True, False,
                             capture=[_as_lifted(L) for L in wrt])
        grads = [None if gt is None else tr.value_of(gt) for gt in grads]
        if len(g.inputs) != n_inputs + len(diff):
            raise AutogradError("the gradient reads tensors the forward did not")
    except Exception as e:   # the forward still runs; its backward says why it cannot
        error = str(e).split("\n")[0]
        if getattr(e, "no_gradient", False):     # no gradient exists (a rule says why)
            error = "\n".join(str(e).split("\n")[:2])
            final = True
        if not isinstance(e, SampanError):
            error = f"{type(e).__name__}: {error}"
    finally:
        tr.vjp_mode = False
        for n, op in ops:
            n.op = op
        for t, h in hooks:
            t._hooks = h
    bw_nodes = g.nodes[n_nodes:]
    cot_vals = g.inputs[n_inputs:]
    g.nodes, g.inputs = g.nodes[:n_nodes], g.inputs[:n_inputs]
    tr.slots[:] = slots[:n_inputs]
    if error is not None:
        g.prune_consts()
        if final:
            return VJP(name, None, diff, error=(
                f"sampan.jit: the jitted call {name} has no gradient: {error}")), []
        return VJP(name, None, diff, error=(
            f"sampan.jit: the gradient of the jitted call {name} could not be traced "
            f"({error}). Put the backward inside the jitted function (loss.backward() "
            "before it returns), or call the function without sampan.jit.")), []
    # residuals: forward values (inputs or node results) the backward reads
    fwd = {v.id for v in g.inputs} | {v.id for n in g.nodes for v in n.outputs}
    res, seen = [], set()
    for v in [u for n in bw_nodes for u in n.inputs] + [gv for gv in grads if gv is not None]:
        if v.id in fwd and v.id not in seen:
            seen.add(v.id)
            res.append(v)
    bw = Graph(f"{g.name}_backward")
    m = {}
    for v in res:
        m[v.id] = bw.add_input(v.shape, v.dtype, v.name)
    for v in cot_vals:
        m[v.id] = bw.add_input(v.shape, v.dtype, v.name)
    const_ids = {c.id for c in g.consts}
    for n in bw_nodes:
        for v in n.inputs:
            if v.id not in m and v.id in const_ids:
                m[v.id] = bw.add_const(v.const, name=v.name)
        nn = bw.add_node(n.op, [m[v.id] for v in n.inputs], n.attrs,
                         [Spec(v.shape, v.dtype) for v in n.outputs], loc=n.loc,
                         blocks=n.blocks)
        for v, nv in zip(n.outputs, nn.outputs):
            m[v.id] = nv
    for gv in grads:
        if gv is not None and gv.id not in m:      # a constant gradient
            m[gv.id] = bw.add_const(gv.const, name=gv.name)
    bw.outputs = [m[gv.id] for gv in grads if gv is not None]
    g.prune_consts()
    in_pos = {v.id: k for k, v in enumerate(g.inputs)}
    aliases = residual_aliases(g, res)
    # inputs whose arrays the residuals are or view: changing one before backward raises
    res_inputs = {g.inputs[k].id for k in aliases if k is not None}
    wrt_refs = [(L.ref, False) if type(L) is _BornLeaf else
                (_ref_of(tr, L.t), L.value.id in res_inputs)
                for L, gv in zip(wrt, grads) if gv is not None]
    keep = []
    for L in tr.lifted.values():      # other tensors whose arrays the gradient reads
        if L.value.id in res_inputs and not any(L is W for W, gv in zip(wrt, grads)
                                                if gv is not None):
            if tr.slots[in_pos[L.value.id]][0] in ("arg", "state"):
                keep.append((_ref_of(tr, L.t), True))
    vjp = VJP(name, bw, diff, wrt_refs, keep, len(res))
    vjp.aliases = aliases
    return vjp, res


def _as_lifted(L):
    """The tensor whose gradient is the gradient of the lifted input `L`: the tensor
    itself, or, when an in-place op of the call gave it a new history, a stand-in at its
    place when lifted (the gradient of the value it came in with)."""
    t = L.t
    if L.root is None or t._node is L.root:
        return t
    s = wrap(L.value)
    s._node, s._idx, s.requires_grad = L.root, 0, True
    return s


def ran_backward(name, outs):
    """A VJP for a call that ran backward itself: its outputs' graph is used up."""
    diff = [i for i, t in enumerate(outs) if t.requires_grad and not isinstance(
        t._data, np.ndarray)]
    if not diff:
        return None
    return VJP(name, None, diff, error=(
        f"sampan.jit: the jitted call {name} ran backward() itself, which used up the graph "
        "of its outputs (as in eager, where a second backward through them fails). Return "
        "the loss detached, or move that backward() out of the jitted function: jitted "
        "calls are differentiable from outside."))


def residual_aliases(g, res):
    """For each residual, the position of the graph input whose array it may share
    (itself, or through views), or None. Such an input must not be donated (updated in
    place by the forward), and if the call writes it back, the residual is copied."""
    from ..ops.registry import OPS
    pos = {v.id: k for k, v in enumerate(g.inputs)}
    made = {v.id: n for n in g.nodes for v in n.outputs}
    out = []
    for v in res:
        k = None
        while True:
            if v.id in pos:
                k = pos[v.id]
                break
            n = made.get(v.id)
            # getitem with basic indexing only (no index tensors) is a numpy view too
            if n is None or not n.inputs or not (OPS[n.op].view or (
                    n.op == "getitem" and len(n.inputs) == 1)):
                break
            v = n.inputs[0]
        out.append(k)
    return out
