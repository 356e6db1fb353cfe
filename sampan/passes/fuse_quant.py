"""`fuse_quant`: turn the QDQ groups that `quantize` wrote into int8 ops, and keep the
activations int8 from one quantised layer to the next.

1. Each QDQ group around a matmul or conv2d becomes one int8 op:

    matmul(dequantize(quantize(x, sx, zx)), dequantize(Wq, sw, zw, axis=1))
        -> qmatmul(quantize(x, sx, zx), Wq^T, sx, zx, sw, zw, transposed=True)
    conv2d(dequantize(quantize(x, ...)), dequantize(Wq, sw, zw, axis=0), **attrs)
        -> qconv2d(quantize(x, ...), Wq, sx, zx, sw, zw, **attrs)

   Both accumulate int8 x int8 in int32 and give float32 (sx * sw per output channel);
   the matmul's weight is stored transposed, (N, K), the layout the int8 GEMM reads.
2. A layer whose float result only reaches the next layer's `quantize` (through its bias
   add, ReLU / clamp, and ops that commute with a per-tensor quantise: max_pool2d,
   reshape, concat) requantises in its own epilogue (issue 31):

    quantize(max_pool2d(relu(qconv2d(xq, W, ...) + b)), sy, zy)
        -> max_pool2d(qlinear_conv2d(xq, sx, zx, W, sw, zw, bq, sy, zy, qmin=zy))

   with the bias quantised to int32 at scale sx * sw (onnxruntime's QDQ bias), the ReLU
   or clamp folded into [qmin, qmax] (rint is monotonic, so this is exact), and max-pool,
   reshape and concat run on the int8 values (exact for the same reason). An activation
   read only by int8 layers travels as uint8 (zero point + 128: the same values, and the
   operand type the VNNI instruction multiplies without a conversion).
3. A layer left with a float result (the last one) becomes `qdense` (its bias add folded)
   when its weight is a constant with zero points 0.

The rewrite is exact against the QDQ graph except for float32 summation order and the
bias's int32 rounding (at most half of sx * sw per output). `dce` removes what is left.

Example: ``PassManager(["quantize", "fuse_quant", "dce"]).run(g)``
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Node, Value
from .manager import register_pass

_COMMUTE = ("max_pool2d", "reshape")   # one input; commute with a per-tensor quantise
_LAYER_X = {"qmatmul": 3, "qconv2d": 3, "qlinear_dense": 2, "qdense": 2,
            "qlinear_conv2d": 2}       # op -> index of its activation zero point
_RANGE = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}


def _producer(v, op):
    n = v.node
    return n if n is not None and n.op == op else None


def _const_qdq(v, axis):
    """(Wq, sw, zw) when v = dequantize(const int8 Wq, const sw, const zw, axis)."""
    dq = _producer(v, "dequantize")
    if dq is None or dq.attrs.get("axis", 1) % max(v.ndim, 1) != axis:
        return None
    if not all(u.is_const for u in dq.inputs) or dq.inputs[0].dtype != np.int8:
        return None
    return dq.inputs


def _act_qdq(v):
    """(q, sx, zx) when v = dequantize(q = quantize(x, sx, zx), sx, zx), per tensor."""
    dq = _producer(v, "dequantize")
    if dq is None:
        return None
    q = _producer(dq.inputs[0], "quantize")
    if q is None or dq.inputs[1].ndim or dq.inputs[2].ndim:
        return None
    if q.inputs[1] is not dq.inputs[1] or q.inputs[2] is not dq.inputs[2]:
        return None
    return dq.inputs[0], dq.inputs[1], dq.inputs[2]


def _qdq_to_int8(g):
    """Step 1 (see the module doc); returns whether anything changed."""
    transposed = {}
    rep = {}
    for i, n in enumerate(g.nodes):
        if n.op not in ("matmul", "conv2d") or len(n.inputs) != 2:
            continue
        axis = 1 if n.op == "matmul" else 0
        a, w = _act_qdq(n.inputs[0]), _const_qdq(n.inputs[1], axis)
        if a is None or w is None:
            continue
        q, sx, zx = a
        wq, sw, zw = w
        if n.op == "matmul":
            if n.inputs[0].ndim != 2 or wq.ndim != 2:
                continue
            if wq.id not in transposed:
                transposed[wq.id] = g.add_const(np.ascontiguousarray(wq.const.T),
                                                name=f"{wq.name}.T" if wq.name else None)
            new = Node("qmatmul", [q, transposed[wq.id], sx, zx, sw, zw],
                       {"transposed": True}, n.loc)
        else:
            new = Node("qconv2d", [q, wq, sx, zx, sw, zw], dict(n.attrs), n.loc)
        out = n.outputs[0]
        new.outputs.append(Value(out.id, out.shape, out.dtype, node=new))
        rep[i] = new
    if not rep:
        return False
    g.nodes = [rep.get(i, n) for i, n in enumerate(g.nodes)]
    ids = {n.outputs[0].id: n.outputs[0] for n in rep.values()}
    for n in g.nodes:
        n.inputs = [ids.get(v.id, v) if v.node is not None and v.id in ids else v
                    for v in n.inputs]
    g.outputs = [ids.get(v.id, v) for v in g.outputs]
    read = {v.id for n in g.nodes for v in n.inputs} | {v.id for v in g.outputs}
    # the activations' dequantize nodes now unread go now: step 2 counts readers
    g.nodes = [n for n in g.nodes if n.op != "dequantize" or n.outputs[0].id in read]
    return True


# ---------------------------------------------------------------------- step 2
class _Ctx:
    def __init__(self, g):
        self.g = g
        self.users = g.users()
        self.outs = {v.id for v in g.outputs}
        self.dead = set()          # id(node) of nodes replaced
        self.before = {}           # id(node) -> new nodes to insert before it

    def single(self, v):
        return len(self.users.get(v.id, ())) == 1 and v.id not in self.outs

    def node(self, op, inputs, attrs, shape, dtype, loc):
        n = Node(op, inputs, attrs, loc)
        n.outputs.append(Value(self.g._new_id(), shape, dtype, node=n))
        return n


def _const0(v):
    return v.is_const and np.asarray(v.const).ndim == 0


def _layer(v, ctx):
    """(layer node, bias const array or None, lo, hi): v = clamp(layer(...) + bias) over
    single-use values, the layer a qmatmul / qconv2d with constant weight and scales."""
    steps = []           # (kind, arg) from v back to the layer, outermost first
    nodes = []
    while True:
        n = v.node
        if n is None:
            return None
        if n.op in ("qmatmul", "qconv2d"):
            break
        if n.op == "relu":
            steps.append(("max", 0.0))
            v = n.inputs[0]
        elif n.op in ("maximum", "minimum", "add") and len(n.inputs) == 2:
            a, b = n.inputs
            if a.is_const and not b.is_const:
                a, b = b, a
            if not b.is_const or a.is_const:
                return None
            if n.op == "add":
                steps.append(("add", np.asarray(b.const)))
            elif _const0(b):
                steps.append(("max" if n.op == "maximum" else "min", float(b.const)))
            else:
                return None
            v = a
        elif n.op == "fused":
            got = _fused_steps(n)
            if got is None:
                return None
            idx, fsteps = got
            steps.extend(fsteps)
            v = n.inputs[idx]
        else:
            return None
        nodes.append(n)
        if not ctx.single(v):
            return None
    layer = v.node
    if layer.op == "qmatmul" and not layer.attrs.get("transposed"):
        return None
    if not all(u.is_const for u in layer.inputs[1:]):
        return None
    if np.any(np.asarray(layer.inputs[5].const)):
        return None                       # the kernels take symmetric weights
    bias, lo, hi = None, -np.inf, np.inf
    for kind, arg in reversed(steps):     # innermost first
        if kind == "add":
            if bias is not None or lo != -np.inf or hi != np.inf:
                return None
            bias = _channel_bias(arg, v)
            if bias is None:
                return None
        elif kind == "max":
            lo, hi = max(lo, arg), max(hi, arg)
        else:
            lo, hi = min(lo, arg), min(hi, arg)
    return layer, bias, lo, hi, nodes


def _fused_steps(n):
    """(index of the fused node's non-constant input, steps outermost first) when its body
    is a chain of add / relu / maximum / minimum over that input and constants."""
    body, outs = n.attrs["body"], n.attrs["outputs"]
    k = len(n.inputs)
    var = [i for i, u in enumerate(n.inputs) if not u.is_const]
    if len(var) != 1 or len(outs) != 1:
        return None
    cur = var[0]
    steps = []
    for j, e in enumerate(body):
        op, ix = e[0], tuple(e[1])
        if len(e) > 2 and e[2]:
            return None
        if cur not in ix:
            return None
        others = [i for i in ix if i != cur]
        if op == "relu" and not others:
            steps.append(("max", 0.0))
        elif op in ("add", "maximum", "minimum") and len(others) == 1 and others[0] < k:
            c = n.inputs[others[0]]
            if op == "add":
                steps.append(("add", np.asarray(c.const)))
            elif _const0(c):
                steps.append(("max" if op == "maximum" else "min", float(c.const)))
            else:
                return None
        else:
            return None
        cur = k + j
    if outs[0] != cur:
        return None
    return var[0], steps[::-1]


def _channel_bias(b, acc):
    """A bias of the layer's output channels as (C,) float32, or None if it is not one."""
    b = np.asarray(b, np.float32)
    c = acc.shape[1]
    if acc.ndim == 2 and b.shape in ((c,), (1, c)):
        return b.reshape(c)
    if acc.ndim == 4 and b.shape in ((c, 1, 1), (1, c, 1, 1)):
        return b.reshape(c)
    return None


def _int_bias(g, layer, bias):
    """The int32 bias at scale sx * sw (zeros when the layer has none)."""
    sx = np.float64(np.float32(layer.inputs[2].const))
    sw = np.asarray(layer.inputs[4].const, np.float32).astype(np.float64)
    c = layer.outputs[0].shape[1]
    if bias is None:
        return g.add_const(np.zeros(c, np.int32))
    q = np.rint(bias.astype(np.float64) / (sx * np.broadcast_to(sw, (c,))))
    return g.add_const(np.clip(q, -2 ** 31, 2 ** 31 - 1).astype(np.int32))


def _qbound(x, ys, yz):
    """The quantised value of the float bound x (or the type's end for an infinite one)."""
    if not np.isfinite(x):
        return None
    return int(np.rint(np.float32(x) / np.float32(ys))) + int(yz)


def _as_u8(ctx, q_out, zp):
    """The zero point as uint8 when every reader of q_out is an int8 layer's activation
    (then the values travel as uint8), else None."""
    us = ctx.users.get(q_out.id, ())
    if q_out.id in ctx.outs or not us or zp.dtype != np.int8:
        return None
    if not all(u.op in _LAYER_X and u.inputs[0] is q_out and
               u.inputs[_LAYER_X[u.op]] is not None for u in us):
        return None
    return ctx.g.add_const(np.asarray(int(zp.const) + 128, np.uint8))


def _retarget(ctx, old, new, zp_new):
    """Readers of `old` read `new`, and their activation zero point is `zp_new`."""
    for u in ctx.users.get(old.id, ()):
        u.inputs = [new if v is old else v for v in u.inputs]
        if zp_new is not None:
            u.inputs[_LAYER_X[u.op]] = zp_new
        ctx.users.setdefault(new.id, []).append(u)
    if old.id in ctx.outs:
        ctx.g.outputs = [new if v is old else v for v in ctx.g.outputs]
        ctx.outs.add(new.id)


def _requant(ctx, q):
    """Step 2 for the quantize node q; returns whether it was rewritten."""
    x, ys, yz = q.inputs
    if not (ys.is_const and yz.is_const and ys.ndim == 0 and yz.ndim == 0):
        return False
    passes = []
    v = x
    while v.node is not None and v.node.op in _COMMUTE and ctx.single(v):
        passes.append(v.node)
        v = v.node.inputs[0]
    got = _layer(v, ctx) if ctx.single(v) else None
    if got is None:
        return _plain_u8(ctx, q)
    layer, bias, flo, fhi, epi = got
    zp_u8 = _as_u8(ctx, q.outputs[0], yz)
    zy = yz if zp_u8 is None else zp_u8
    shift = 0 if zp_u8 is None else 128
    lo, hi = _RANGE[np.dtype(zy.dtype)]
    blo, bhi = _qbound(flo, ys.const, yz.const), _qbound(fhi, ys.const, yz.const)
    attrs = {}
    if blo is not None and blo + shift > lo:
        attrs["qmin"] = min(blo + shift, hi)
    if bhi is not None and bhi + shift < hi:
        attrs["qmax"] = max(bhi + shift, lo)
    xq, w, sx, zx, sw, zw = layer.inputs
    ins = [xq, sx, zx, w, sw, zw, _int_bias(ctx.g, layer, bias), ys, zy]
    acc = layer.outputs[0]
    if layer.op == "qmatmul":
        new = ctx.node("qlinear_dense", ins, attrs, acc.shape, zy.dtype, layer.loc)
    else:
        new = ctx.node("qlinear_conv2d", ins, dict(layer.attrs, **attrs), acc.shape,
                       zy.dtype, layer.loc)
    made = [new]
    cur = new.outputs[0]
    for p in reversed(passes):            # the commuting ops, now on int8
        o = p.outputs[0]
        m = ctx.node(p.op, [cur] + list(p.inputs[1:]), dict(p.attrs), o.shape, zy.dtype,
                     p.loc)
        made.append(m)
        cur = m.outputs[0]
    ctx.before.setdefault(id(q), []).extend(made)
    for n in [q, layer] + epi + passes:
        ctx.dead.add(id(n))
    _retarget(ctx, q.outputs[0], cur, zp_u8)
    ctx.users[xq.id] = [new if u is layer else u for u in ctx.users.get(xq.id, ())]
    return True


def _plain_u8(ctx, q):
    """A quantize that stays (the graph input's): uint8 when only int8 layers read it."""
    zp_u8 = _as_u8(ctx, q.outputs[0], q.inputs[2])
    if zp_u8 is None:
        return False
    o = q.outputs[0]
    new = ctx.node("quantize", [q.inputs[0], q.inputs[1], zp_u8], dict(q.attrs), o.shape,
                   np.dtype(np.uint8), q.loc)
    ctx.before.setdefault(id(q), []).append(new)
    ctx.dead.add(id(q))
    _retarget(ctx, o, new.outputs[0], zp_u8)
    ctx.users[q.inputs[0].id] = [new if u is q else u for u in ctx.users.get(q.inputs[0].id,
                                                                              ())]
    return True


def _concat(ctx, q):
    """quantize(concat(a, b, ...)) -> concat(quantize(a), quantize(b), ...) over single-use
    inputs (exact: the same scale and zero point on each part); returns the new quantize
    nodes, or None."""
    c = q.inputs[0].node
    if c is None or c.op != "concat" or not ctx.single(q.inputs[0]):
        return None
    if not all(ctx.single(u) and u.node is not None for u in c.inputs):
        return None
    qs = []
    for u in c.inputs:
        n = ctx.node("quantize", [u, q.inputs[1], q.inputs[2]], dict(q.attrs), u.shape,
                     q.outputs[0].dtype, q.loc)
        ctx.users[u.id] = [n]
        qs.append(n)
    o = q.outputs[0]
    cat = ctx.node("concat", [n.outputs[0] for n in qs], dict(c.attrs), o.shape, o.dtype,
                   c.loc)
    for n in qs:
        ctx.users[n.outputs[0].id] = [cat]
    ctx.before.setdefault(id(q), []).extend(qs + [cat])
    ctx.dead.update((id(q), id(c)))
    _retarget(ctx, o, cat.outputs[0], None)
    return qs


def _emit(ctx):
    nodes = []
    for n in ctx.g.nodes:
        for m in _expand(ctx, n):
            if id(m) not in ctx.dead:
                nodes.append(m)
    ctx.g.nodes = nodes
    ctx.dead.clear()
    ctx.before.clear()


def _expand(ctx, n):
    for m in ctx.before.get(id(n), ()):
        yield from _expand(ctx, m)
    yield n


def _chain(g):
    """Step 2 over every quantize of the graph, the first layers first."""
    ctx = _Ctx(g)
    todo = [n for n in g.nodes if n.op == "quantize"]
    changed = False
    while todo:
        q = todo.pop(0)
        if id(q) in ctx.dead:
            continue
        parts = _concat(ctx, q)
        if parts is not None:
            todo = parts + todo
            changed = True
            continue
        changed |= _requant(ctx, q)
    _emit(ctx)
    return changed


# ---------------------------------------------------------------------- step 3
def _to_qdense(g):
    ctx = _Ctx(g)
    for n in g.nodes:
        if n.op != "qmatmul" or not n.attrs.get("transposed"):
            continue
        if not all(u.is_const for u in n.inputs[1:]) or np.any(np.asarray(n.inputs[5].const)):
            continue
        out, bias, drop = n.outputs[0], None, [n]
        us = ctx.users.get(out.id, ())
        if ctx.single(out) and us[0].op == "add":
            a, b = us[0].inputs
            other = b if a is out else a
            if other.is_const and us[0].outputs[0].shape == out.shape:
                bias = _channel_bias(other.const, out)
                if bias is not None:
                    drop.append(us[0])
                    out = us[0].outputs[0]
        xq, w, sx, zx, sw, zw = n.inputs
        new = ctx.node("qdense", [xq, sx, zx, w, sw, zw, _int_bias(g, n, bias)], {},
                       out.shape, np.dtype(np.float32), n.loc)
        ctx.before.setdefault(id(n), []).append(new)
        ctx.dead.update(id(d) for d in drop)
        _retarget(ctx, out, new.outputs[0], None)
    changed = bool(ctx.dead)
    _emit(ctx)
    return changed


@register_pass("fuse_quant")
def fuse_quant(g):
    """QDQ around matmul/conv2d -> int8 ops; int8 from layer to layer (module doc)."""
    changed = _qdq_to_int8(g)
    if not any(n.op in ("qmatmul", "qconv2d") for n in g.nodes):
        return g
    changed |= _chain(g)
    changed |= _to_qdense(g)
    if changed:
        g.meta["quantized"] = "int8"
    g.prune_consts()
    return g
