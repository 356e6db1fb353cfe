"""Elementwise fusion: connected elementwise nodes of one output shape become one `fused`
node (see `sampan.ops.fused`) that runs as one generated numba kernel. Reductions over
the last axis (sum/mean/max/min, keepdims) join the group of their input with their
elementwise prologue and epilogue (row kernels, `backends.numba.reducegen`): a softmax
is max+sub, exp, sum+div (one kernel with fast math), a layer_norm one kernel. A matmul's
epilogue (bias, activation, residual) is the fused kernel that reads its output.

Grouping walks the graph in order and puts a node into the group of one of its
producers when (1) the op declares itself fusable (`OpDef.fuse`, the cost model:
"always" for arithmetic, comparisons and selects; "float32" for exp/log/tanh/erf/sigmoid
and GELU, whose float32 forms are `mathlib`'s SIMD versions, while float64
transcendentals and pow stay with numpy's SIMD ufuncs), (2) its output has the group's
shape (inputs may broadcast into it) and (3) joining creates no cycle: no other input
of the node may depend on the group through a node outside it. A node that reads from
two groups of its shape (neither reducing) merges them, unless that makes a cycle with
the nodes and groups between them: an optimiser's update of one parameter starts three
chains (from the gradient, each slot, the parameter) that meet only near the end, and
as one kernel it reads and writes each array once instead of passing temporaries
between four. A group returns every value read outside it. Groups of one node stay as
they are.

A sum over leading axes (keepdims False: a bias gradient, `sum(g, (0, 1))`) joins the
group that computes its input as a column accumulator: the kernel adds each row of the
value into the result while it has it in a register, instead of a second kernel reading
it back from memory. Nothing in the group may read such a sum (it is complete only
after the last row), and the group takes no row reductions.

Without numba the pass leaves the graph alone and warns once how to enable fusion.

Example::

    >>> g2 = PassManager(["fuse_elementwise"], debug=True).run(g); print(g2)
"""
from __future__ import annotations

import heapq
import os

import numpy as np

from .. import dtypes as _dt
from ..ops._util import norm_axis
from ..ops.registry import OPS, Spec
from .manager import register_pass

MAX_GROUP = 48     # body entries per kernel: keeps compile time per kernel bounded

# Fuse float32 exp/log/tanh/erf/sigmoid with mathlib's vectorised versions (2-6 ulps from
# numpy, 3-8x faster than numpy's ufuncs here; GELU 8x). On by default: compiled mode then
# agrees with eager to float32 tolerance rather than bit for bit (W3 under jit: 0.72x ->
# 0.92x PyTorch eager). `SAMPAN_FUSE_MATH=0` or `set_fast_math(False)` keeps those ops as
# numpy ufuncs between fused kernels, bit-identical to eager.
FAST_MATH = os.environ.get("SAMPAN_FUSE_MATH", "1") == "1"


def set_fast_math(on: bool) -> None:
    """Let fused kernels compute float32 transcendentals themselves (see FAST_MATH)."""
    global FAST_MATH
    FAST_MATH = bool(on)


# Fuse last-axis reductions with their prologue/epilogue. Bit-identical to numpy (pairwise
# sums, float64 mean division), so on by default; `SAMPAN_FUSE_REDUCE=0` turns it off.
FUSE_REDUCTIONS = os.environ.get("SAMPAN_FUSE_REDUCE", "1") == "1"
_REDUCE = {"sum", "mean", "max", "min"}
_RED_DTYPES = {np.dtype(np.float32), np.dtype(np.float64)}


# Merge two groups that a node reads from (see module doc); `SAMPAN_FUSE_MERGE=0` or
# `set_merge_groups(False)` keeps the first group each node joins, as before.
MERGE_GROUPS = os.environ.get("SAMPAN_FUSE_MERGE", "1") == "1"


def set_merge_groups(on: bool) -> None:
    """Let a node that reads from two fused groups merge them (see MERGE_GROUPS)."""
    global MERGE_GROUPS
    MERGE_GROUPS = bool(on)


def set_fuse_reductions(on: bool) -> None:
    """Let reductions join fused groups (see FUSE_REDUCTIONS)."""
    global FUSE_REDUCTIONS
    FUSE_REDUCTIONS = bool(on)


def reducible(n) -> bool:
    """Whether reduction node `n` may join a fused group: float32/64, over the last axis
    only, keepdims, of a static shape whose rows hold two or more elements."""
    if not FUSE_REDUCTIONS or n.op not in _REDUCE or len(n.inputs) != 1:
        return False
    x, out = n.inputs[0], n.outputs[0]
    if x.dtype not in _RED_DTYPES or out.dtype != x.dtype or not x.shape:
        return False
    if not all(isinstance(d, int) and d > 0 for d in x.shape) or x.shape[-1] < 2:
        return False
    last = (len(x.shape) - 1,)
    return bool(n.attrs.get("keepdims")) and norm_axis(n.attrs.get("axis"), len(x.shape)) == last


# Column sums as accumulators of their input's kernel (see module doc); on by default,
# `SAMPAN_FUSE_COLSUM=0` or `set_fuse_column_sums(False)` leaves them separate kernels.
FUSE_COLUMN_SUMS = os.environ.get("SAMPAN_FUSE_COLSUM", "1") == "1"


def set_fuse_column_sums(on: bool) -> None:
    """Let sums over leading axes join the kernel computing their input."""
    global FUSE_COLUMN_SUMS
    FUSE_COLUMN_SUMS = bool(on)


def col_reducible(n) -> bool:
    """Whether sum node `n` may join the group of its input as a column accumulator: a
    float32/64 sum over leading axes (not all), keepdims False, of a static shape."""
    if (not FUSE_COLUMN_SUMS or n.op != "sum" or len(n.inputs) != 1
            or n.attrs.get("keepdims")):
        return False
    x, out = n.inputs[0], n.outputs[0]
    if x.dtype not in _RED_DTYPES or out.dtype != x.dtype or len(x.shape) < 2:
        return False
    if not all(isinstance(d, int) and d > 0 for d in x.shape):
        return False
    ax = n.attrs.get("axis")
    if not isinstance(ax, (tuple, list)) or not ax:
        return False
    return tuple(norm_axis(ax, len(x.shape))) == tuple(range(len(ax))) and len(ax) < len(x.shape)


def _fits(red, S, key, has_red) -> bool:
    """May a node (a reduction reading / an elementwise node making shape S) join a group
    iterating over `key`? Row-level nodes (shape key[:-1] + (1,)) join groups that reduce."""
    if red or S == key:
        return S == key
    return has_red and len(key) > 0 and S == key[:-1] + (1,)

_DTYPES = {np.dtype(t) for t in (np.float32, np.float64, np.bool_, np.int32, np.int64)}
_DTYPES.add(_dt.bfloat16)
_F32_LIKE = {np.dtype(np.float32), _dt.bfloat16}


def fusable(n) -> bool:
    """Whether node `n` may join a fused group (the cost model; see module doc)."""
    op = OPS.get(n.op)
    if op is None or op.kind != "elementwise" or op.n_out != 1 or not n.inputs:
        return False
    if op.fuse not in ("always", "float32"):      # declared with the op (OpDef.fuse)
        return False
    out = n.outputs[0]
    if not out.shape or not all(isinstance(d, int) and d > 0 for d in out.shape):
        return False
    vals = [out] + list(n.inputs)
    if any(v.dtype not in _DTYPES for v in vals):
        return False
    if any(not all(isinstance(d, int) for d in v.shape) for v in n.inputs):
        return False
    # casts to and from bfloat16 (autocast's) fuse where the kernel keeps the rounding
    # point where the program put it: see `_from_low`/`_to_low` in find_groups
    if op.fuse == "float32" and (out.dtype not in _F32_LIKE or not FAST_MATH):
        return False
    if n.op in ("div", "reciprocal", "sqrt") and out.dtype.kind != "f" and out.dtype != \
            _dt.bfloat16:
        return False
    return True


def _to_low(n) -> bool:
    """A cast to bfloat16: inside a kernel it computes in float32 without rounding, so it
    may end a group (the wrapper rounds the group's outputs) but nothing in its group may
    read it."""
    return n.op == "cast" and n.outputs[0].dtype == _dt.bfloat16 and \
        n.inputs[0].dtype != _dt.bfloat16


def _from_low(n) -> bool:
    """A cast from bfloat16: exact when its input comes from outside the kernel (read as
    bfloat16, widened to float32), so it may start a group but not join its producer's
    (whose bfloat16 values are unrounded float32 inside the kernel)."""
    return n.op == "cast" and n.inputs[0].dtype == _dt.bfloat16 and \
        n.outputs[0].dtype != _dt.bfloat16


def find_groups(g):
    """List of groups (lists of nodes in graph order) of two or more fusable nodes.

    Nodes computing a donated output (`graph.meta["donate"]`: state updated in place
    into its input's array) join only groups without reductions, whose kernels may store
    into their inputs (an optimiser's update becomes one kernel writing the parameter and
    its slots in place)."""
    donated = {id(g.outputs[j].node) for j in g.meta.get("donate", {})
               if j < len(g.outputs) and g.outputs[j].node is not None}
    users = g.users()
    pos = {id(n): i for i, n in enumerate(g.nodes)}
    group_of = {}          # node id -> group index
    members = []           # group index -> [nodes]
    shape_of = []
    has_red = []           # group index -> holds a reduction
    has_don = []           # group index -> holds a node computing a donated output
    has_col = []           # group index -> number of leading axes its column sums reduce
    col_nodes = set()      # ids of column sums placed in groups
    gdep = []              # group index -> bitmask of groups its members read from
    rounding = set()       # ids of casts to bfloat16 placed in groups (see _to_low)
    has_round = []         # group index -> holds such a cast (groups holding one never merge)
    anc = {}               # value id -> bitmask of groups it depends on (directly)

    def closure(mask):     # groups reachable upstream, through groups' current members
        seen, todo = 0, mask
        while todo:
            seen |= todo
            nxt = 0
            m = todo
            while m:
                b = m & -m
                nxt |= gdep[b.bit_length() - 1]
                m ^= b
            todo = nxt & ~seen
        return seen

    for n in g.nodes:
        dep = 0
        for v in n.inputs:
            dep |= anc.get(v.id, 0)
        chosen = None
        don = id(n) in donated
        red = not don and reducible(n)
        col = not don and not red and col_reducible(n)
        if col:
            gi = group_of.get(id(n.inputs[0].node)) if n.inputs[0].node is not None else None
            k = len(n.attrs["axis"])
            if (gi is not None and len(members[gi]) < MAX_GROUP and not has_red[gi]
                    and not has_don[gi] and shape_of[gi] == tuple(n.inputs[0].shape)
                    and has_col[gi] in (0, k)):
                group_of[id(n)] = gi
                members[gi].append(n)
                has_col[gi] = k
                col_nodes.add(id(n))
                gdep[gi] |= dep & ~(1 << gi)
                for v in n.outputs:
                    anc[v.id] = 1 << gi
                continue
        if red or fusable(n):
            S = tuple(n.inputs[0].shape if red else n.outputs[0].shape)
            for v in (() if _from_low(n) else n.inputs):
                p = v.node
                gi = group_of.get(id(p)) if p is not None else None
                if gi is None or len(members[gi]) >= MAX_GROUP or not _fits(
                        red, S, shape_of[gi], has_red[gi]):
                    continue
                if (don and (has_red[gi] or has_col[gi])) or (red and (has_don[gi]
                                                                       or has_col[gi])):
                    continue
                if any(u.node is not None and (id(u.node) in col_nodes or id(u.node) in rounding)
                       and group_of.get(id(u.node)) == gi for u in n.inputs):
                    continue   # a column sum is complete only after the group's last row,
                    # a bfloat16 cast is rounded only on the way out
                bit = 1 << gi
                ok = True
                for u in n.inputs:   # another path into n that leaves the group first?
                    pu = u.node
                    if pu is not None and group_of.get(id(pu)) == gi:
                        continue
                    if closure(anc.get(u.id, 0)) & bit:
                        ok = False
                        break
                if ok:
                    chosen = gi
                    break
            if chosen is None:
                chosen = len(members)
                members.append([])
                shape_of.append(S)
                has_red.append(False)
                has_don.append(False)
                has_col.append(0)
                has_round.append(False)
                gdep.append(0)
            if _to_low(n):
                rounding.add(id(n))
                has_round[chosen] = True
            has_red[chosen] = has_red[chosen] or red
            has_don[chosen] = has_don[chosen] or don
            group_of[id(n)] = chosen
            members[chosen].append(n)
            gdep[chosen] |= dep & ~(1 << chosen)
            dep = 1 << chosen
            if MERGE_GROUPS and not has_red[chosen] and not has_col[chosen] \
                    and not _from_low(n):
                for v in n.inputs:
                    gj = group_of.get(id(v.node)) if v.node is not None else None
                    if (gj is not None and gj != chosen and not has_red[gj]
                            and not has_col[gj] and not has_round[gj]
                            and not has_round[chosen]
                            and shape_of[gj] == shape_of[chosen]
                            and len(members[chosen]) + len(members[gj]) <= MAX_GROUP
                            and not _linked(chosen, gj, members, group_of, users, pos)
                            and not _linked(gj, chosen, members, group_of, users, pos)):
                        _merge(chosen, gj, members, group_of, has_don, gdep, anc, pos)
        for v in n.outputs:
            anc[v.id] = dep
    return [m for m in members if len(m) >= 2]


def _linked(a, b, members, group_of, users, pos):
    """Whether group b depends on group a through something outside both: nodes, or
    other groups (taken whole, as each becomes one kernel). Merging them would then
    make a cycle."""
    last = max(pos[id(n)] for n in members[b])
    seen, todo = set(), []

    def visit(x):
        gx = group_of.get(id(x))
        for y in (members[gx] if gx is not None else [x]):
            if id(y) not in seen:
                seen.add(id(y))
                todo.append(y)
    for n in members[a]:
        for v in n.outputs:
            for u in users.get(v.id, ()):
                if group_of.get(id(u)) not in (a, b) and pos[id(u)] < last:
                    visit(u)
    while todo:
        x = todo.pop()
        if group_of.get(id(x)) == b:
            return True
        for v in x.outputs:
            for u in users.get(v.id, ()):
                if id(u) not in seen and group_of.get(id(u)) != a and pos[id(u)] <= last:
                    visit(u)
    return False


def _merge(a, b, members, group_of, has_don, gdep, anc, pos):
    """Move group b's nodes into group a (b is left empty)."""
    ba, bb = 1 << a, 1 << b
    for n in members[b]:
        group_of[id(n)] = a
    members[a] = sorted(members[a] + members[b], key=lambda n: pos[id(n)])
    members[b] = []
    has_don[a] = has_don[a] or has_don[b]
    gdep[a] = (gdep[a] | gdep[b]) & ~(ba | bb)
    gdep[b] = 0
    for k, d in enumerate(gdep):
        if d & bb:
            gdep[k] = (d & ~bb) | (ba if k != a else 0)
    for vid, d in anc.items():
        if d & bb:
            anc[vid] = (d & ~bb) | ba


def _build(g, nodes, users, outs):
    """The fused node replacing `nodes` (not yet placed in g.nodes); returns (node, map
    old value -> new output value)."""
    inside = {id(n) for n in nodes}
    pos = {}
    inputs = []
    for n in nodes:
        for v in n.inputs:
            if v.id not in pos and not (v.node is not None and id(v.node) in inside):
                pos[v.id] = len(inputs)
                inputs.append(v)
    for k, n in enumerate(nodes):
        pos[n.outputs[0].id] = len(inputs) + k
    body = []
    for n in nodes:
        entry = (n.op, tuple(pos[v.id] for v in n.inputs))
        if n.attrs:
            entry += (tuple((k, _plain(a)) for k, a in sorted(n.attrs.items())),)
        body.append(entry)
    out_vals = [n.outputs[0] for n in nodes
                if n.outputs[0].id in outs or any(id(u) not in inside
                                                  for u in users.get(n.outputs[0].id, ()))]
    outputs = tuple(pos[v.id] for v in out_vals)
    specs = [Spec(v.shape, v.dtype) for v in out_vals]
    fused = _new_node(g, inputs, {"body": tuple(body), "outputs": outputs}, specs,
                      nodes[-1].loc)
    return fused, dict(zip((v.id for v in out_vals), fused.outputs))


def _plain(a):
    return _dt.dtype_name(a) if isinstance(a, np.dtype) else a


def _new_node(g, inputs, attrs, specs, loc):
    from ..ir.graph import Node, Value
    n = Node("fused", inputs, attrs, loc)
    for i, s in enumerate(specs):
        n.outputs.append(Value(g._new_id(), s.shape, s.dtype, node=n, index=i))
    return n


def _toposort(nodes):
    """Stable topological order (original order where dependencies allow)."""
    producer = {}
    for n in nodes:
        for v in n.outputs:
            producer[v.id] = n
    order = []
    idx = {id(n): i for i, n in enumerate(nodes)}
    indeg = {}
    succ = {}
    for n in nodes:
        deps = {id(producer[v.id]) for v in n.inputs if v.id in producer}
        indeg[id(n)] = len(deps)
        for d in deps:
            succ.setdefault(d, []).append(n)
    heap = [(idx[id(n)], id(n)) for n in nodes if indeg[id(n)] == 0]
    byid = {id(n): n for n in nodes}
    heapq.heapify(heap)
    while heap:
        _, nid = heapq.heappop(heap)
        n = byid[nid]
        order.append(n)
        for s in succ.get(nid, ()):
            indeg[id(s)] -= 1
            if indeg[id(s)] == 0:
                heapq.heappush(heap, (idx[id(s)], id(s)))
    if len(order) != len(nodes):
        raise RuntimeError("fuse_elementwise: grouping created a cycle")
    return order


def fuse_graph(g):
    """Fuse `g` in place (no numba check); returns the number of fused nodes made."""
    groups = find_groups(g)
    if not groups:
        return 0
    users = g.users()
    outs = {v.id for v in g.outputs}
    grouped = {}
    rep = {}
    fused_nodes = []
    for k, nodes in enumerate(groups):
        fn, m = _build(g, nodes, users, outs)
        if fn.outputs:
            fn.meta["group"] = f"fused kernel {k}"
            rep.update(m)
            fused_nodes.append(fn)
        for n in nodes:   # a group nothing reads is dead code: dropped with its nodes
            grouped[id(n)] = fn if fn.outputs else False
    new_nodes = []
    seen = set()
    for n in g.nodes:
        f = grouped.get(id(n))
        if f is None:
            new_nodes.append(n)
        elif f is not False and id(f) not in seen:
            seen.add(id(f))
            new_nodes.append(f)
    for n in new_nodes:
        n.inputs = [rep.get(v.id, v) for v in n.inputs]
    g.outputs = [rep.get(v.id, v) for v in g.outputs]
    g.nodes = _toposort(new_nodes)
    return len(fused_nodes)


@register_pass("fuse_elementwise", blocks=True)
def fuse_elementwise(g):
    """Merge connected elementwise nodes into fused kernels (needs numba)."""
    from ..backends import numba as nb
    if not nb.available():
        nb.warn_unavailable()
        return g
    g.meta["fused_kernels"] = fuse_graph(g)
    return g


def count_kernels(g) -> dict:
    """{'fused': fused nodes, 'unfused': other nodes}: kernel launches per graph call."""
    f = sum(n.op == "fused" for n in g.nodes)
    return {"fused": f, "unfused": len(g.nodes) - f, "total": len(g.nodes)}


def _bind_fused(node, inplace=None):
    """The numba provider's kernel of a fused node (`sampan.backends.numba.provider`)."""
    from ..backends.numba.provider import bind_fused
    return bind_fused(node, inplace=inplace)
