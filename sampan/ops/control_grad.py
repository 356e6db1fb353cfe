"""Gradient rules of the control-flow ops `cond`, `scan` and `while_loop`.

Like every rule of the op table, these are written with ops, so that the gradient is
itself a graph: here the backward of a control node is another control node whose blocks
are the backward of the forward's blocks.

- `cond`: a `cond` on the same predicate whose two blocks map (operands, captures,
  cotangents) to the gradients of the operands and captures: each recomputes its
  branch and runs the branch's gradient rules (only the taken branch runs).
- `scan`: a forward scan that gradients will reach also stacks, as extra ys, the carry
  each step starts from (the residuals of its body); the backward is a scan in the
  other direction over (xs, stacked carries, cotangents of the ys) that carries the
  cotangent of the carry and the sum of the captures' gradients, and stacks the xs'
  gradients.
- `while_loop`: differentiable when `max_iterations` is given. A forward loop that
  gradients will reach also carries its iteration count n; the backward is a scan of
  `max_iterations` steps that replays the n iterations (later steps pass the carry
  through, without running the body) and stacks the carry each starts from, a
  preallocated buffer of that many steps, then a reverse scan over the buffer that runs
  the body's gradient where the step is below n. Without `max_iterations` the backward
  raises an error that says so.

Blocks are built by tracing a Python function (the `build` hook: `sampan.jit`
registers its nested tracer; the op table sits below jit and imports nothing from it)
that *replays* a block's nodes through `apply`, so the forward's gradient rules run
inside it and are traced, and nested control nodes replay through `emit` (the same hook
that records the forward nodes), so a `cond` inside a `scan` body differentiates too.
Where grad mode is on while a backward node is built (`create_graph=True`), that node is
recorded on the tape like any other and can be differentiated again (second order).
"""
from __future__ import annotations

import numpy as np

from ..errors import AutogradError, SampanError
from .registry import Spec

# set by sampan.jit (jit/control_vjp.py): build(name, specs, fn) -> Graph traces fn over
# fresh inputs of `specs` into a block; emit(op, inputs, attrs, blocks, n_user) adds a
# control node to the current trace and records it for gradients
HOOKS = {"build": None, "emit": None}


def set_hooks(build, emit) -> None:
    """Install the block builder and the control-node emitter (sampan.jit does)."""
    HOOKS["build"], HOOKS["emit"] = build, emit


def _hook(name):
    fn = HOOKS[name]
    if fn is None:
        raise SampanError("control-flow gradients: sampan.jit is not loaded (import sampan)")
    return fn


def floating(dtype) -> bool:
    d = np.dtype(dtype)
    return d.kind == "f" or d.name == "bfloat16"


def emit(op, inputs, attrs, blocks):
    """Add control node `op` over tensors `inputs` to the current trace; its outputs (a
    tuple of tensors). Recorded for gradients where grad mode is on."""
    return _hook("emit")(op, list(inputs), dict(attrs), list(blocks))


def build(name, specs, fn):
    return _hook("build")(name, [Spec(tuple(s.shape), s.dtype) for s in specs], fn)


def spec(t, drop=0):
    """Spec of tensor (or Value) `t`, without its first `drop` dims."""
    d = getattr(t, "_data", t)
    return Spec(tuple(d.shape)[drop:], d.dtype)


def replay(block, args):
    """Run `block`'s nodes on tensors `args` (one per block input) through the op table:
    traced into the current trace, and recorded on the tape where grad mode is on."""
    from ..tensor import apply, wrap
    from .registry import OPS
    env = {id(v): a for v, a in zip(block.inputs, args)}
    for c in block.consts:
        env[id(c)] = wrap(c.const)
    for n in block.nodes:
        ins = [env[id(v)] for v in n.inputs]
        if n.blocks:
            outs = emit(n.op, ins, n.attrs, n.blocks)
        else:
            outs = apply(OPS[n.op], tuple(ins), dict(n.attrs))
            outs = outs if isinstance(outs, tuple) else (outs,)
        for v, o in zip(n.outputs, outs):
            env[id(v)] = o
    return [env[id(v)] for v in block.outputs]


def leaf(t):
    """A fresh leaf requiring grad on the same value (what a block's gradient is taken
    with respect to)."""
    from ..tensor import wrap
    x = wrap(t._data)
    x.requires_grad = True
    return x


def pull(block, args, wrt, cots):
    """Replay `block` on `args` and return (outputs, gradients of sum(out_j * cot_j)
    with respect to args[i] for i in `wrt`); `cots` maps output positions to cotangent
    tensors. Unreached gradients are zeros. Runs inside a `build`."""
    from ..autograd.engine import enable_grad, run_backward
    from .creation import zeros_like
    args = list(args)
    for i in wrt:
        args[i] = leaf(args[i])
    with enable_grad():
        outs = replay(block, args)
    roots = [(outs[j], c) for j, c in cots.items() if outs[j].requires_grad]
    gs = [None] * len(wrt)
    if roots:
        gs = run_backward([r for r, _ in roots], [c for _, c in roots], True, False,
                          capture=[args[i] for i in wrt])
    return outs, [zeros_like(args[i]) if g is None else g for i, g in zip(wrt, gs)]


def given(g, n):
    """The cotangents of a node's `n` outputs as a list, None where the engine filled in
    zeros for an output no gradient reached (a concrete all-zero array)."""
    gs = list(g) if n != 1 else [g]
    return [None if x is None or (isinstance(x._data, np.ndarray) and not x._data.any())
            else x for x in gs]


def _no_gradient(msg, loc):
    """The error of a rule that has no gradient to give: names the user's line (`loc`,
    the forward node's) and is not worth retrying elsewhere."""
    e = AutogradError(msg + (f"\n  at {loc}" if loc else ""))
    e.no_gradient = True
    return e


def _wants(t):
    return t.requires_grad and floating(t._data.dtype)


# --------------------------------------------------------------------------- cond
def cond_grad(g, y, pred, *rest, n_operands, blocks, loc=None):
    """Gradient of `cond`: a `cond` on `pred` over the branches' backward blocks."""
    n_out = len(blocks[0].outputs)
    gs = given(g, n_out)
    wrt = [i for i, t in enumerate(rest) if _wants(t)]
    co = [j for j, c in enumerate(gs) if c is not None and floating(blocks[0].outputs[j].dtype)]
    if not wrt or not co:
        return (None,) * (1 + len(rest))
    cots = [gs[j] for j in co]
    specs = [spec(t) for t in rest] + [spec(c) for c in cots]
    n = len(rest)

    def back(block):
        def fn(*a):
            return pull(block, a[:n], wrt, dict(zip(co, a[n:])))[1]
        return fn

    bt = build(blocks[0].name + "_grad", specs, back(blocks[0]))
    bf = build(blocks[1].name + "_grad", specs, back(blocks[1]))
    res = emit("cond", [pred, *rest, *cots], {"n_operands": n + len(cots)}, [bt, bf])
    out = [None] * n
    for i, r in zip(wrt, res):
        out[i] = r
    return (None, *out)


# --------------------------------------------------------------------------- scan
def scan_residual_body(body, n_carry):
    """`body` that also returns, as extra ys, the carry each step starts from."""
    specs = [spec(v) for v in body.inputs]

    def fn(*a):
        return replay(body, a) + list(a[:n_carry])
    return build(body.name, specs, fn)


def scan_grad(g, y, *inputs, n_carry, n_xs, length, reverse, blocks, n_user, loc=None):
    """Gradient of a residual-stacking `scan` (see `scan_residual_body`): a scan in the
    other direction. `n_user`: the node's outputs before the stacked carries."""
    from .creation import zeros_like
    k, m = n_carry, n_xs
    c0, xs, caps = inputs[:k], inputs[k:k + m], inputs[k + m:]
    body = blocks[0]
    n_out = len(body.outputs)               # k + ys + k stacked carries
    gs = given(g, n_out)
    carries = y[n_user:n_user + k]
    fc = [i for i in range(k) if floating(c0[i]._data.dtype)]
    wx = [j for j in range(m) if _wants(xs[j])]
    wp = [q for q in range(len(caps)) if _wants(caps[q])]
    cy = [j for j in range(k, n_out) if gs[j] is not None and floating(body.outputs[j].dtype)]
    need = [i for i in fc if c0[i].requires_grad]
    if not (need or wx or wp) or not (cy or any(gs[i] is not None for i in fc)):
        return (None,) * len(inputs)
    dc0 = [gs[i] if gs[i] is not None else zeros_like(y[i]) for i in fc]
    dp0 = [zeros_like(caps[q]) for q in wp]
    dys = [gs[j] for j in cy]
    nf, nw = len(fc), len(wp)
    specs = ([spec(t) for t in dc0] + [spec(t) for t in dp0] + [spec(t, 1) for t in xs]
             + [spec(t, 1) for t in carries] + [spec(t, 1) for t in dys]
             + [spec(t) for t in caps])

    def fn(*a):
        dc, dp = a[:nf], a[nf:nf + nw]
        o = nf + nw
        x_t, c_t = a[o:o + m], a[o + m:o + m + k]
        dy_t = a[o + m + k:o + m + k + len(cy)]
        cp = a[o + m + k + len(cy):]
        cots = dict(zip(fc, dc))
        cots.update(zip(cy, dy_t))
        args = list(c_t) + list(x_t) + list(cp)
        wrt = fc + [k + j for j in wx] + [k + m + q for q in wp]
        _, grads = pull(body, args, wrt, cots)
        g_c, g_x, g_p = grads[:nf], grads[nf:nf + len(wx)], grads[nf + len(wx):]
        return list(g_c) + [d + e for d, e in zip(dp, g_p)] + list(g_x)

    bb = build(body.name + "_grad", specs, fn)
    res = emit("scan", [*dc0, *dp0, *xs, *carries, *dys, *caps],
               {"n_carry": nf + nw, "n_xs": m + k + len(cy), "length": length,
                "reverse": not reverse}, [bb])
    out = [None] * len(inputs)
    for i, r in zip(fc, res[:nf]):
        out[i] = r if c0[i].requires_grad else None
    for q, r in zip(wp, res[nf:nf + nw]):
        out[k + m + q] = r
    for j, r in zip(wx, res[nf + nw:]):
        out[k + j] = r
    return tuple(out)


# --------------------------------------------------------------------------- while_loop
I64 = Spec((), np.dtype(np.int64))


def while_counting_blocks(cond_b, body, n_carry):
    """The cond and body of a while_loop that also carries its iteration count: carry
    (i, *carry), then the captures."""
    specs = [I64] + [spec(v) for v in body.inputs]

    def c_fn(i, *a):
        return replay(cond_b, a)

    def b_fn(i, *a):
        return [i + 1] + replay(body, a)

    return [build(cond_b.name, specs, c_fn), build(body.name, specs, b_fn)]


def _gated(name, specs, n_pass, block, args, n_ops):
    """`cond(args[0], block, pass-through of the first n_pass operands)` over args[1:]."""
    skip = build(name, specs, lambda *a: list(a[:n_pass]))
    return list(emit("cond", args, {"n_operands": n_ops}, [block, skip]))


def while_grad(g, y, *inputs, n_carry, max_iterations, blocks, n_user, body=None,
               loc=None):
    """Gradient of a counting `while_loop` (see `while_counting_blocks`) that ran n of at
    most `max_iterations` iterations: a scan of `max_iterations` steps replays the n
    iterations (steps past n pass the carry through) and stacks the carry each starts
    from, a preallocated buffer of that many steps; a reverse scan over that buffer runs
    the body's gradient at the steps below n. Without `max_iterations`: an error."""
    if max_iterations is None or body is None:
        raise _no_gradient(
            "while_loop: the gradient of a loop without max_iterations is not defined "
            "(its residuals need a buffer of known size): pass max_iterations=N to "
            "sampan.while_loop (an upper bound on the iterations) to differentiate it", loc)
    from .creation import full, zeros_like
    k, n_max = n_carry, max_iterations
    c0, caps = inputs[:k], inputs[k:]
    p = len(caps)
    gs = given(g, len(y))
    n_it = y[k]
    fc = [i for i in range(k) if floating(c0[i]._data.dtype)]
    wp = [q for q in range(p) if _wants(caps[q])]
    if (not any(c0[i].requires_grad for i in fc) and not wp) or all(
            gs[i] is None for i in fc):
        return (None,) * len(inputs)
    dc0 = [gs[i] if gs[i] is not None else zeros_like(y[i]) for i in fc]
    dp0 = [zeros_like(caps[q]) for q in wp]
    nf, nw = len(fc), len(wp)
    out = [None] * len(inputs)
    if n_max == 0:
        for i, d in zip(fc, dc0):
            out[i] = d if c0[i].requires_grad else None
        return tuple(out)
    c_specs, p_specs = [spec(t) for t in c0], [spec(t) for t in caps]

    def replay_fn(t, *a):            # (t, *carry, n, *caps) -> (t + 1, *carry', *carry)
        c, n, cp = a[:k], a[k], a[k + 1:]
        return [t + 1] + _gated("skip", c_specs + p_specs, k, body, [t < n, *c, *cp],
                                k + p) + list(c)

    rb = build(body.name, [I64] + c_specs + [I64] + p_specs, replay_fn)
    res = emit("scan", [full((), 0, dtype="int64"), *c0, n_it, *caps],
               {"n_carry": 1 + k, "n_xs": 0, "length": n_max, "reverse": False}, [rb])
    stacks = res[1 + k:]
    v_specs = [spec(t) for t in dc0] + [spec(t) for t in dp0] + c_specs + p_specs

    def vjp_fn(*a):                  # (*dcarry, *dcaps, *carry, *caps) -> (dcarry, dcaps)
        dc, dp, c, cp = a[:nf], a[nf:nf + nw], a[nf + nw:nf + nw + k], a[nf + nw + k:]
        _, grads = pull(body, list(c) + list(cp), fc + [k + q for q in wp],
                        dict(zip(fc, dc)))
        return list(grads[:nf]) + [d + e for d, e in zip(dp, grads[nf:])]

    vb = build(body.name + "_grad", v_specs, vjp_fn)

    def back_fn(t, *a):              # (t, *dcarry, *dcaps, *carry_t, n, *caps)
        d, c = a[:nf + nw], a[nf + nw:nf + nw + k]
        n, cp = a[nf + nw + k], a[nf + nw + k + 1:]
        return [t - 1] + _gated("skip_grad", v_specs, nf + nw, vb, [t < n, *d, *c, *cp],
                                nf + nw + k + p)

    bb = build(body.name + "_grad", [I64] + v_specs[:nf + nw] + c_specs + [I64] + p_specs,
               back_fn)
    res = emit("scan", [full((), n_max - 1, dtype="int64"), *dc0, *dp0, *stacks, n_it,
                        *caps],
               {"n_carry": 1 + nf + nw, "n_xs": k, "length": n_max, "reverse": True}, [bb])
    for i, r in zip(fc, res[1:1 + nf]):
        out[i] = r if c0[i].requires_grad else None
    for q, r in zip(wp, res[1 + nf:1 + nf + nw]):
        out[k + q] = r
    return tuple(out)


GRADS = {"cond": cond_grad, "scan": scan_grad, "while_loop": while_grad}
