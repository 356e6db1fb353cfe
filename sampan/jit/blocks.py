"""Tracing control flow: `sampan.cond`, `sampan.while_loop` and `sampan.scan` called while
`sampan.jit` traces become one node each (`sampan/ops/control.py` has the node contract).

Each function the user passes is traced on its own into a block: a fresh Graph whose
inputs stand for the operands (or carry, or one slice of each x), run under the same
Tracer with `tracer.g` pointing at the block. The function may read values from outside
(a closure over an outer traced value, a Parameter): ops then name Values of an
enclosing graph, and closing the block (`_close`) turns each such Value into a new block
input, a *capture*, whose outer Value becomes a node input after the user's operands.
The blocks of one node share one list of captures (`_align`). Nested control flow closes
from the inside out: an inner node's captures are outer Values of the block it sits in,
captured again by that block when it closes.

Inside a block no tape is recorded (the node's outputs get one tape node, whose gradient
rule reads the blocks), constants are the block's own, and what cannot be a pure
function of the block's inputs is refused with the user's line: random ops (their key
would not advance per iteration) and in-place writes to tensors from outside the block.
"""
from __future__ import annotations

from ..errors import TracingError, user_frame
from ..ir.graph import Graph, Value
from ..ops import control as _control
from ..ops.registry import STATE
from ..tensor import wrap
from .control_vjp import emit as _emit

_control.GRAPH[:] = [Graph]      # the samples of the op table build blocks with it


def trace_control(tr, kind, *args):
    """The traced form of `sampan.<kind>(...)` (called through `Tracer.control`)."""
    return _KINDS[kind](tr, *args)


def _loc(tr):
    import os
    if tr.loc:
        return tr.loc
    fn, ln = user_frame()
    return f"{os.path.basename(fn)}:{ln}"


def _trace_fn(tr, name, types, run):
    """Trace `run(block input tensors) -> (output tensors, info)` into a new block; returns
    (block, captured outer Values, their tensors, info)."""
    blk = Graph(name)
    ins = []
    for shape, dtype in types:
        v = blk.add_input(shape, dtype)
        tr.own.add(id(v))
        ins.append(v)
    saved = (tr.g, tr.consts, STATE.grad_enabled)
    seen = {}
    tr.cf_seen.append(seen)
    if len(tr.cf_seen) == 1:           # record which tensor each outer Value came from
        orig = type(tr).value_of

        def value_of(t):
            v = orig(tr, t)
            for d in tr.cf_seen:
                d.setdefault(id(v), t)
            return v
        tr.value_of = value_of
    tr.g, tr.consts = blk, {}
    tr.block_depth += 1
    STATE.grad_enabled = False
    try:
        outs, info = run([wrap(v) for v in ins])
        blk.outputs = [tr.value_of(t) for t in outs]
    finally:
        tr.block_consts.extend(tr.consts.values())
        tr.g, tr.consts, STATE.grad_enabled = saved
        tr.block_depth -= 1
        tr.cf_seen.pop()
        if not tr.cf_seen:
            del tr.value_of
    caps = _close(blk)
    return blk, caps, [seen.get(id(v)) for v in caps], info


def _close(blk):
    """Make every Value `blk` reads from outside a new input of it (after the others);
    returns those outer Values in order."""
    defined = {id(v) for v in blk.inputs} | {id(c) for c in blk.consts}
    caps, inner = [], {}

    def get(v):
        if id(v) in defined:
            return v
        w = inner.get(id(v))
        if w is None:
            w = blk.add_input(v.shape, v.dtype)
            defined.add(id(w))
            inner[id(v)] = w
            caps.append(v)
        return w
    for n in blk.nodes:
        n.inputs = [get(v) for v in n.inputs]
        defined.update(id(v) for v in n.outputs)
    blk.outputs = [get(v) for v in blk.outputs]
    return caps


def _align(traced, n_fixed):
    """Give every block of one node the same captures (the union, in first-seen order):
    block inputs become its `n_fixed` own inputs + one per captured Value. Returns
    (captured Values, their tensors)."""
    union, tensors, pos = [], [], {}
    for _, caps, ts, _ in traced:
        for v, t in zip(caps, ts):
            if id(v) not in pos:
                pos[id(v)] = len(union)
                union.append(v)
                tensors.append(t)
    for blk, caps, _, _ in traced:
        mine = dict(zip((id(v) for v in caps), blk.inputs[n_fixed:]))
        extra = []
        for u in union:
            w = mine.get(id(u))
            extra.append(w if w is not None else Value(blk._new_id(), u.shape, u.dtype))
        blk.inputs = blk.inputs[:n_fixed] + extra
    return union, tensors


def _add(tr, kind, in_tensors, vals, attrs, blocks, loc):
    """Add the control node to the graph being traced; its outputs as Tensors (with one
    tape node when grad mode is on and an input requires grad: `control_vjp.emit`)."""
    for d in tr.cf_seen:          # an enclosing block captures these tensors' Values
        for v, t in zip(vals, in_tensors):
            if t is not None:
                d.setdefault(id(v), t)
    ins = [t if t is not None else wrap(v) for v, t in zip(vals, in_tensors)]
    return list(_emit(kind, ins, attrs, blocks, vals=vals, loc=loc))


def _cond(tr, pred, true_fn, false_fn, operands):
    loc = _loc(tr)
    pv = tr.value_of(pred)
    ovs = [tr.value_of(t) for t in operands]
    types = [(v.shape, v.dtype) for v in ovs]

    def runner(fn, what):
        def run(ins):
            return _control._tensors(fn(*ins), "cond", what)
        return run
    t1 = _trace_fn(tr, "then", types, runner(true_fn, "true_fn returning"))
    t2 = _trace_fn(tr, "else", types, runner(false_fn, "false_fn returning"))
    if t1[3] != t2[3]:
        raise TracingError(f"sampan.cond: true_fn returns {_what(t1[3])} and false_fn "
                           f"{_what(t2[3])}; both must return the same structure\n  at {loc}")
    caps, cts = _align([t1, t2], len(ovs))
    outs = _add(tr, "cond", [pred, *operands, *cts], [pv, *ovs, *caps],
                {"n_operands": len(ovs)}, [t1[0], t2[0]], loc)
    return _control._pack(outs, t1[3])


def _what(single):
    return "one Tensor" if single else "a tuple of Tensors"


def _while(tr, cond_fn, body_fn, carry, single, max_iterations):
    loc = _loc(tr)
    cvs = [tr.value_of(t) for t in carry]
    types = [(v.shape, v.dtype) for v in cvs]

    def run_cond(ins):
        c = cond_fn(*ins)
        _control._check_pred("while_loop", c, "cond_fn returning")
        return [c], True

    def run_body(ins):
        return _control._tensors(body_fn(*ins), "while_loop", "body_fn returning")
    t1 = _trace_fn(tr, "cond", types, run_cond)
    t2 = _trace_fn(tr, "body", types, run_body)
    caps, cts = _align([t1, t2], len(cvs))
    outs = _add(tr, "while_loop", [*carry, *cts], [*cvs, *caps],
                {"n_carry": len(cvs), "max_iterations": max_iterations}, [t1[0], t2[0]], loc)
    return _control._pack(outs, single)


def _scan(tr, fn, carry, csingle, xs, xsingle, reverse):
    loc = _loc(tr)
    cvs = [tr.value_of(t) for t in carry]
    xvs = [tr.value_of(t) for t in xs]
    k, m = len(cvs), len(xvs)
    types = [(v.shape, v.dtype) for v in cvs] + [(v.shape[1:], v.dtype) for v in xvs]

    def run(ins):
        new, (ys, ysingle) = _control._step_result(
            fn(_control._pack(ins[:k], csingle), _control._pack(ins[k:], xsingle)))
        return new + list(ys or []), (ys is None, ysingle)
    t = _trace_fn(tr, "body", types, run)
    caps, cts = _align([t], k + m)
    outs = _add(tr, "scan", [*carry, *xs, *cts], [*cvs, *xvs, *caps],
                {"n_carry": k, "n_xs": m, "length": xvs[0].shape[0], "reverse": reverse},
                [t[0]], loc)
    ynone, ysingle = t[3]
    return (_control._pack(outs[:k], csingle),
            None if ynone else _control._pack(outs[k:], ysingle))


_KINDS = {"cond": _cond, "while_loop": _while, "scan": _scan}


def check_block_write(tr, target, name):
    """Refuse an in-place write, inside a block, to a tensor the block did not make."""
    base = target._view[0] if target._view is not None else target
    d = base._data
    if isinstance(d, Value) and any(v is d for v in tr.g.values()):
        return
    fn, ln = user_frame()
    raise TracingError(
        f"sampan.jit: {name} inside a sampan.cond/while_loop/scan function writes to a "
        f"tensor from outside it\n  at {fn}:{ln}\nThe functions must be pure: return the "
        "new value (as part of the carry) instead of writing it in place.")
