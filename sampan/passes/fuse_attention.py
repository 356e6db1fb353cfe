"""`fuse_attention`: BERT's masked self-attention chain as one `attention` node (issue 31,
W8), in the Predictor's list before `fuse_elementwise` (remove it there to run the chain).

The chain `BertLayer.attention` traces, for projections xq, xk, xv ((B*S, H) or (B, S, H),
whatever computes them: matmul + add, qdense_dynamic, a column slice of one fused GEMM):

    q  = reshape(xq, (B, S, h, d)) -> permute(0, 2, 1, 3) -> copy -> mul(c)
         (or the saved program's fused(copy, mul) of it; the copy or the mul may be absent)
    kt = reshape(xk, (B, S, h, d)) -> permute(0, 2, 3, 1) [-> copy]
    v  = reshape(xv, (B, S, h, d)) -> permute(0, 2, 1, 3) [-> copy]
    o  = matmul(softmax(add(matmul(q, kt), bias)), v)     (the add absent without a mask)
    y  = reshape(permute(o, (0, 2, 1, 3)), shape)

becomes ``y = reshape(attention(xq', xk', xv', bias, heads=h, scale=c), shape)`` with xq'
the (B, S, H) reshape of xq (a view): the numba kernel reads the projections' rows in place
and keeps each (sequence, head)'s scores in cache. Every value inside the chain must have
that one user and no graph output may read it; any other graph is left as it is. The
numbers agree with the chain's within float32 rounding (ops/attention.py).

Example::

    >>> cfg.pass_builder().delete_pass("fuse_attention")     # run the unfused chain
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Node, Value
from .manager import register_pass

_FLOAT = (np.dtype(np.float32), np.dtype(np.float64))
_COPY_MUL = (("copy", (0,)), ("mul", (2, 1)))


class _Match:
    def __init__(self, users, outs):
        self.users, self.outs = users, outs
        self.nodes = []          # the chain's nodes, to drop

    def only(self, v, op):
        """v's producer when it is an `op` node whose one output only one node reads."""
        n = v.node
        if n is None or n.op != op or len(n.outputs) != 1 or v.id in self.outs or \
                len(self.users.get(v.id, ())) != 1:
            return None
        return n

    def take(self, *nodes):
        self.nodes.extend(nodes)


def _scalar(v):
    if v is None or not v.is_const or v.const.size != 1 or v.dtype.kind != "f":
        return None
    return float(np.asarray(v.const).reshape(()))


def _heads(m, v, dims):
    """(projection, reshape node) of v = [copy(]permute(reshape(x, (B, S, h, d)), dims)[)]."""
    c = m.only(v, "copy")
    if c is not None:
        v = c.inputs[0]
    p = m.only(v, "permute")
    if p is None or tuple(p.attrs.get("dims", ())) != dims:
        return None
    r = m.only(p.inputs[0], "reshape")
    if r is None or r.outputs[0].ndim != 4:
        return None
    m.take(*([c] if c is not None else []), p, r)
    return r.inputs[0], r


def _query(m, v):
    """(projection, reshape node, scale) of the scaled head-major q."""
    scale = 1.0
    n = m.only(v, "fused")
    if n is not None:
        if tuple(n.attrs.get("body", ())) != _COPY_MUL or tuple(n.attrs["outputs"]) != (3,):
            return None
        scale = _scalar(n.inputs[1])
        if scale is None:
            return None
        m.take(n)
        v = n.inputs[0]
    else:
        n = m.only(v, "mul")
        if n is not None:
            a, b = n.inputs
            s, x = (_scalar(b), a) if _scalar(b) is not None else (_scalar(a), b)
            if s is None:
                return None
            scale = s
            m.take(n)
            v = x
    got = _heads(m, v, (0, 2, 1, 3))
    return None if got is None else (got[0], got[1], scale)


def _match(g, sm, users, outs):
    """The new nodes and the chain's output for the softmax node `sm`, or None."""
    m = _Match(users, outs)
    if sm.attrs.get("axis", -1) not in (-1, 3) or len(sm.outputs) != 1:
        return None
    pv = users.get(sm.outputs[0].id, ())
    if len(pv) != 1 or pv[0].op != "matmul" or pv[0].inputs[0] is not sm.outputs[0] or \
            sm.outputs[0].id in outs:
        return None
    pv = pv[0]
    out = users.get(pv.outputs[0].id, ())
    if len(out) != 1 or out[0].op != "permute" or pv.outputs[0].id in outs or \
            tuple(out[0].attrs.get("dims", ())) != (0, 2, 1, 3):
        return None
    perm = out[0]
    fin = users.get(perm.outputs[0].id, ())
    if len(fin) != 1 or fin[0].op != "reshape" or perm.outputs[0].id in outs:
        return None
    fin = fin[0]
    m.take(sm, pv, perm, fin)
    s, bias = sm.inputs[0], None
    add = m.only(s, "add")
    if add is not None:
        a, b = add.inputs
        s, bias = (a, b) if (a.node is not None and a.node.op == "matmul") else (b, a)
        m.take(add)
    qk = m.only(s, "matmul")
    if qk is None:
        return None
    m.take(qk)
    q = _query(m, qk.inputs[0])
    k = _heads(m, qk.inputs[1], (0, 2, 3, 1))
    v = _heads(m, pv.inputs[1], (0, 2, 1, 3))
    if q is None or k is None or v is None:
        return None
    (xq, rq, scale), (xk, rk), (xv, rv) = q, k, v
    shape4 = tuple(rq.outputs[0].shape)
    if any(tuple(r.outputs[0].shape) != shape4 for r in (rk, rv)):
        return None
    bq, sq, nh, d = shape4
    if not (isinstance(nh, int) and isinstance(d, int)) or s.dtype not in _FLOAT:
        return None
    h = nh * d
    if any(x.dtype != s.dtype or x.shape[-1] != h for x in (xq, xk, xv)):
        return None
    if bias is not None and (bias.dtype != s.dtype or bias.ndim != 4 or
                             tuple(bias.shape) != (bq, 1, 1, sq)):
        return None
    spec3 = (bq, sq, h)
    new = []
    ins = []
    for x, r in ((xq, rq), (xk, rk), (xv, rv)):
        if tuple(x.shape) == spec3:
            ins.append(x)
            continue
        shp = tuple(r.attrs["shape"])
        n = Node("reshape", [x], {"shape": (shp[0], shp[1], h)}, r.loc)
        n.outputs.append(Value(g._new_id(), spec3, x.dtype, node=n))
        new.append(n)
        ins.append(n.outputs[0])
    att = Node("attention", ins + ([bias] if bias is not None else []),
               {"heads": nh, "scale": scale}, sm.loc)
    att.outputs.append(Value(g._new_id(), spec3, s.dtype, node=att))
    y = Node("reshape", [att.outputs[0]], dict(fin.attrs), fin.loc)
    y.outputs.append(Value(g._new_id(), fin.outputs[0].shape, s.dtype, node=y))
    new += [att, y]
    return m.nodes, fin, new, y.outputs[0]


@register_pass("fuse_attention")
def fuse_attention(g):
    """Replace each masked self-attention chain by one `attention` node."""
    users = g.users()
    outs = {v.id for v in g.outputs}
    drop, at, rep = set(), {}, {}
    for n in list(g.nodes):
        if n.op != "softmax" or id(n) in drop:
            continue
        got = _match(g, n, users, outs)
        if got is None or any(id(c) in drop for c in got[0]):
            continue
        chain, fin, new, y = got
        drop.update(id(c) for c in chain)
        at[id(fin)] = new            # the chain's last node: every input is defined there
        rep[fin.outputs[0].id] = y
    if at:
        g.splice({**{i: [] for i in drop}, **at}, rep)
    return g
