"""Two rewrites of backward-pass data movement, both in the "train" pipeline.

merge_slice_grads
    `q, k, v = qkv[0], qkv[1], qkv[2]` has three getitem ops; backward gives each a
    getitem_grad (a zero tensor of qkv's full shape with one slice written) and adds the
    three up: three full-size zero fills and two full-size adds to assemble what is just
    the three gradients side by side. When an add tree's leaves are getitem_grads with
    integer indices 0..n-1 on the first axis of one shape, each used once, the tree
    becomes concat(reshape(g0, (1, ...)), ..., axis=0): one pass that writes each
    element once.

share_reshape_copies
    A value with several reshape users of different shapes (a permuted gradient reshaped
    to (B*T, C) for a weight gradient and to (B, T, C) for the next op) copies once per
    reshape when it is not contiguous. The later reshapes are rewritten to read the first
    one's (contiguous) result, where a reshape is a view. Runs after "simplify", which
    would fold the chain back.

On W3 (two attention blocks) the two rewrites took the backward's getitem_grad, add and
reshape kernels from ~7 ms to ~2 ms per step.
"""
from __future__ import annotations

from .manager import register_pass


def _first_axis_int(n):
    idx = n.attrs.get("index")
    if n.op != "getitem_grad" or len(n.inputs) != 1 or not isinstance(idx, tuple) \
            or len(idx) != 1:
        return None
    item = idx[0]   # ("i", k), or a slice ("s", start, stop, step), None ("n",) ...
    if len(item) != 2 or item[0] != "i" or not isinstance(item[1], int):
        return None
    return item[1]


def _leaves(v, users, outs, acc):
    """getitem_grad leaves of the add tree producing v (each node used once), or False."""
    n = v.node
    if n is None or len(users.get(v.id, ())) != 1 or v.id in outs:
        return False
    if n.op == "add" and len(n.inputs) == 2:
        return all(_leaves(x, users, outs, acc) for x in n.inputs)
    if _first_axis_int(n) is not None:
        acc.append(n)
        return True
    return False


@register_pass("merge_slice_grads", blocks=True)
def merge_slice_grads(g):
    """Sums of getitem_grads that tile the first axis -> one concat (see module doc)."""
    from .dce import dce
    users = g.users()
    outs = {v.id for v in g.outputs}     # a graph output is a use too
    done = False
    for root in list(g.nodes):
        if root.op != "add":
            continue
        out = root.outputs[0]
        leaves = []
        if not all(_leaves(x, users, outs, leaves) for x in root.inputs) or len(leaves) < 2:
            continue
        shape = tuple(leaves[0].attrs["shape"])
        ks = sorted(_first_axis_int(n) for n in leaves)
        if (any(tuple(n.attrs["shape"]) != shape for n in leaves)
                or ks != list(range(shape[0])) or tuple(out.shape) != shape
                or any(n.inputs[0].dtype != out.dtype for n in leaves)):
            continue
        new = []
        for n in sorted(leaves, key=_first_axis_int):
            gk = n.inputs[0]
            new.append(g.add_node("reshape", [gk], {"shape": (1,) + tuple(gk.shape)},
                                  loc=n.loc))
        new.append(g.add_node("concat", [r.outputs[0] for r in new], {"axis": 0},
                              loc=root.loc))
        # add_node appended them; they belong where the sum was (their inputs come earlier)
        del g.nodes[-len(new):]
        i = g.nodes.index(root)
        g.nodes[i:i] = new
        g.replace_all_uses_with(out, new[-1].outputs[0])
        done = True
    return dce(g) if done else g


@register_pass("share_reshape_copies", blocks=True)
def share_reshape_copies(g):
    """Later reshapes of a permuted value read the first reshape (see module doc)."""
    users = g.users()
    for v in list(g.values()):
        if v.node is None or v.node.op != "permute":
            continue
        rs = [n for n in users.get(v.id, ()) if n.op == "reshape"]   # in program order
        for n in rs[1:]:
            if tuple(n.attrs["shape"]) != tuple(rs[0].attrs["shape"]):
                n.inputs = [rs[0].outputs[0] if x is v else x for x in n.inputs]
    return g
