"""Row-reduction kernels: a `fused` node whose body holds reductions over the last axis
(sum/mean/max/min, keepdims) with their elementwise prologue and epilogue, written from
the op table's scalar forms like `kernelgen`.

The iteration space is (rows, cols): the shape S the reductions read, split before its
last axis. Each body value is *element* level (varies along the row) or *row* level
(one per row: reduction results, inputs of shape (..., 1), values made from those
alone). One row runs, in parallel over rows:

    for each reduction, in body order: a loop over the row computing the element-level
    values its input needs, then the reduction; row-level values as soon as ready;
    a last loop over the row computing and storing the element-level outputs.

Element-level values a later phase needs are recomputed from the inputs rather than
stored (they are cheap arithmetic, and rows stay in cache). Sums use numpy's pairwise
order (`mathlib.pairwise_sum`) and means divide in float64 like `np.mean`, so a fused
softmax or layer_norm is bit-identical to eager; max/min are exact in any order.
bfloat16 inputs and outputs are read and written as their bits, converted per element
(`kernelgen.storage_dtype`), as in the elementwise kernels.

Example::

    >>> k = bind(fused_node); print(k.source)     # layer_norm(x): one kernel
"""
from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...ops.fused import body_attrs
from ...ops.registry import OPS
from .kernelgen import (
    _NP_NAME,
    PARALLEL_MIN,
    _pattern,
    _spec,
    build_wrapper,
    compile_kernel,
    compute_dtype,
    input_conversion,
    load_expr,
    load_kernel,
    scalar_expr,
    storage_dtype,
    store_expr,
)

REDUCTIONS = ("sum", "mean", "max", "min")
_INIT = {"max": "-np.inf", "min": "np.inf"}


def has_reduction(body) -> bool:
    """Whether `body` holds row reductions (keepdims; column sums are kernelgen's)."""
    return any(e[0] in REDUCTIONS and body_attrs(e).get("keepdims", False) for e in body)


def iteration_shape(in_shapes, in_dtypes, body):
    """The shape the first reduction of `body` reads (the kernel's (rows, cols) space)."""
    specs = [_spec_s(s, d) for s, d in zip(in_shapes, in_dtypes)]
    for e in body:
        ins = [specs[i] for i in e[1]]
        if e[0] in REDUCTIONS:
            return tuple(ins[0].shape)
        specs.append(OPS[e[0]].shape_rule(*ins, **body_attrs(e)))
    raise ValueError("fused body has no reduction")


def _spec_s(shape, dtype):
    from ...ops.registry import Spec
    return Spec(tuple(shape), np.dtype(dtype))


def reduce_source(body, outputs, in_dtypes, patterns, levels, parallel, cache=True,
                  out_dtypes=None):
    """Source of `kernel(nr, nc, x0, ..., o0, ...)`; `levels[v]` is 'e' or 'r' per value;
    `out_dtypes` (default: computed ones) says which outputs are stored as bfloat16."""
    n_in = len(in_dtypes)
    odt = list(out_dtypes) if out_dtypes is not None else [None] * len(outputs)
    vdt = [compute_dtype(d) for d in in_dtypes]
    exprs = {}
    for k, e in enumerate(body):
        v = n_in + k
        if e[0] in REDUCTIONS:      # float32/64 in, the same dtype out
            vdt.append(vdt[e[1][0]])
            continue
        out = OPS[e[0]].shape_rule(*[_spec(vdt[i]) for i in e[1]], **body_attrs(e))
        vdt.append(compute_dtype(out.dtype))
        x = scalar_expr(e[0], [f"t{i}" for i in e[1]], [vdt[i] for i in e[1]], out.dtype,
                        body_attrs(e))
        if vdt[v].kind in "iu":   # numba widens small ints: wrap back like numpy does
            x = f"{_NP_NAME[vdt[v].name]}({x})"
        exprs[v] = x

    def elem_closure(roots):
        need = set()
        todo = [r for r in roots if levels[r] == "e"]
        while todo:
            v = todo.pop()
            if v in need:
                continue
            need.add(v)
            if v >= n_in:
                todo += [i for i in body[v - n_in][1] if levels[i] == "e"]
        return sorted(need)

    def elem_lines(need, ind):
        out = []
        for v in need:
            if v < n_in:
                src = f"r{v}[j]" if patterns[v] in ("full", "bcast") else f"x{v}[j]"
                out.append(f"{ind}t{v} = {load_expr(src, in_dtypes[v])}")
            else:
                out.append(f"{ind}t{v} = {exprs[v]}")
        return out

    def _st(j, o):
        return store_expr(f"t{o}", vdt[o] if odt[j] is None else odt[j])

    loop = "prange" if parallel else "range"
    flags = f"parallel={parallel}, cache={cache}, error_model='numpy', nogil=True"
    ins = [f"x{i}" for i in range(n_in)]
    outs = [f"o{j}" for j in range(len(outputs))]
    ls = [f"@njit({flags})", f"def kernel(nr, nc, {', '.join(ins + outs)}):"]
    for k, e in enumerate(body):
        ls.append(f"    # t{n_in + k} = {e[0]}({', '.join(f't{a}' for a in e[1])})")
    for i in range(n_in):
        if patterns[i] == "scalar":
            ls.append(f"    t{i} = {load_expr(f'x{i}[0]', in_dtypes[i])}")
    ls.append(f"    for i in {loop}(nr):")
    for i in range(n_in):
        if patterns[i] in ("full", "bcast"):
            ls.append(f"        r{i} = x{i}[i]")
        elif patterns[i] == "col":
            ls.append(f"        t{i} = {load_expr(f'x{i}[i]', in_dtypes[i])}")
    elem_outs = [(j, o) for j, o in enumerate(outputs) if levels[o] == "e"]
    for j, _ in elem_outs:
        ls.append(f"        q{j} = o{j}[i]")
    for k, e in enumerate(body):
        v = n_in + k
        if e[0] not in REDUCTIONS:
            if levels[v] == "r":
                ls.append(f"        t{v} = {exprs[v]}")
            continue
        a = e[1][0]
        t = _NP_NAME[vdt[v].name]
        if e[0] in ("sum", "mean"):
            if levels[a] == "e" and a < n_in and patterns[a] in ("full", "bcast") \
                    and storage_dtype(in_dtypes[a]) == vdt[a]:
                src = f"r{a}"
            else:
                src = f"buf{v}"
                ls.append(f"        buf{v} = np.empty(nc, {t})")
                ls.append("        for j in range(nc):")
                ls += elem_lines(elem_closure([a]), " " * 12)
                ls.append(f"            buf{v}[j] = t{a}")
            ls.append(f"        t{v} = {t}(0) + pairwise_sum({src}, 0, nc, {t}(0))")
            if e[0] == "mean":
                ls.append(f"        t{v} = {t}(np.float64(t{v}) / np.float64(nc))")
        else:
            f = "max_" if e[0] == "max" else "min_"
            ls.append(f"        t{v} = {t}({_INIT[e[0]]})")
            ls.append("        for j in range(nc):")
            ls += elem_lines(elem_closure([a]), " " * 12)
            ls.append(f"            t{v} = {f}(t{v}, t{a})")
    if elem_outs:
        ls.append("        for j in range(nc):")
        ls += elem_lines(elem_closure([o for _, o in elem_outs]), " " * 12)
        ls += [f"            q{j}[j] = {_st(j, o)}" for j, o in elem_outs]
    for j, o in enumerate(outputs):
        if levels[o] == "r":
            ls.append(f"        o{j}[i] = {_st(j, o)}")
    code = "\n".join(ls)
    funcs = [f for f in ("exp32", "log32", "tanh32", "erf32", "max_", "min_", "bf16_load",
                         "bf16_store") if f + "(" in code] + ["pairwise_sum"]
    head = ["# generated by sampan.backends.numba.reducegen: do not edit", "import math", "",
            "import numpy as np", "from numba import njit, prange", "",
            f"from sampan.backends.numba.mathlib import {', '.join(funcs)}", "", ""]
    return "\n".join(head) + code + "\n"


def value_levels(in_shapes, patterns, body, n_in):
    """'e' (varies along the row) or 'r' (one per row) for every input and body value."""
    levels = ["e" if p in ("full", "bcast", "row") else "r" for p in patterns]
    for e in body:
        if e[0] in REDUCTIONS:
            levels.append("r")
        else:
            levels.append("e" if any(levels[i] == "e" for i in e[1]) else "r")
    return levels


def _nb_sig(in_dtypes, patterns, out_dtypes, out_levels):
    from numba import types
    from numba.np.numpy_support import from_dtype
    arrs = [types.intp, types.intp]
    for d, p in zip(in_dtypes, patterns):
        nd = 2 if p in ("full", "bcast") else 1
        arrs.append(types.Array(from_dtype(storage_dtype(d)), nd, "C"))
    arrs += [types.Array(from_dtype(storage_dtype(d)), 2 if lv == "e" else 1, "C")
             for d, lv in zip(out_dtypes, out_levels)]
    return types.void(*arrs)


def bind(node):
    """A callable over the node's input arrays running its generated row kernel."""
    body, outputs = node.attrs["body"], node.attrs["outputs"]
    in_shapes = [tuple(v.shape) for v in node.inputs]
    in_dtypes = [v.dtype for v in node.inputs]
    out_dtypes = [v.dtype for v in node.outputs]
    S = iteration_shape(in_shapes, in_dtypes, body)
    k = len(S) - 1
    nr, nc = int(np.prod(S[:k])), S[k]
    pats = [_pattern(s, S, k) or "bcast" for s in in_shapes]
    levels = value_levels(in_shapes, pats, body, len(in_shapes))
    out_levels = [levels[o] for o in outputs]
    parallel = nr * nc >= PARALLEL_MIN
    src = reduce_source(body, outputs, in_dtypes, pats, levels, parallel,
                        out_dtypes=out_dtypes)
    kern, name, path = load_kernel(src)
    compile_kernel(kern, name, _nb_sig(in_dtypes, pats, out_dtypes, out_levels))
    env = {"_k": kern, "_c": np.ascontiguousarray, "_bt": np.broadcast_to, "_e": np.empty,
           "np": np, "_bf16": _dt.bfloat16}
    args = [str(nr), str(nc)]
    for i, (s, d, p) in enumerate(zip(in_shapes, in_dtypes, pats)):
        conv = input_conversion(d)
        shp = {"full": (nr, nc), "scalar": (1,), "row": (nc,), "col": (nr,)}.get(p)
        if shp is None:
            args.append(f"_c(_bt(x{i}, {S!r}){conv}.reshape({(nr, nc)!r})")
        else:
            args.append(f"_c(x{i}{conv}.reshape({shp!r})")
    outs = [((nr, nc) if out_levels[j] == "e" else (nr,), d, tuple(v.shape))
            for j, (d, v) in enumerate(zip(out_dtypes, node.outputs))]
    return build_wrapper(len(in_shapes), args, outs, env, name, src, path,
                         storage=[storage_dtype(d) for d in out_dtypes])
