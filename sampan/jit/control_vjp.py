"""Control-flow nodes in a trace, and the tape nodes that differentiate them.

`emit(op, inputs, attrs, blocks)` adds a `cond` / `while_loop` / `scan` node to the
current trace. Where grad mode is on and an input requires grad, it also records the
node on the tape, with the op's gradient rule (`ops/control_grad.py`) and the blocks
the rule reads; a scan then stacks its residuals (the carry each step starts from) and a
`while_loop` with `max_iterations` counts its iterations (its backward replays them into
a buffer of `max_iterations` steps), so that the backward, traced in turn, reads them as
the gradient of any op reads its inputs.

`build(name, specs, fn)` traces the Python function `fn` over fresh inputs of `specs`
into a Graph: a block. It uses a tracer of its own (nested in the current one), so a
block reads nothing from the enclosing graph. Both are installed as hooks of the op
table, which sits below jit.
"""
from __future__ import annotations

import os

import numpy as np

from ..errors import SampanError, user_frame
from ..ops import control_grad as _cg
from ..ops.registry import STATE, OpDef
from ..tensor import _record, wrap


def _loc(tr):
    if tr.loc:
        return tr.loc
    fn, ln = user_frame()
    return f"{os.path.basename(fn)}:{ln}"


def _no_rule(*a, **k):
    raise SampanError("a control-flow tape node is not an op of the table")


def build(name, specs, fn):
    """Trace `fn(*tensors)` (returning a list of tensors) into a new block Graph."""
    outer = STATE.tracer
    if outer is None:
        raise SampanError(f"{name}: a control-flow block is built only while tracing")
    tr = type(outer)(name)           # a Tracer of its own (jit/tracer.py imports this one)
    tr.env, tr.loc = outer.env, outer.loc
    prev = STATE.grad_enabled
    STATE.tracer = tr
    try:
        ins = [wrap(tr._input(s.shape, s.dtype, ("arg", i), f"in{i}"))
               for i, s in enumerate(specs)]
        outs = fn(*ins)
        vals = [tr.value_of(t) for t in outs]
    finally:
        STATE.tracer = outer
        STATE.grad_enabled = prev
    g = tr.g
    g.outputs = vals
    g.prune_consts()
    return g


def _zeros(shape, dtype):
    from ..ops.creation import zeros
    from ..dtypes import dtype_name
    return zeros(tuple(shape), dtype=dtype_name(np.dtype(dtype)))


def emit(op, inputs, attrs, blocks, vals=None, loc=None):
    """Add control node `op` over tensors `inputs` (with `blocks`; `vals`: their Values,
    when known) to the current trace and return its user-visible outputs (a tuple of
    tensors); see the module doc."""
    tr = STATE.tracer
    if tr is None:
        raise SampanError(f"{op}: a control-flow node is built only while tracing")
    if vals is None:
        vals = [tr.value_of(t) for t in inputs]
    loc = loc or _loc(tr)
    record = STATE.grad_enabled and any(t.requires_grad for t in inputs)
    g_vals, g_attrs, g_blocks = list(vals), dict(attrs), list(blocks)
    tape_attrs = dict(attrs, blocks=g_blocks)
    n_user = None
    if record and op == "scan":
        g_blocks = [_cg.scan_residual_body(blocks[0], attrs["n_carry"])]
        n_user = len(blocks[0].outputs)
        tape_attrs = dict(attrs, blocks=g_blocks, n_user=n_user)
    elif record and op == "while_loop":
        k, n = attrs["n_carry"], attrs.get("max_iterations")
        tape_attrs = dict(attrs, blocks=g_blocks, n_user=k, body=None)
        if n is not None:
            g_blocks = _cg.while_counting_blocks(blocks[0], blocks[1], k)
            g_vals = [tr.value_of(_zeros((), np.int64))] + list(vals)
            g_attrs["n_carry"] = 1 + k
            tape_attrs = dict(attrs, blocks=g_blocks, n_user=k, body=blocks[1])
    if tr.env is not None:
        with tr.env.quiet():
            node = tr.g.add_node(op, g_vals, g_attrs, loc=loc, blocks=g_blocks)
    else:
        node = tr.g.add_node(op, g_vals, g_attrs, loc=loc, blocks=g_blocks)
    outs = []
    for v in node.outputs:
        tr.own.add(id(v))
        outs.append(wrap(v))
    if len(g_vals) != len(vals):                     # while_loop: (n, carry)
        outs = outs[1:] + outs[:1]                   # carry, then the iteration count
    if record:
        tape_attrs["loc"] = loc
        top = OpDef(op, _no_rule, grad=_cg.GRADS[op], n_out=len(outs), save_output=True)
        _record(top, tuple(inputs), tape_attrs, tuple(outs))
        for y in outs:
            if y._node is not None:
                tr.tape[y._node] = loc
                break
    n_vis = n_user if n_user is not None else (attrs["n_carry"] if op == "while_loop"
                                              else len(outs))
    return tuple(outs[:n_vis])


_cg.set_hooks(build, emit)
