"""Inference-only rewrites: freeze state into constants, then fold per-channel affine
chains (eval-mode batch-norm, biases) into the weights of the conv2d / matmul before them.

`freeze_state` turns the graph inputs listed in `graph.meta["frozen"]` (input index ->
array; `sampan.jit.save` lists the state tensors the program reads but never writes)
into named constants. The inputs stay in the signature, unread, so a saved program
keeps its calling convention. After it, `fold_constants` computes everything that
depends on weights alone: eval batch-norm's `rsqrt(var + eps)`, `reshape`s of biases,
and transposes of weights (`permute(W)` becomes a new contiguous constant).

`fold_batch_norm` then walks forward from a `conv2d(x, W)` or `matmul(x, W)` with a
constant W through single-use add/sub/mul/div nodes whose other operand is a constant
that varies at most along the output channel (dim 1 of a conv, the last dim of a
matmul). The chain is the affine map `y = a * conv + b` per channel (in float64), so it
becomes `conv2d(x, W * a) + b`: eval batch-norm (`(t - mean) * rsqrt(var + eps) * gamma
+ beta`) and the layer's own bias collapse into the weights and one bias add.

Dropout needs no rewrite: a Layer in eval mode traces `F.dropout` as the identity
(`tests/fusion/test_inference_rewrites.py` checks no `uniform`/`where` is left).

Example::

    >>> g.meta["frozen"] = {1: w, 2: b}
    >>> g2 = PassManager(pipeline("inference"), debug=True).run(g)
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Node, Value
from .manager import register_pass

_AFFINE = ("add", "sub", "mul", "div")


@register_pass("freeze_state")
def freeze_state(g):
    """Read the inputs named in graph.meta['frozen'] as constants (inference only)."""
    frozen = g.meta.get("frozen") or {}
    if not frozen:
        return g
    rep = {}
    for i, arr in frozen.items():
        v = g.inputs[i]
        a = np.asarray(arr)
        if tuple(a.shape) != tuple(v.shape) or a.dtype != v.dtype:
            continue
        rep[v.id] = g.add_const(a, name=f"frozen.{v.name}" if v.name else None)
    for n in g.nodes:
        n.inputs = [rep.get(v.id, v) for v in n.inputs]
    g.outputs = [rep.get(v.id, v) for v in g.outputs]
    g.meta["frozen"] = {}
    return g


def _channel_axis(n):
    """Output axis whose channels the weight of `n` owns, or None if `n` is no anchor."""
    if len(n.inputs) < 2 or not n.inputs[1].is_const or n.inputs[0].is_const:
        return None
    w, out = n.inputs[1], n.outputs[0]
    if out.dtype.kind != "f" or not all(isinstance(d, int) for d in out.shape):
        return None
    if n.op == "conv2d" and w.ndim == 4 and out.ndim == 4:
        return 1
    if n.op == "matmul" and w.ndim == 2 and out.ndim >= 1:
        return out.ndim - 1
    return None


def _per_channel(c, out, axis):
    """Constant `c` as a float64 vector over the channels of `out`, or None when it
    varies along another axis (or would broadcast `out` to a larger shape)."""
    if not c.is_const or c.ndim > out.ndim or c.dtype.kind not in "fiu":
        return None
    shape = (1,) * (out.ndim - c.ndim) + tuple(c.shape)
    C = out.shape[axis]
    for d, s in enumerate(shape):
        if s != 1 and not (d == axis and s == C):
            return None
    vec = np.asarray(c.const, np.float64).reshape(-1)
    return np.broadcast_to(vec, (C,)).copy()


def _chain(g, n, axis, users, outs):
    """(chain nodes, a, b) of the per-channel affine map that follows anchor `n`."""
    cur = n.outputs[0]
    C = cur.shape[axis]
    a, b = np.ones(C), np.zeros(C)
    chain = []
    while cur.id not in outs and len(users.get(cur.id, ())) == 1:
        u = users[cur.id][0]
        o = u.outputs[0]
        if u.op not in _AFFINE or len(u.inputs) != 2 or u.inputs[0] is u.inputs[1]:
            break
        if tuple(o.shape) != tuple(cur.shape) or o.dtype != cur.dtype:
            break
        first = u.inputs[0] is cur
        vec = _per_channel(u.inputs[1] if first else u.inputs[0], cur, axis)
        if vec is None:
            break
        if u.op == "add":
            b = b + vec
        elif u.op == "sub" and first:
            b = b - vec
        elif u.op == "sub":
            a, b = -a, vec - b
        elif u.op == "mul":
            a, b = a * vec, b * vec
        elif first and np.all(vec != 0):
            a, b = a / vec, b / vec
        else:
            break
        chain.append(u)
        cur = o
    return chain, a, b


@register_pass("fold_batch_norm", blocks=True)
def fold_batch_norm(g):
    """Fold per-channel affine chains (eval batch-norm, bias) into conv2d/matmul weights."""
    users = g.users()
    outs = {v.id for v in g.outputs}
    replace = {}     # id(anchor) -> new nodes; id(chain node) -> None (dropped)
    rep = {}
    for n in g.nodes:
        if id(n) in replace:
            continue
        axis = _channel_axis(n)
        if axis is None:
            continue
        chain, a, b = _chain(g, n, axis, users, outs)
        if not chain or (len(chain) == 1 and chain[0].op == "add"):
            continue   # nothing to fold: a lone bias add stays as it is
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            continue
        w = n.inputs[1]
        scale = a.reshape((-1, 1, 1, 1)) if n.op == "conv2d" else a.reshape((1, -1))
        w2 = g.add_const((np.asarray(w.const, np.float64) * scale).astype(w.dtype))
        out = n.outputs[0]
        anchor = Node(n.op, [n.inputs[0], w2] + list(n.inputs[2:]), dict(n.attrs), n.loc)
        anchor.outputs.append(Value(g._new_id(), out.shape, out.dtype, node=anchor))
        new = [anchor]
        last = chain[-1].outputs[0]
        result = anchor.outputs[0]
        if np.any(b != 0):
            bshape = tuple(out.shape[axis] if d == axis else 1 for d in range(out.ndim))
            if n.op == "matmul":
                bshape = (out.shape[axis],)
            bc = g.add_const(b.astype(out.dtype).reshape(bshape))
            add = Node("add", [result, bc], {}, chain[-1].loc)
            add.outputs.append(Value(g._new_id(), last.shape, last.dtype, node=add))
            new.append(add)
            result = add.outputs[0]
        replace[id(n)] = new
        for u in chain:
            replace[id(u)] = None
        rep[last.id] = result
    if replace:
        g.splice({k: r or [] for k, r in replace.items()}, rep)
    return g
