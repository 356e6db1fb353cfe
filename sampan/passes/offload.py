"""`onnxruntime_offload`: run the parts of a graph that onnxruntime supports in onnxruntime.

1. Support, per node, from the op table's ONNX mapping: a node is offloadable when its op
   has a lowering (`OPS[op].onnx` an ONNX op type or a registered lowering, see
   `sampan/onnx/lower/`), lowering that node alone succeeds at the chosen opset (the node
   is exported on its own, at a size of 7 per symbolic dim) and the engine accepts the
   model (onnxruntime builds a session: this catches an ONNX op it has no kernel for at
   that dtype; each distinct node is tried once per process). Random ops (onnxruntime
   would draw other numbers), engine nodes and dtypes onnxruntime's CPU kernels do not
   cover (bfloat16, float16, complex ...) stay sampan.
2. Partition: supported nodes joined along producer -> consumer edges into maximal
   connected groups, in graph order. Two groups merge only when no other path links them
   (a path that leaves a group and comes back would make the engine node both before and
   after the node on that path), so the graph of groups stays acyclic.
3. Each group of at least `min_subgraph_size` nodes (a fused node counts its body) becomes
   one `engine` node (`sampan/ops/engine.py`): the group's ops as plain-data attributes,
   its weights as inputs read from the graph's constants. The rest stays sampan.

Symbolic dims: the engine node keeps them ("$batch" in its specs); the ONNX model is built
per concrete shape when the program is compiled for a size (`concrete()` then the
onnxruntime provider's binder, `sampan.backends.onnxruntime.bind_engine`:
`graph_to_model` with the node's constants as initializers, one onnxruntime session
per node and shape, cached by what it was built from, so clones of a
predictor share sessions; onnxruntime's `run` is thread-safe).

Options, declared at registration: `min_subgraph_size` (default 3), `engine` (default
"onnxruntime"), `opset` (default the newest onnxruntime runs); the Predictor's Config sets
them through its pass builder (`graph.meta["onnxruntime_offload"]` is still read, with a
deprecation warning, when no option is set). The report is `graph.meta["offload_report"]`: one
(node line, what happened) pair per node: "engine k" or the reason it fell back.

Example::

    >>> opts = {"onnxruntime_offload": {"min_subgraph_size": 2}}
    >>> g2 = PassManager(["onnxruntime_offload"], options=opts).run(g)
    >>> g2.meta["offload_report"]
"""
from __future__ import annotations

import heapq

import numpy as np

from ..ir.graph import Node
from ..ir.text import node_str
from ..backends.onnxruntime import ENGINES, EngineError, build_model
from ..ops.engine import spec_attr
from ..ops.registry import NO_ONNX, OPS
from .manager import PassError, register_pass

OPTIONS = "onnxruntime_offload"
REPORT = "offload_report"
TRIAL_SIZE = 7                  # a symbolic dim's size when a node is lowered on its own
_DTYPES = {np.dtype(t) for t in ("float32", "float64", "int64", "int32", "int8", "uint8",
                                 "bool")}


@register_pass("onnxruntime_offload", legacy_meta=OPTIONS,
               options={"min_subgraph_size": 3, "engine": "onnxruntime", "opset": None})
def onnxruntime_offload(g, min_subgraph_size=3, engine="onnxruntime", opset=None):
    """Replace connected subgraphs onnxruntime supports by engine nodes (see module doc)."""
    return offload(g, min_subgraph_size=min_subgraph_size, engine=engine, opset=opset)


def offload_report(g) -> list:
    """The (node line, "engine k" or the reason it stayed sampan) pairs of the last
    offload of `g` (empty if none ran)."""
    return list(g.meta.get(REPORT) or [])


def offload(g, *, min_subgraph_size=3, engine="onnxruntime", opset=None):
    """`g` with its offloadable groups of at least `min_subgraph_size` nodes as engine
    nodes; the report goes to g.meta["offload_report"]."""
    if isinstance(min_subgraph_size, bool) or not isinstance(min_subgraph_size, int) \
            or min_subgraph_size < 1:
        raise PassError(f"onnxruntime_offload: min_subgraph_size must be a positive int; got "
                        f"{min_subgraph_size!r}")
    if engine not in ENGINES:
        raise PassError(f"onnxruntime_offload: unknown engine {engine!r}; registered: "
                        f"{sorted(ENGINES)}")
    why = support(g, opset, engine)
    groups = partition(g, [w is None for w in why])
    lines = [node_str(n) for n in g.nodes]
    report = [None] * len(g.nodes)
    keep = []
    for grp in groups:
        size = sum(_weight(g.nodes[i]) for i in grp)
        if size >= min_subgraph_size:
            keep.append(grp)
        else:
            for i in grp:
                report[i] = (f"a connected group of {size} supported node(s), below "
                             f"min_subgraph_size={min_subgraph_size}")
    for i, w in enumerate(why):
        if w is not None:
            report[i] = w
    replaced = {}
    for k, grp in enumerate(keep):
        node = _engine_node(g, grp, engine, k)
        for i in grp:
            replaced[i] = node
            report[i] = f"engine {k}"
    if keep:
        g.nodes = _order(g, replaced)
    g.meta[REPORT] = list(zip(lines, report))
    return g


def _weight(n) -> int:
    return len(n.attrs["body"]) if n.op == "fused" else 1


# ---------------------------------------------------------------------- 1. support
def support(g, opset=None, engine="onnxruntime") -> list:
    """Per node: None when onnxruntime can run it, else the reason it cannot."""
    from ..ir import symbolic as _dyn
    from ..backends.onnxruntime import check_opset   # registered by sampan.onnx
    opset = check_opset(opset)
    syms = _dyn.symbols_of(g)
    c = _dyn.concrete(g, {s: TRIAL_SIZE for s in syms}) if syms else g
    out = []
    for n, cn in zip(g.nodes, c.nodes):
        op = OPS.get(n.op)
        if n.op == "engine":
            out.append("already an engine node")
            continue
        if op is None or op.onnx is None or op.onnx == NO_ONNX:
            out.append(f"op {n.op!r} has no ONNX lowering (NO_ONNX in the op table)")
            continue
        if op.random:
            out.append(f"op {n.op!r} is random: onnxruntime would draw other numbers")
            continue
        bad = [v.dtype for v in list(n.inputs) + list(n.outputs) if v.dtype not in _DTYPES]
        if bad:
            out.append(f"dtype {bad[0]} is not offloaded (onnxruntime's CPU kernels cover "
                       f"{', '.join(sorted(str(d) for d in _DTYPES))})")
            continue
        out.append(_try_node(cn, opset, engine))
    return out


_TRIED: dict = {}         # (engine, opset, op, attrs, input specs) -> reason or None


def _try_node(n, opset, engine):
    """None when node `n` (concrete) lowers and the engine builds a session for it."""
    ins = [v.const if v.is_const else (tuple(v.shape), v.dtype) for v in n.inputs]
    m = len(n.inputs)
    body = ((n.op, tuple(range(m)), tuple(n.attrs.items()), len(n.outputs)),)
    outs = tuple(range(m, m + len(n.outputs)))
    try:
        key = (engine, opset, body, tuple(
            ("c", a.shape, a.dtype.str, a.tobytes()) if isinstance(a, np.ndarray) and a.size
            <= 64 else ("c", a.shape, a.dtype.str) if isinstance(a, np.ndarray)
            else (a[0], np.dtype(a[1]).str) for a in ins))
        hash(key)
    except TypeError:               # an unhashable attribute (a list): try every time
        key = None
    if key is not None and key in _TRIED:
        return _TRIED[key]
    why = None
    try:
        model = build_model(ins, body, outs, opset=opset)
    except Exception as e:  # noqa: BLE001 - any failure to lower means: stays sampan
        why = f"lowering {n.op!r} failed at opset {opset}: {str(e).splitlines()[0]}"
    else:
        try:
            ENGINES[engine](model.SerializeToString(), m, 1)
        except Exception as e:  # noqa: BLE001 - the engine refused the model: say why
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            why = f"{engine} cannot run {n.op!r} lowered at opset {opset}: {msg[:300]}"
    if key is not None:
        if len(_TRIED) > 4096:
            _TRIED.clear()
        _TRIED[key] = why
    return why


# ---------------------------------------------------------------------- 2. partition
def partition(g, ok) -> list:
    """Groups (sorted node indices) of supported nodes (`ok[i]`): connected through
    producer -> consumer edges, merged only when the graph of groups stays acyclic."""
    prod = {v.id: i for i, n in enumerate(g.nodes) for v in n.outputs}
    parent = list(range(len(g.nodes)))
    succ = [set() for _ in g.nodes]
    pred = [set() for _ in g.nodes]
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            p = prod.get(v.id)
            if p is not None and p != i:
                succ[p].add(i)
                pred[i].add(p)

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def other_path(a, b):
        """Whether group b is reachable from group a other than by a direct edge."""
        seen, stack = {a, b}, [s for s in succ[a] if s != b]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            for y in succ[x]:
                if y == b:
                    return True
                if y not in seen:
                    stack.append(y)
        return False

    def merge(a, b):                # a -> b; b joins a
        parent[b] = a
        for x in succ[b]:
            pred[x].discard(b)
            pred[x].add(a)
        for x in pred[b]:
            succ[x].discard(b)
            succ[x].add(a)
        succ[a] = (succ[a] | succ[b]) - {a, b}
        pred[a] = (pred[a] | pred[b]) - {a, b}
        succ[b], pred[b] = set(), set()

    for i, n in enumerate(g.nodes):
        if not ok[i]:
            continue
        for v in n.inputs:
            p = prod.get(v.id)
            if p is None or not ok[p]:
                continue
            a, b = find(p), find(i)
            if a != b and not other_path(a, b):
                merge(a, b)
    groups = {}
    for i in range(len(g.nodes)):
        if ok[i]:
            groups.setdefault(find(i), []).append(i)
    return sorted(groups.values())


# ---------------------------------------------------------------------- 3. engine nodes
def _group_io(g, grp):
    """(member nodes, ids of values read outside the group, the group's inputs in first-use
    order, value id -> input position) of group `grp` (indices into `g.nodes`)."""
    members = [g.nodes[i] for i in grp]
    inside = {v.id for n in members for v in n.outputs}
    mine = {id(n) for n in members}
    read_outside = {v.id for v in g.outputs} | {
        v.id for n in g.nodes if id(n) not in mine for v in n.inputs}
    inputs, index = [], {}
    for n in members:
        for v in n.inputs:
            if v.id not in inside and v.id not in index:
                index[v.id] = len(inputs)
                inputs.append(v)
    return members, read_outside, inputs, index


def group_body(g, grp):
    """(member nodes, the group's inputs, its engine body, the values read outside it,
    value id -> position) of group `grp`: the body has one (op, input positions, attrs,
    number of outputs) per member; positions count the inputs first, then every member's
    outputs in order (as the engine node's runner numbers them)."""
    members, read_outside, inputs, index = _group_io(g, grp)
    pos = len(inputs)
    body, outs = [], []
    for n in members:
        body.append((n.op, tuple(index[v.id] for v in n.inputs), tuple(n.attrs.items()),
                     len(n.outputs)))
        for v in n.outputs:
            index[v.id] = pos
            pos += 1
            if v.id in read_outside:
                outs.append(v)
    return members, inputs, tuple(body), outs, index


def _engine_node(g, grp, engine, k):
    members, inputs, body, outs, index = group_body(g, grp)
    locs = [n.loc for n in members if n.loc]
    loc = locs[0] if locs else ""
    if len(set(locs)) > 1:
        loc = f"{loc} (+{len(set(locs)) - 1} more lines)"
    node = Node("engine", inputs, {
        "engine": engine, "body": body, "outputs": tuple(index[v.id] for v in outs),
        "in_specs": tuple(spec_attr(v.shape, v.dtype) for v in inputs),
        "out_specs": tuple(spec_attr(v.shape, v.dtype) for v in outs)}, loc)
    for j, v in enumerate(outs):
        v.node, v.index = node, j
        node.outputs.append(v)
    node.meta["offloaded"] = [n.op for n in members]
    node.meta["engine_index"] = k
    return node


def _order(g, replaced):
    """The nodes with each group replaced by its engine node, topologically sorted
    (ties in the original order; an engine node at its first member's place)."""
    items, first = [], {}
    for i, n in enumerate(g.nodes):
        e = replaced.get(i)
        if e is None:
            items.append((i, n))
        elif id(e) not in first:
            first[id(e)] = i
            items.append((i, e))
    prod = {v.id: k for k, (_, n) in enumerate(items) for v in n.outputs}
    indeg = [0] * len(items)
    users = [[] for _ in items]
    for k, (_, n) in enumerate(items):
        for p in {prod[v.id] for v in n.inputs if v.id in prod}:
            indeg[k] += 1
            users[p].append(k)
    heap = [(items[k][0], k) for k in range(len(items)) if indeg[k] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, k = heapq.heappop(heap)
        out.append(items[k][1])
        for u in users[k]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (items[u][0], u))
    if len(out) != len(items):
        raise PassError("onnxruntime_offload: the partition made a cycle (an engine node "
                        "would run both before and after another node); this is a bug")
    return out
