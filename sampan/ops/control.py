"""(issue 34) Control flow: `cond`, `while_loop` and `scan`, as op-table entries whose nodes
hold nested Graphs (`Node.blocks`), and the public functions `sampan.cond`,
`sampan.while_loop`, `sampan.scan`.

Eagerly the functions run Python (so the eager tape differentiates them as it would the
Python code); while `sampan.jit` traces, each becomes one node whose blocks are traced
functions (`sampan/jit/blocks.py`). The node contract (shared with gradients, ONNX and
the decode example):

- `cond`: inputs ``[pred, *operands, *captures]`` (pred a scalar: shape (), bool or
  numeric); blocks ``[then, else]``, each taking operands + captures 1:1 and returning
  the same types, which are the node's outputs; attrs ``{"n_operands": k}``.
- `while_loop`: inputs ``[*carry_init, *captures]``; blocks ``[cond, body]``; attrs
  ``{"n_carry": k, "max_iterations": int or None}``; cond maps carry + captures to one
  bool scalar, body to the new carry (the carry's types). Outputs: the final carry.
- `scan`: inputs ``[*carry_init, *xs, *captures]``; blocks ``[body]``; attrs
  ``{"n_carry": k, "n_xs": m, "length": L, "reverse": bool}``; body maps carry + one
  slice of each x (leading dim dropped) + captures to new carry + ys. Outputs: the final
  carry, then each y stacked along a new leading dim of length L.

A block reads nothing from the enclosing graph: closures over outer values are inputs of
the node (captures, after the user's operands). The shape rules read the blocks (passed
as `blocks=`; the op table sits below `ir/`, so blocks are used through their fields
only), and compare types structurally: a symbolic dim is the same text on both sides.
The numpy kernels interpret the blocks node by node (`run_block`), the reference the jit
codegen's real Python `if`/`while`/`for` is checked against.

Example::

    >>> y = sampan.cond(x.sum() > 0, lambda a: a * 2, lambda a: -a, x)
    >>> i, s = sampan.while_loop(lambda i, s: i < 10, lambda i, s: (i + 1, s * 2), (i0, s0))
    >>> h, hs = sampan.scan(lambda h, x: ((h + x).tanh(),) * 2, h0, xs)
"""
from __future__ import annotations

import numpy as np

from .. import _recorder as _rec
from .. import dtypes as _dt
from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ..ir import symbolic as _sym
from ..tensor import Tensor
from ._util import Sample, randf, rng
from .control_grad import GRADS
from .registry import NO_ONNX, OPS, STATE, Spec, defop

EXPORTS = ["cond", "while_loop", "scan"]
CONTROL_OPS = ("cond", "while_loop", "scan")
# the Graph class, handed in by `sampan.jit` (the op table sits below `ir/`): the samples
# build their blocks with it
GRAPH: list = []


# ---------------------------------------------------------------------- types
def _dim_key(d):
    if isinstance(d, str):              # a symbolic dim, or a "$expr" attribute (length)
        return _sym.attr_text(d) if _sym.is_attr(d) else d
    if hasattr(d, "expr"):           # a SymInt while tracing: its expression
        return d.text
    return int(d)


def _type_key(x):
    return tuple(_dim_key(d) for d in x.shape), np.dtype(x.dtype)


def _tstr(x):
    return f"{_dt.short_name(np.dtype(x.dtype))}[{','.join(map(str, x.shape))}]"


def _types_str(xs):
    return "(" + ", ".join(_tstr(x) for x in xs) + ")"


def _same_types(op, what_a, a, what_b, b):
    a, b = list(a), list(b)
    if len(a) != len(b) or any(_type_key(x) != _type_key(y) for x, y in zip(a, b)):
        raise op_error(ShapeError, op, f"{what_a} {_types_str(a)} and {what_b} "
                       f"{_types_str(b)}", "the same number of values with the same shapes "
                       "and dtypes")


def _blocks(op, blocks, n):
    if blocks is None or len(blocks) != n:
        raise op_error(ShapeError, op, f"{0 if blocks is None else len(blocks)} blocks",
                       f"{n} nested graphs (Node.blocks)")
    return blocks


def _cond_rule(pred, *rest, n_operands, blocks=None):
    then, other = _blocks("cond", blocks, 2)
    if tuple(pred.shape) != ():
        raise op_error(ShapeError, "cond", f"a predicate of type {_tstr(pred)}",
                       "a scalar (shape ()) predicate")
    for b in (then, other):
        _same_types("cond", "operands and captures", rest, f"the inputs of block {b.name}",
                    b.inputs)
    _same_types("cond", "a then branch returning", then.outputs, "an else branch returning",
                other.outputs)
    return [Spec(tuple(v.shape), v.dtype) for v in then.outputs]


def _while_rule(*ins, n_carry, max_iterations=None, blocks=None):
    cnd, body = _blocks("while_loop", blocks, 2)
    for b in (cnd, body):
        _same_types("while_loop", "carry and captures", ins, f"the inputs of block {b.name}",
                    b.inputs)
    if len(cnd.outputs) != 1 or tuple(cnd.outputs[0].shape) != () or \
            np.dtype(cnd.outputs[0].dtype) != np.bool_:
        raise op_error(DTypeError, "while_loop", f"a condition returning "
                       f"{_types_str(cnd.outputs)}", "one bool scalar (b8[])")
    _same_types("while_loop", "a carry of", ins[:n_carry], "a body returning", body.outputs)
    if max_iterations is not None and (not isinstance(max_iterations, int)
                                       or max_iterations < 0):
        raise op_error(SampanValueError, "while_loop", f"max_iterations={max_iterations!r}",
                       "None or an int >= 0")
    return [Spec(tuple(v.shape), v.dtype) for v in ins[:n_carry]]


def _scan_rule(*ins, n_carry, n_xs, length, reverse=False, blocks=None):
    (body,) = _blocks("scan", blocks, 1)
    carry, xs, caps = ins[:n_carry], ins[n_carry:n_carry + n_xs], ins[n_carry + n_xs:]
    for x in xs:
        if len(x.shape) == 0 or _dim_key(x.shape[0]) != _dim_key(length):
            raise op_error(ShapeError, "scan", f"an xs of type {_tstr(x)}",
                           f"a leading dim of the scan's length {length}")
    slices = [Spec(tuple(x.shape[1:]), x.dtype) for x in xs]
    _same_types("scan", "carry, slices of xs and captures", list(carry) + slices + list(caps),
                f"the inputs of block {body.name}", body.inputs)
    if len(body.outputs) < n_carry:
        raise op_error(ShapeError, "scan", f"a body returning {len(body.outputs)} values",
                       f"the {n_carry} carry values, then the ys")
    _same_types("scan", "a carry of", carry, "a body returning", body.outputs[:n_carry])
    dim = _sym.attr_text(length) if isinstance(length, str) and _sym.is_attr(length) \
        else length                  # a symbolic length ("$seq") is the dim "seq"
    return [Spec(tuple(v.shape), v.dtype) for v in carry] + [
        Spec((dim,) + tuple(v.shape), v.dtype) for v in body.outputs[n_carry:]]


# ---------------------------------------------------------------------- kernels
def run_block(g, arrays):
    """Run block `g` on `arrays` through the op table's default kernels, node by node (the
    reference interpreter; the jit compiles blocks instead)."""
    env = {v.id: a for v, a in zip(g.inputs, arrays)}
    for c in g.consts:
        env[c.id] = c.const
    for n in g.nodes:
        op = OPS[n.op]
        args = [env[v.id] for v in n.inputs]
        out = op.kernel(*args, blocks=n.blocks, **n.attrs) if n.blocks else \
            op.kernel(*args, **n.attrs)
        for v, a in zip(n.outputs, [out] if op.n_out == 1 else list(out)):
            env[v.id] = np.asarray(a)
    return [env[v.id] for v in g.outputs]


def _cond_kernel(pred, *rest, n_operands, blocks):
    return tuple(run_block(blocks[0] if bool(pred) else blocks[1], rest))


def _while_kernel(*ins, n_carry, max_iterations=None, blocks):
    carry, caps = list(ins[:n_carry]), list(ins[n_carry:])
    it = 0
    while max_iterations is None or it < max_iterations:
        if not bool(run_block(blocks[0], carry + caps)[0]):
            break
        carry = run_block(blocks[1], carry + caps)
        it += 1
    return tuple(carry)


def _scan_kernel(*ins, n_carry, n_xs, length, reverse=False, blocks):
    body = blocks[0]
    carry = list(ins[:n_carry])
    xs, caps = ins[n_carry:n_carry + n_xs], list(ins[n_carry + n_xs:])
    ys = [np.empty((length,) + tuple(v.shape), v.dtype) for v in body.outputs[n_carry:]]
    for i in (range(length - 1, -1, -1) if reverse else range(length)):
        out = run_block(body, carry + [x[i, ...] for x in xs] + caps)
        carry = out[:n_carry]
        for y, a in zip(ys, out[n_carry:]):
            y[i] = a
    return tuple(carry) + tuple(ys)


def _block_flops(g):
    n = 0
    for node in g.nodes:
        op = OPS[node.op]
        if op.flops is None:
            continue
        specs = [Spec(tuple(v.shape), v.dtype) for v in node.inputs]
        try:
            n += int(op.flops(*specs, blocks=node.blocks, **node.attrs) if node.blocks
                     else op.flops(*specs, **node.attrs))
        except Exception:   # noqa: BLE001 - a symbolic size: no count for this node
            pass
    return n


def _flops_of(per_iteration):
    def flops(*specs, blocks=None, **attrs):
        if not blocks:
            return 0
        return per_iteration(blocks, attrs)
    return flops


_cond_flops = _flops_of(lambda bs, a: max(_block_flops(b) for b in bs))
# the trip count of a while loop is data: one iteration (its bound, where given)
_while_flops = _flops_of(lambda bs, a: (a.get("max_iterations") or 1) * sum(
    _block_flops(b) for b in bs))
_scan_flops = _flops_of(lambda bs, a: int(a["length"]) * _block_flops(bs[0]))


# ---------------------------------------------------------------------- samples
def _graph(name, types):
    g = GRAPH[0](name)
    for shape, dtype in types:
        g.add_input(shape, dtype)
    return g


def _cond_samples():
    r = rng(34)
    x = randf(r, 3, 4)
    then, other = _graph("then", [(x.shape, x.dtype)]), _graph("else", [(x.shape, x.dtype)])
    then.outputs = [then.add_node("relu", [then.inputs[0]], {}).output]
    other.outputs = [other.add_node("neg", [other.inputs[0]], {}).output]
    attrs = {"n_operands": 1, "blocks": [then, other]}
    return [Sample((np.array(True), x), attrs, diff=()),
            Sample((np.array(0.0, np.float32), x), attrs, diff=())]


def _while_samples():
    r = rng(35)
    x = randf(r, 4)
    i = np.array(0, np.int64)
    types = [((), i.dtype), (x.shape, x.dtype)]
    cnd, body = _graph("cond", types), _graph("body", types)
    three = cnd.add_const(np.array(3, np.int64))
    cnd.outputs = [cnd.add_node("lt", [cnd.inputs[0], three], {}).output]
    one = body.add_const(np.array(1, np.int64))
    body.outputs = [body.add_node("add", [body.inputs[0], one], {}).output,
                    body.add_node("sin", [body.inputs[1]], {}).output]
    return [Sample((i, x), {"n_carry": 2, "max_iterations": None, "blocks": [cnd, body]},
                   diff=()),
            Sample((i, x), {"n_carry": 2, "max_iterations": 2, "blocks": [cnd, body]},
                   diff=())]


def _scan_samples():
    r = rng(36)
    h, xs = randf(r, 3), randf(r, 5, 3)
    body = _graph("body", [(h.shape, h.dtype), (h.shape, h.dtype)])
    s = body.add_node("add", list(body.inputs), {}).output
    t = body.add_node("tanh", [s], {}).output
    body.outputs = [t, t]
    return [Sample((h, xs), {"n_carry": 1, "n_xs": 1, "length": 5, "reverse": rev,
                             "blocks": [body]}, diff=()) for rev in (False, True)]


for _name, _rule, _kernel, _fl, _samp, _doc in (
        ("cond", _cond_rule, _cond_kernel, _cond_flops, _cond_samples,
         "run block then or else on the operands, as the scalar predicate says"),
        ("while_loop", _while_rule, _while_kernel, _while_flops, _while_samples,
         "run block body on the carry while block cond says so (at most max_iterations)"),
        ("scan", _scan_rule, _scan_kernel, _scan_flops, _scan_samples,
         "run block body over the leading dim of xs, threading the carry, stacking ys")):
    # ONNX If/Loop/Scan are written by the exporter (sampan/onnx), which walks the blocks
    defop(_name, _rule, kernel=_kernel, kind="opaque", grad=GRADS[_name], flops=_fl,
          onnx=NO_ONNX, samples=_samp, n_out=None, doc=_doc)


# ---------------------------------------------------------------------- public functions
def _tensors(x, op, what):
    """(list of Tensors, whether `x` was one Tensor) of a Tensor or a tuple/list of them."""
    if isinstance(x, Tensor):
        return [x], True
    if isinstance(x, (tuple, list)) and all(isinstance(t, Tensor) for t in x):
        return list(x), False
    got = type(x).__name__ if not isinstance(x, (tuple, list)) else \
        "a sequence holding " + ", ".join(sorted({type(t).__name__ for t in x}))
    raise op_error(DTypeError, op, f"{what} of type {got}", "a Tensor or a tuple of Tensors")


def _pack(ts, single):
    return ts[0] if single else tuple(ts)


def _check_pred(op, p, what):
    if not isinstance(p, Tensor) or tuple(p.shape) != ():
        got = _tstr(p._data) if isinstance(p, Tensor) else type(p).__name__
        raise op_error(ShapeError, op, f"{what} {got}", "a scalar (shape ()) Tensor")


def cond(pred, true_fn, false_fn, *operands):
    """`true_fn(*operands)` if `pred` else `false_fn(*operands)`; both return a Tensor or a
    tuple of Tensors of the same types. Under `sampan.jit`, one `cond` node holding both
    branches (a Python `if` on a traced value cannot be traced). A Python bool `pred`
    just picks the branch.

    Example: ``y = sampan.cond(x.sum() > 0, lambda a: a * 2, lambda a: -a, x)``"""
    ops_, _ = _tensors(list(operands), "cond", "operands")
    if isinstance(pred, (bool, np.bool_)):
        return (true_fn if pred else false_fn)(*operands)
    _check_pred("cond", pred, "a predicate")
    tr = STATE.tracer
    if tr is not None:
        return tr.control("cond", pred, true_fn, false_fn, ops_)
    out = (true_fn if bool(np.asarray(pred._data)) else false_fn)(*operands)
    _tensors(out, "cond", "a branch returning")
    return out


def while_loop(cond_fn, body_fn, init, max_iterations=None):
    """Run `carry = body_fn(*carry)` while `cond_fn(*carry)` (a bool scalar Tensor) is true,
    at most `max_iterations` times when given; `init` is a Tensor or a tuple of Tensors,
    and the body keeps its structure and types. Returns the final carry. Under
    `sampan.jit`, one `while_loop` node holding both functions.

    Example: ``i, s = sampan.while_loop(lambda i, s: i < n, lambda i, s: (i + 1, s * 2),
    (i0, s0))``"""
    carry, single = _tensors(init, "while_loop", "init")
    if max_iterations is not None and (isinstance(max_iterations, bool) or not isinstance(
            max_iterations, (int, np.integer)) or max_iterations < 0):
        raise op_error(SampanValueError, "while_loop", f"max_iterations={max_iterations!r}",
                       "None or an int >= 0")
    max_iterations = None if max_iterations is None else int(max_iterations)
    tr = STATE.tracer
    if tr is not None:
        return tr.control("while_loop", cond_fn, body_fn, carry, single, max_iterations)
    t0, it = _rec.now(), [0]
    try:
        return _pack(_while_eager(cond_fn, body_fn, carry, max_iterations, it), single)
    finally:
        _loop_span("while_loop", t0, it[0])


def _loop_span(name, t0, iterations):
    """Under the profiler, one "control" span around an eager loop, holding its iteration
    count; the ops its body ran are events nested inside it (the profile adds their
    per-op summary to the span when it ends, `sampan.profiler.session`)."""
    if _rec.ACTIVE:
        _rec.emit(name, "control", t0, _rec.now() - t0, iterations=iterations)


def _while_eager(cond_fn, body_fn, carry, max_iterations, it):
    while max_iterations is None or it[0] < max_iterations:
        c = cond_fn(*carry)
        _check_pred("while_loop", c, "cond_fn returning")
        if c.dtype != _dt.bool_:
            raise op_error(DTypeError, "while_loop", f"cond_fn returning {_tstr(c._data)}",
                           "a bool scalar (b8[])")
        if not bool(np.asarray(c._data)):
            break
        new, _ = _tensors(body_fn(*carry), "while_loop", "body_fn returning")
        _same_types("while_loop", "a carry of", [t._data for t in carry],
                    "body_fn returning", [t._data for t in new])
        carry = new
        it[0] += 1
    return carry


def scan(fn, init, xs, reverse=False):
    """`fn(carry, x) -> (new_carry, y)` over the leading dim of `xs`, threading the carry;
    carry, x and y are a Tensor or a tuple of Tensors (y may be None). Returns
    `(final_carry, ys)`, ys stacked on dim 0 (in xs order also when `reverse`). Under
    `sampan.jit`, one `scan` node: its graph holds one body, whatever the length.

    Example: ``h, hs = sampan.scan(lambda h, x: ((h + x).tanh(),) * 2, h0, xs)``"""
    carry, csingle = _tensors(init, "scan", "init")
    xl, xsingle = _tensors(xs, "scan", "xs")
    lens = {t.shape[0] if t.ndim else None for t in xl}
    if None in lens or len(lens) != 1:
        raise op_error(ShapeError, "scan", "xs of types " + _types_str([t._data for t in xl]),
                       "tensors with one leading dim (the scan's length) in common")
    length = next(iter(lens))
    if isinstance(length, int) and not hasattr(length, "expr") and length < 1:
        raise op_error(ShapeError, "scan", "xs of length 0", "at least one step")
    tr = STATE.tracer
    if tr is not None:
        return tr.control("scan", fn, carry, csingle, xl, xsingle, bool(reverse))
    t0, it = _rec.now(), [0]
    try:
        return _scan_eager(fn, carry, csingle, xl, xsingle, length, reverse, it)
    finally:
        _loop_span("scan", t0, it[0])


def _scan_eager(fn, carry, csingle, xl, xsingle, length, reverse, it):
    steps = [None] * length
    ystruct = None
    for i in (range(length - 1, -1, -1) if reverse else range(length)):
        out = fn(_pack(carry, csingle), _pack([x[i] for x in xl], xsingle))
        new, y = _step_result(out)
        _same_types("scan", "a carry of", [t._data for t in carry], "fn returning",
                    [t._data for t in new])
        carry = new
        it[0] += 1
        steps[i] = y
        ystruct = y[1] if ystruct is None else ystruct
    from .shape import stack
    if steps[0][0] is None:
        return _pack(carry, csingle), None
    ys = [stack([s[0][j] for s in steps]) for j in range(len(steps[0][0]))]
    return _pack(carry, csingle), _pack(ys, ystruct)


def _step_result(out):
    """((new carry list), (ys list or None, whether y was one Tensor)) of fn's result."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise op_error(DTypeError, "scan", f"fn returning {type(out).__name__}",
                       "a pair (new_carry, y)")
    new, _ = _tensors(out[0], "scan", "fn returning a carry")
    if out[1] is None:
        return new, (None, True)
    ys, single = _tensors(out[1], "scan", "fn returning a y")
    return new, (ys, single)
