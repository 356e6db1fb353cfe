"""`fuse_layers`: a float matmul against a constant weight and the bias add (and ReLU) that
is its only reader become one `dense` node (issue 31), which the numba provider runs as
one kernel with the epilogue inside (`backends/numba/gemv.py`); a conv2d against a constant
weight, its bias add (and ReLU) and a 2x2 stride-2 max-pool reading that alone become one
`conv2d_block` node (`backends/numba/convblock.py`):

    %7 = matmul(%0, W);  %8 = fused(%7, b, body=(add, relu))   ->  %8 = dense(%0, W, b, relu=True)
    %11 = matmul(%10, W3); %12 = add(%11, b3)                   ->  %12 = dense(%10, W3, b3)
    %6 = conv2d(%0, K); %7 = fused(%6, b); %8 = max_pool2d(%7)  ->  %8 = conv2d_block(%0, K, b,
                                                                      relu=True, pool=True)

an int8 `qlinear_conv2d` the numba provider serves and the 2x2 stride-2 max-pool that is
its one reader become one `qlinear_conv2d_pool` (the pool in the conv kernel's call, over
each chunk of requantised images while they are in cache: `backends/numba/qdirect.py`):

    %29 = qlinear_conv2d(%28, ...); %30 = max_pool2d(%29)   ->  %30 = qlinear_conv2d_pool(%28, ...)

It runs after `partition` in the Predictor's list and only where the numba provider is in
the graph's provider list and was given the epilogue (a generated `fused` kernel) or could
be (a plain `add`): a list without numba (the numpy runtime, a user's own) keeps its
matmuls. The bias must be a constant that varies along the output columns only (N,) or
(1, N); x and W 2-d of one float dtype. The new node takes the epilogue's output value,
so every reader is unchanged; the layer's own output disappears. (A conv's bias is (C, 1, 1)
or (1, C, 1, 1), one value per output channel.)

Example: ``PassManager(["fuse_elementwise", "partition", "fuse_layers"]).run(g)``
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Node
from .manager import register_pass
from .partition import OPTIONS

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_ADD_RELU = (("add", (0, 1)), ("relu", (2,)))


def _body(e):
    """(reads y first, relu) when fused node `e` is add(y, b) or relu(add(y, b))."""
    body = tuple((str(op), tuple(args)) for op, args in e.attrs.get("body", ()))
    outs = tuple(e.attrs.get("outputs", ()))
    if len(e.inputs) != 2 or len(e.outputs) != 1 or not body or len(body) > 2:
        return None
    op, args = body[0]
    if op != "add" or sorted(args) != [0, 1]:
        return None
    if len(body) == 2 and body[1] != _ADD_RELU[1]:
        return None
    if outs != (len(body) + 1,):
        return None
    return len(body) == 2


def _bias(c, n, dtype):
    """The constant `c` as an (n,) array when it varies along the columns only."""
    if c is None or not c.is_const or c.dtype != dtype:
        return None
    a = np.asarray(c.const)
    if a.shape == (n,):
        return a
    if a.ndim == 2 and a.shape == (1, n):
        return a.reshape(n)
    return None


def _epilogue(e, y):
    """(bias Value or array, relu) when node `e` is the bias add (+ ReLU) of `y`."""
    other = [v for v in e.inputs if v is not y]
    if len(other) != 1 or len(e.inputs) != 2:
        return None
    if e.op == "add" and not e.attrs:
        return other[0], False
    if e.op == "fused" and e.meta.get("provider") == "numba":
        relu = _body(e)
        if relu is not None:
            return other[0], relu
    return None


def _conv_bias(c, o, dtype):
    """The constant `c` as an (o,) array when it is one value per conv output channel."""
    if c is None or not c.is_const or c.dtype != dtype:
        return None
    a = np.asarray(c.const)
    if a.shape in ((o, 1, 1), (1, o, 1, 1)):
        return a.reshape(o)
    return None


_POOL = {"kernel_size": (2, 2), "stride": (2, 2), "padding": (0, 0), "dilation": (1, 1)}


def _is_pool(n):
    a = n.attrs
    return (n.op == "max_pool2d" and not a.get("ceil_mode", False)
            and all(tuple(a.get(k, ())) == v for k, v in _POOL.items()))


def _conv_block(g, n, users, outs, drop):
    """The conv2d_block node replacing conv `n` and its epilogue (and pool), or None;
    adds the replaced nodes to `drop`."""
    x, w = n.inputs
    y = n.outputs[0]
    if (x.is_const or not w.is_const or x.ndim != 4 or w.ndim != 4
            or x.dtype not in _FLOATS or w.dtype != x.dtype or y.id in outs
            or not all(isinstance(d, int) for d in y.shape[1:])):
        return None
    readers = users.get(y.id, [])
    if len(readers) != 1 or id(readers[0]) in drop:
        return None
    e = readers[0]
    found = _epilogue(e, y)
    if found is None:
        return None
    c, relu = found
    b = _conv_bias(c, w.shape[0], x.dtype)
    if b is None:
        return None
    last, pool = e, False
    z = e.outputs[0]
    after = users.get(z.id, [])
    if (z.id not in outs and len(after) == 1 and _is_pool(after[0]) and y.shape[2] >= 2
            and y.shape[3] >= 2 and id(after[0]) not in drop):
        last, pool = after[0], True
    new = Node("conv2d_block", [x, w, g.add_const(b)],
               dict(n.attrs, relu=bool(relu), pool=pool), n.loc)
    out = last.outputs[0]
    out.node, out.index = new, 0
    new.outputs.append(out)
    new.meta["provider"] = "numba"
    drop.add(id(e))
    if pool:
        drop.add(id(last))
    return new


def _qconv_pool(n, users, outs, drop):
    """The qlinear_conv2d_pool node replacing int8 conv `n` and the max-pool reading it
    alone, or None; adds the pool to `drop`."""
    y = n.outputs[0]
    readers = users.get(y.id, [])
    if (n.meta.get("provider") != "numba" or y.id in outs or len(readers) != 1
            or not _is_pool(readers[0]) or id(readers[0]) in drop or y.ndim != 4
            or any(isinstance(d, int) and d < 2 for d in y.shape[2:])):
        return None
    pool = readers[0]
    new = Node("qlinear_conv2d_pool", list(n.inputs), dict(n.attrs), n.loc)
    out = pool.outputs[0]
    out.node, out.index = new, 0
    new.outputs.append(out)
    new.meta["provider"] = "numba"
    drop.add(id(pool))
    return new


@register_pass("fuse_layers")
def fuse_layers(g):
    """Fold each constant-weight float matmul and its bias add (+ ReLU) into `dense`, and
    each such conv2d with its bias add (+ ReLU, + 2x2 max-pool) into `conv2d_block`, and
    an int8 conv and its 2x2 max-pool into `qlinear_conv2d_pool`."""
    order = g.meta.get(OPTIONS) or []
    if "numba" not in order:
        return g
    users = g.users()
    outs = {v.id for v in g.outputs}
    rep, drop = {}, set()
    for i, n in enumerate(g.nodes):
        if n.op == "qlinear_conv2d" and len(n.outputs) == 1:
            new = _qconv_pool(n, users, outs, drop)
            if new is not None:
                rep[i] = new
            continue
        if n.op == "conv2d" and len(n.inputs) == 2 and len(n.outputs) == 1:
            new = _conv_block(g, n, users, outs, drop)
            if new is not None:
                rep[i] = new
            continue
        if n.op != "matmul" or len(n.inputs) != 2 or n.blocks or len(n.outputs) != 1:
            continue
        x, w = n.inputs
        y = n.outputs[0]
        if (x.is_const or not w.is_const or x.ndim != 2 or w.ndim != 2
                or x.dtype not in _FLOATS or w.dtype != x.dtype or y.id in outs):
            continue
        readers = users.get(y.id, [])
        if len(readers) != 1 or id(readers[0]) in drop:
            continue
        e = readers[0]
        found = _epilogue(e, y)
        if found is None:
            continue
        c, relu = found
        b = _bias(c, w.shape[1], x.dtype)
        if b is None:
            continue
        bv = c if c.shape == (w.shape[1],) else g.add_const(b)
        new = Node("dense", [x, w, bv], {"relu": bool(relu)}, n.loc)
        out = e.outputs[0]
        out.node, out.index = new, 0
        new.outputs.append(out)
        new.meta["provider"] = "numba"
        rep[i] = new
        drop.add(id(e))
    if rep:
        g.nodes = [rep.get(i, n) for i, n in enumerate(g.nodes) if id(n) not in drop]
    return g
