"""Memory planning: liveness analysis that gives intermediate values reusable buffers.

A value may take a planned buffer when its kernel can write into `out=` (see
`out_kernel`) and it cannot reach a graph output through views (escape analysis),
since planned buffers are reused on the next call. A buffer stays busy until the
last use of every value that may alias it (views, kernels that may return their
input). An elementwise ufunc may write into the buffer of an input it reads last
(in-place execution). The plan is stored in `graph.meta["memory_plan"]`.

Donation: `graph.meta["donate"]` ({output position: input position}, set by jit for
state that a call updates) lets the kernel computing such an output write straight
into the input's array once nothing reads the old value (or a view of it) any more;
the runtime then has no copy to make when it writes the state back.

The `plan_memory` pass (in the "train" and "inference" pipelines) is registered here, by
the runtime that reads its plan, so that passes/ imports nothing above ir/ops/backends.
"""
from __future__ import annotations

import numpy as np

from ..ops.linalg import matmul_out_kernel
from ..ops.registry import OPS

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _relu_out(a, out):
    return np.maximum(a, a.dtype.type(0), out=out)


def _matmul_out(a, b, out):
    fn = getattr(OPS["matmul"].kernel, "pick", None)
    fn = fn and fn((a, b))          # the kernel choice eager uses (backends/choice.py)
    if fn is not None:
        from ..backends.onednn import Unsupported
        try:
            return fn(a, b, out=out)
        except Unsupported:
            pass
    return matmul_out_kernel(a, b, out)


_SPECIAL_OUT = {"relu": _relu_out, "matmul": _matmul_out}


def out_kernel(node):
    """A kernel variant writing into `out=` for this node, or None.

    ufunc kernels take `out=` as they are; relu has a bit-identical variant, (float32/64)
    matmul one that runs a batch of products by one matrix as a single GEMM (equal up to
    the GEMM's rounding order)."""
    op = OPS[node.op]
    if node.attrs or op.n_out != 1:
        return None
    if isinstance(op.kernel, np.ufunc) and op.kernel.nout == 1:
        return op.kernel
    f = _SPECIAL_OUT.get(node.op)
    if f is not None and node.outputs[0].dtype in _FLOATS and all(
            v.dtype in _FLOATS for v in node.inputs):
        return f
    return None


_REDUCE = ("sum", "mean", "max", "min")


def writes_out(node) -> bool:
    """Whether the node's kernel can write its outputs into given arrays: `out_kernel`
    variants, and fused nodes (every output, through the kernel's `out=`)."""
    return node.op == "fused" or out_kernel(node) is not None


def inplace_ok(node) -> bool:
    """Whether a node may write an output into the array of an input of the same shape
    that it reads for the last time: elementwise ops and fused elementwise bodies read
    each element before writing it; fused row reductions read a row twice, so not them."""
    if node.op == "fused":
        return not any(e[0] in _REDUCE for e in node.attrs["body"])
    return OPS[node.op].kind == "elementwise"


def _fresh_result(node):
    """Kernels known to return new arrays (never a view of an input)."""
    op = OPS[node.op]
    if node.op == "fused":
        return True
    if op.n_out != 1 or op.view or node.op in ("cast", "getitem", "copy"):
        return node.op == "copy"
    return op.kind in ("elementwise", "reduction") or node.op == "matmul"


def _nbytes(v):
    return v.size * v.dtype.itemsize


def _fresh(node):
    """Bytes a node allocates (views allocate none)."""
    return 0 if OPS[node.op].view else sum(_nbytes(v) for v in node.outputs)


def plan(g, min_bytes: int = 256) -> dict:
    """Compute the buffer plan of `g` (see module doc) and its byte figures."""
    n_nodes = len(g.nodes)
    last = {}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            last[v.id] = i
    for v in g.outputs:
        last[v.id] = n_nodes
    fresh_out = {id(n): writes_out(n) for n in g.nodes}

    no_alias = {id(n): fresh_out[id(n)] or _fresh_result(n) for n in g.nodes}
    escapes = {v.id for v in g.outputs}
    for n in reversed(g.nodes):
        if not no_alias[id(n)] and any(o.id in escapes for o in n.outputs):
            escapes.update(v.id for v in n.inputs)

    cand = set()
    for n in g.nodes:
        if fresh_out[id(n)]:
            for v in n.outputs:
                if v.id not in escapes and _nbytes(v) >= min_bytes and all(
                        isinstance(d, int) for d in v.shape):
                    cand.add(v.id)
    # aliasing: which candidates a value may share memory with
    alias = {}
    for n in g.nodes:
        if no_alias[id(n)]:
            for v in n.outputs:
                alias[v.id] = {v.id} if v.id in cand else set()
        else:
            s = set()
            for v in n.inputs:
                s |= alias.get(v.id, set())
            for o in n.outputs:
                alias[o.id] = s
    end = {c: -1 for c in cand}
    for vid, s in alias.items():
        for c in s:
            end[c] = max(end[c], last.get(vid, -1))

    sizes, free, assign = [], [], {}
    busy = {}  # buffer -> end index
    for i, n in enumerate(g.nodes):
        for b, e in list(busy.items()):
            if e < i:
                free.append(b)
                del busy[b]
        taken = set()   # buffers this node's outputs already write
        for v in n.outputs:
            if v.id not in cand:
                continue
            need = _nbytes(v)
            b = None
            if inplace_ok(n):  # in place: reuse an input's buffer read last here
                for x in n.inputs:
                    bx = assign.get(x.id)
                    if (bx is not None and bx not in taken and busy.get(bx) == i
                            and end.get(x.id) == i and x.shape == v.shape
                            and x.dtype == v.dtype):
                        b = bx
                        break
            if b is None and free:
                fits = [f for f in free if sizes[f] >= need]
                b = min(fits, key=lambda f: sizes[f]) if fits else max(free, key=lambda f: sizes[f])
                free.remove(b)
                sizes[b] = max(sizes[b], need)
            if b is None:
                b = len(sizes)
                sizes.append(need)
            assign[v.id] = b
            taken.add(b)
            busy[b] = max(end[v.id], i)

    # figures: no release at all / release at last use / the plan
    naive = sum(_fresh(n) for n in g.nodes)
    live, peak_rel, peak_unpl = 0, 0, 0
    live_u = 0
    dies = {}
    for i, n in enumerate(g.nodes):
        b = _fresh(n)
        live += b
        peak_rel = max(peak_rel, live)
        ub = b if not any(o.id in assign for o in n.outputs) else 0
        live_u += ub
        peak_unpl = max(peak_unpl, live_u)
        e = max((last.get(o.id, i) for o in n.outputs), default=i)
        dies.setdefault(e, []).append((b, ub))
        for bb, uu in dies.pop(i, []):
            live -= bb
            live_u -= uu
    return {"assign": assign, "sizes": sizes, "donate": _donations(g, last, no_alias),
            "bytes_no_release": naive, "bytes_release_at_last_use": peak_rel,
            "planned_peak": sum(sizes) + peak_unpl, "pool_bytes": sum(sizes),
            "n_planned": len(assign)}


def _donations(g, last, no_alias) -> dict:
    """{value id: input position} of outputs computed in place into a donated input."""
    pairs = g.meta.get("donate")
    if not pairs:
        return {}
    pos = {id(n): i for i, n in enumerate(g.nodes)}
    src = {v.id: {k} for k, v in enumerate(g.inputs)}  # inputs each value may alias
    for n in g.nodes:
        if not no_alias[id(n)]:
            s = set()
            for v in n.inputs:
                s |= src.get(v.id, set())
            if s:
                for o in n.outputs:
                    src[o.id] = s
    end = {}  # input position -> last use of any value aliasing it
    for vid, s in src.items():
        for k in s:
            end[k] = max(end.get(k, -1), last.get(vid, -1))
    n_out = {}
    for v in g.outputs:
        n_out[v.id] = n_out.get(v.id, 0) + 1
    res, used = {}, set()
    for j, k in pairs.items():
        if j >= len(g.outputs) or k >= len(g.inputs) or k in used:
            continue
        v, x = g.outputs[j], g.inputs[k]
        n = v.node
        if (n is None or n_out[v.id] != 1 or v.shape != x.shape or v.dtype != x.dtype
                or not writes_out(n)):
            continue
        i = pos[id(n)]
        e = end.get(k, -1)
        if e > i:
            continue
        if e == i and not (inplace_ok(n) and all(
                u is x or k not in src.get(u.id, ()) for u in n.inputs)):
            continue  # read here through a view: writing it in place could clobber it
        res[v.id] = k
        used.add(k)
    return res


def describe(p: dict) -> str:
    """One line of plan figures, e.g. for pass reports."""
    mb = 1 << 20
    return (f"planned peak {p['planned_peak'] / mb:.2f} MiB (pool {p['pool_bytes'] / mb:.2f} "
            f"MiB in {len(p['sizes'])} buffers for {p['n_planned']} values) vs "
            f"{p['bytes_no_release'] / mb:.2f} MiB unplanned")


def output_roots(g) -> list:
    """Per graph output, the frozenset of arrays it may share memory with at run time:
    ids of the graph inputs and of the fresh node results it is, views, or may be
    returned by a kernel that can return its input (and, when the memory plan donates an
    input to it, that input). Two outputs whose sets meet may be one array; an output
    whose set holds an input's id may be (a view of) that input's array."""
    donate = (g.meta.get("memory_plan") or {}).get("donate", {})
    roots = {v.id: frozenset((v.id,)) for v in g.inputs}
    for n in g.nodes:
        if writes_out(n) or _fresh_result(n):
            for v in n.outputs:
                s = {v.id}
                if v.id in donate:
                    s.add(g.inputs[donate[v.id]].id)
                roots[v.id] = frozenset(s)
        else:
            s = frozenset().union(*(roots.get(v.id, frozenset()) for v in n.inputs))
            for v in n.outputs:
                roots[v.id] = s | {v.id}
    return [roots.get(v.id, frozenset((v.id,))) for v in g.outputs]


def plan_memory_pass(g):
    """Assign intermediate values to reusable buffers (liveness + escape analysis); the
    blocks of control-flow nodes get plans of their own (each block's executor keeps its
    buffers across iterations), and a loop body donates its carry inputs to the new
    carry, so that the carry lives in one set of arrays for the whole loop (the executor
    copies the initial carry once before the loop: `runtime/control.py`)."""
    from ..ir.blocks import LOOPS
    for n in g.nodes:
        for k, b in enumerate(n.blocks):
            if LOOPS.get(n.op) == k:
                b.meta["donate"] = {j: j for j in range(n.attrs["n_carry"])}
            plan_memory_pass(b)
    g.meta["memory_plan"] = plan(g)
    return g


def register() -> None:
    """Register `plan_memory` as a pass (sampan/runtime/__init__.py calls this once the
    runtime is imported, so either package may be imported first)."""
    from ..passes.manager import register_pass
    register_pass("plan_memory", plan_memory_pass, replace=True)
