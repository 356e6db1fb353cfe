"""What a jitted call's outputs share memory with, so that they behave like eager's results.

Eager returns views: `return x.reshape(2)` is a view of x, `return bn.running_mean` is the
buffer itself, `return h.detach()` shares h's memory and version counter, so changing one
in place is seen by every node that saved another. A compiled graph returns plain arrays;
`output_links` reads off the optimised graph (`runtime.memory.output_roots`) which outputs
may share an array with an input, a tensor the call updated, an earlier output or a
residual of the call's gradient, and `link_outputs` confirms each per call
(np.may_share_memory) and ties the versions together as eager does.

Example::

    >>> f = sampan.jit(lambda x: x.reshape(2))
    >>> x = sampan.tensor([1.0, 2.0]); y = f(x)
    >>> y.add_(1.0); x._version                    # 1: as after eager's y = x.reshape(2)
"""
from __future__ import annotations

import numpy as np


def output_links(graph, in_slots, out_slots, copy_out, copy_res):
    """[(out leaf, "in" | "state" | "out" | "res", what it may share memory with)]: the
    ref of an input, or of a tensor whose new value the output is, an earlier out leaf,
    or a residual's index. `copy_out`, `copy_res`: graph output positions copied per call
    (they share nothing)."""
    from ..runtime.memory import output_roots
    roots = output_roots(graph)
    ins = {v.id: in_slots[k] for k, v in enumerate(graph.inputs)}
    outs = [i for i, (k, _) in enumerate(out_slots) if k == "out"]
    res = [i for i, (k, _) in enumerate(out_slots) if k == "res"]
    written = {graph.outputs[i].id: ref for i, (k, ref) in enumerate(out_slots)
               if k == "state"}
    links = []
    for li, i in enumerate(outs):
        if i in copy_out:
            continue
        ref = written.get(graph.outputs[i].id)
        if ref is not None:
            links.append((li, "state", ref))
            continue
        r = roots[i]
        for vid in r:
            slot = ins.get(vid)
            if slot is not None and slot[0] in ("arg", "state"):
                links.append((li, "in", ("arg", slot[1]) if slot[0] == "arg" else slot[1]))
        for lj, j in enumerate(outs[:li]):
            if j not in copy_out and r & roots[j]:
                links.append((li, "out", lj))
                break
        for m, j in enumerate(res):
            if j not in copy_res and r & roots[j]:
                links.append((li, "res", m))
    return tuple(links)


def link_outputs(links, leaves, res, args):
    """Apply `links` to one call's out leaves: an output that is (a view of) an argument
    or state tensor, or of an earlier output, shares that tensor's version counter; an
    output that is the new value of a tensor the call updated is that tensor's array;
    outputs that are residuals of the call's gradient are returned for its tape node to
    check. Returns [(leaf, residual index)]."""
    from .slots import target as _target
    watch = []
    for li, kind, ref in links:
        y = leaves[li]
        if kind == "res":
            if np.may_share_memory(y._data, res[ref]):
                watch.append((y, ref))
            continue
        t = leaves[ref] if kind == "out" else _target(ref, args)
        if kind == "state":      # the new value of a tensor the call updated: it itself
            y._data = t._data
        if y._base is None and np.may_share_memory(y._data, t._data):
            y._base = t._base if t._base is not None else t
    return watch
