"""Control flow: If, Loop, Scan (opset 8's batched form and 9+), their bodies run through
the import table (`sampan/onnx/subgraph.py`).

Eagerly (no trace) every value is known, so a branch is taken and a loop runs its body
once per iteration, as Python. Under `sampan.jit` tracing (`sampan.onnx.load`) they
become the graph's own control flow: If -> `sampan.cond`, Scan -> `sampan.scan`, a Loop
with a fixed trip count (its condition passed through unchanged) -> `sampan.scan` over the
iteration numbers, any other Loop without scan outputs -> `sampan.while_loop` (its trip
count M as `max_iterations` when known). What cannot be a node is unrolled when the values
that steer it are known when the graph is built (a predicate folded from shapes, a Loop
carrying a sequence, a body that needs its iteration number as a constant: a Slice start);
else the handler refuses, naming the node.
"""
from __future__ import annotations

import numpy as np

import sampan
from ...ops.registry import STATE
from ...tensor import Tensor
from ..subgraph import Opt, Seq, run_subgraph, subgraph_attr
from . import OnnxError, onnx_op
from .shape import norm_axis

_NEEDS_STATIC = "must be known when the graph is built"


def known(ctx, t):
    """The numpy value of `t` when it is known now (static, or eager), else None."""
    if t is None or not isinstance(t, Tensor):
        return None
    if ctx.is_static(t):
        return ctx.static(t)
    d = t._data
    return d if isinstance(d, np.ndarray) else None


def tracing() -> bool:
    return STATE.tracer is not None


def _tensors(ctx, outs, what):
    for o in outs:
        if not isinstance(o, Tensor):
            raise ctx.error(f"{what} gives a {type(o).__name__} value: under sampan.jit a "
                            "branch or body that is a graph node carries tensors only "
                            "(sequences and optionals unroll only where the values "
                            "steering them are known when the graph is built)")
    return outs


def _as_tuple(x):
    if x is None:
        return ()
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _static_fallback(ctx, build, unroll, what):
    """`build()` (the graph node); where its body needs a value to be known when the
    graph is built, `unroll()` if given, else a clear error."""
    try:
        return build()
    except OnnxError as e:
        if _NEEDS_STATIC not in str(e) or unroll is None:
            raise
        return unroll()


# ---------------------------------------------------------------------- If
@onnx_op("If", since=1)
def if_(ctx, node, cond):
    then_g = subgraph_attr(ctx, node, "then_branch")
    else_g = subgraph_attr(ctx, node, "else_branch")
    if cond is None or not isinstance(cond, Tensor) or int(np.prod(cond.shape)) != 1:
        raise ctx.error(f"the condition must be a one-element tensor; got "
                        f"{list(cond.shape) if isinstance(cond, Tensor) else cond!r}")
    if len(then_g.outputs) != len(else_g.outputs):
        raise ctx.error(f"then_branch gives {len(then_g.outputs)} outputs and else_branch "
                        f"{len(else_g.outputs)}; they must give as many")
    p = known(ctx, cond)
    if p is not None:
        return tuple(run_subgraph(ctx, then_g if bool(p.reshape(())) else else_g, []))
    pred = cond if cond.ndim == 0 else sampan.reshape(cond, ())

    def branch(g, what):
        def fn():
            outs = _tensors(ctx, run_subgraph(ctx, g, [], what), what)
            return outs[0] if len(outs) == 1 else tuple(outs)
        return fn
    try:
        outs = sampan.cond(pred, branch(then_g, "then_branch"), branch(else_g, "else_branch"))
    except OnnxError:
        raise
    except Exception as e:  # noqa: BLE001 - the branches' types disagree, say
        raise ctx.error(f"the branches cannot be one sampan.cond node: {e}") from None
    return _as_tuple(outs)


# ---------------------------------------------------------------------- Loop
def _passes_cond_through(body):
    """Whether the body's condition output is its condition input unchanged (a Loop
    with such a body runs exactly M iterations)."""
    out, cin = body.outputs[0], body.inputs[1]
    for _ in range(len(body.nodes) + 1):
        if out == cin:
            return True
        src = [n for n in body.nodes if out in n.outputs]
        if len(src) != 1 or src[0].op_type != "Identity":
            return False
        out = src[0].inputs[0]
    return False


def _stack(ctx, node, rows, body, k, what):
    """Scan output `k` of a body from its per-iteration rows (none: an empty tensor of the
    declared element shape)."""
    if rows:
        return sampan.stack(list(rows), 0)
    vi = body.proto.output[k]
    tt = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if not tt.HasField("shape") or None in dims or not tt.elem_type:
        raise ctx.error(f"{what} ran no iteration and the body's output {vi.name!r} has no "
                        "static shape: the empty output's shape is unknown")
    from onnx import helper
    return ctx.make_static(np.zeros([0, *dims], helper.tensor_dtype_to_np_dtype(tt.elem_type)))


@onnx_op("Loop", since=1)
def loop(ctx, node, m=None, cond=None, *v):
    body = subgraph_attr(ctx, node, "body")
    n_v = len(v)
    n_scan = len(body.outputs) - 1 - n_v
    if len(body.inputs) != 2 + n_v or n_scan < 0:
        raise ctx.error(f"the body takes {len(body.inputs)} inputs and gives "
                        f"{len(body.outputs)} outputs; with {n_v} loop-carried values it "
                        f"must take {2 + n_v} (iteration, condition, values) and give at "
                        f"least {1 + n_v}")
    mk = known(ctx, m)
    ck = known(ctx, cond)
    if m is not None and mk is None or cond is not None and ck is None or (
            tracing() and not any(isinstance(x, (Seq, Opt)) for x in v)):
        if not tracing():
            raise ctx.error("the trip count and condition are not known")
        unroll = (lambda: _loop_unrolled(ctx, node, body, mk, ck, v, n_scan)) \
            if (m is None or mk is not None) and (cond is None or ck is not None) else None
        return _static_fallback(
            ctx, lambda: _loop_node(ctx, node, body, m, mk, cond, ck, v, n_scan), unroll,
            "Loop")
    return _loop_unrolled(ctx, node, body, mk, ck, v, n_scan)


def _loop_unrolled(ctx, node, body, mk, ck, v, n_scan):
    """The Loop run as Python: eager, or unrolled while the condition stays known."""
    limit = None if mk is None else int(np.asarray(mk).reshape(()))
    go = True if ck is None else bool(np.asarray(ck).reshape(()))
    carry, rows, i = list(v), [[] for _ in range(n_scan)], 0
    while go and (limit is None or i < limit):
        outs = run_subgraph(ctx, body, [ctx.make_static(np.array(i, np.int64)),
                                        ctx.make_static(np.array(True)), *carry], "the body")
        c = known(ctx, outs[0])
        if c is None:
            raise ctx.error("the body's condition is computed from data while the loop is "
                            "unrolled (it carries sequences, or its body needs its "
                            "iteration number as a constant)")
        go = bool(np.asarray(c).reshape(()))
        carry = outs[1:1 + len(v)]
        for r, y in zip(rows, outs[1 + len(v):]):
            r.append(y)
        i += 1
        if limit is None and i > 10_000_000:
            raise ctx.error("the loop ran 10,000,000 iterations without stopping")
    return (*carry, *[_stack(ctx, node, r, body, 1 + len(v) + k, "the Loop")
                      for k, r in enumerate(rows)])


def _loop_node(ctx, node, body, m, mk, cond, ck, v, n_scan):
    """The Loop as one sampan.scan (fixed trip count) or sampan.while_loop node."""
    for x in v:
        if not isinstance(x, Tensor):
            raise ctx.error(f"a loop-carried {type(x).__name__} cannot be carried by a "
                            "graph node (only tensors)")
    n_v = len(v)
    start = True if ck is None else bool(np.asarray(ck).reshape(()))
    if mk is not None and start and _passes_cond_through(body):
        count = int(np.asarray(mk).reshape(()))

        def step(carry, i):
            outs = run_subgraph(ctx, body, [i, sampan.tensor(np.array(True)), *carry],
                                "the body")
            _tensors(ctx, outs[1:], "the body")
            return tuple(outs[1:1 + n_v]), tuple(outs[1 + n_v:]) or None
        if count == 0:
            return _loop_unrolled(ctx, node, body, mk, ck, v, n_scan)
        carry, ys = sampan.scan(step, tuple(v), sampan.tensor(np.arange(count, dtype=np.int64)))
        return (*_as_tuple(carry), *_as_tuple(ys))
    if n_scan:
        raise ctx.error(f"its {n_scan} scan outputs have as many rows as iterations, and "
                        f"{'the trip count M' if m is not None and mk is None else 'the condition'}"
                        " is computed from data: the number of rows is not known when the "
                        "graph is built (sampan's graphs are statically shaped); give the "
                        "loop a constant trip count and pass its condition through")
    limit = None if mk is None else int(np.asarray(mk).reshape(()))
    bound = m if m is not None and mk is None else None
    c0 = cond if cond is not None else sampan.tensor(np.array(True))
    if c0.ndim:
        c0 = sampan.reshape(c0, ())
    if c0.dtype != np.bool_:
        c0 = sampan.cast(c0, np.bool_)

    def keep_going(i, c, *carry):
        if bound is None:
            return c
        return sampan.logical_and(c, i < sampan.reshape(bound, ()))

    def step(i, c, *carry):
        outs = _tensors(ctx, run_subgraph(ctx, body, [i, c, *carry], "the body"), "the body")
        nc = outs[0] if outs[0].ndim == 0 else sampan.reshape(outs[0], ())
        if nc.dtype != np.bool_:
            nc = sampan.cast(nc, np.bool_)
        return (i + 1, nc, *outs[1:])
    init = (sampan.tensor(np.array(0, np.int64)), c0, *v)
    out = sampan.while_loop(keep_going, step, init, max_iterations=limit)
    return tuple(out[2:])


# ---------------------------------------------------------------------- Scan
def _scan(ctx, node, body, states, xs, in_dirs, in_axes, out_dirs, out_axes):
    """Scan (opset 9 semantics) of `xs` along their scan axes; returns states + outputs."""
    n_s, n_x = len(states), len(xs)
    n_y = len(body.outputs) - n_s
    if len(body.inputs) != n_s + n_x or n_y < 0:
        raise ctx.error(f"the body takes {len(body.inputs)} inputs and gives "
                        f"{len(body.outputs)} outputs; with {n_s} states and {n_x} scan "
                        f"inputs it must take {n_s + n_x} and give at least {n_s}")
    for what, lst, n in (("scan_input_directions", in_dirs, n_x),
                         ("scan_input_axes", in_axes, n_x),
                         ("scan_output_directions", out_dirs, n_y),
                         ("scan_output_axes", out_axes, n_y)):
        if len(lst) != n:
            raise ctx.error(f"{what} has {len(lst)} entries; expected {n}")
    seq = []
    for x, d, a in zip(xs, in_dirs, in_axes):
        a = norm_axis(ctx, a, x.ndim, "scan_input_axes")
        x = x if a == 0 else sampan.moveaxis(x, a, 0)
        seq.append(sampan.flip(x, 0) if d else x)
    lengths = {int(x.shape[0]) for x in seq}
    if len(lengths) > 1:
        raise ctx.error(f"the scan inputs have different lengths {sorted(lengths)} along "
                        "their scan axes")
    length = lengths.pop() if lengths else 0

    def finish(carry, ys):
        res = list(carry)
        for k, (y, d, a) in enumerate(zip(ys, out_dirs, out_axes)):
            y = sampan.flip(y, 0) if d else y
            a = norm_axis(ctx, a, y.ndim, "scan_output_axes")
            res.append(y if a == 0 else sampan.moveaxis(y, 0, a))
        return tuple(res)

    def unrolled():
        carry, rows = list(states), [[] for _ in range(n_y)]
        for t in range(length):
            outs = run_subgraph(ctx, body, [*carry, *[x[t] for x in seq]], "the body")
            carry = outs[:n_s]
            for r, y in zip(rows, outs[n_s:]):
                r.append(y)
        return finish(carry, [_stack(ctx, node, r, body, n_s + k, "the Scan")
                              for k, r in enumerate(rows)])

    if not tracing() or length == 0 or not all(isinstance(s, Tensor) for s in states):
        return unrolled()

    def build():
        def step(carry, x):
            outs = _tensors(ctx, run_subgraph(ctx, body, [*carry, *_as_tuple(x)], "the body"),
                            "the body")
            return tuple(outs[:n_s]), tuple(outs[n_s:]) or None
        carry, ys = sampan.scan(step, tuple(states), tuple(seq))
        return finish(_as_tuple(carry), _as_tuple(ys))
    return _static_fallback(ctx, build, unrolled, "Scan")


def _scan_attrs(ctx, node, n_x, n_y, dirs_name):
    return (list(node.attr(dirs_name, [0] * n_x)), list(node.attr("scan_input_axes", [0] * n_x)),
            list(node.attr("scan_output_directions", [0] * n_y)),
            list(node.attr("scan_output_axes", [0] * n_y)))


@onnx_op("Scan", since=9)
def scan9(ctx, node, *ins):
    body = subgraph_attr(ctx, node, "body")
    n_x = node.attr("num_scan_inputs")
    if not isinstance(n_x, int) or not 0 < n_x <= len(ins):
        raise ctx.error(f"num_scan_inputs={n_x!r}; expected 1 to {len(ins)}")
    states, xs = list(ins[:len(ins) - n_x]), list(ins[len(ins) - n_x:])
    n_y = len(body.outputs) - len(states)
    return _scan(ctx, node, body, states, xs,
                 *_scan_attrs(ctx, node, n_x, n_y, "scan_input_directions"))


@onnx_op("Scan", since=8)
def scan8(ctx, node, seq_lens, *ins):
    """Opset 8: a batch axis first (scan axis 1), per-batch `sequence_lens` (only the full
    length is supported), input `directions`."""
    body = subgraph_attr(ctx, node, "body")
    n_x = node.attr("num_scan_inputs")
    if not isinstance(n_x, int) or not 0 < n_x <= len(ins):
        raise ctx.error(f"num_scan_inputs={n_x!r}; expected 1 to {len(ins)}")
    states, xs = list(ins[:len(ins) - n_x]), list(ins[len(ins) - n_x:])
    batch = int(xs[0].shape[0])
    if seq_lens is not None:
        lens = known(ctx, seq_lens)
        if lens is None or any(int(n) != int(xs[0].shape[1]) for n in np.ravel(lens)):
            raise ctx.error(f"sequence_lens {None if lens is None else lens.tolist()}: only "
                            f"the full length ({xs[0].shape[1]}) of every batch entry is "
                            "supported")
    n_y = len(body.outputs) - len(states)
    dirs = list(node.attr("directions", [0] * n_x))
    per = [_scan(ctx, node, body, [s[b] for s in states], [x[b] for x in xs], dirs,
                 [0] * n_x, [0] * n_y, [0] * n_y) for b in range(batch)]
    return tuple(sampan.stack([p[k] for p in per], 0) for k in range(len(states) + n_y))
