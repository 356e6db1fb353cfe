"""`distribute`: all-reduce the gradients of a traced training step (pipeline
"data_parallel"), so a jitted step trains data-parallel with the mechanism of eager
`DataParallel`.

`sampan.jit` records which graph outputs are parameter gradients (`meta["grads"]`:
(output position, input position of the parameter)). The pass lays those gradients, in
the order the nodes computing them run, into buckets by the policy eager `DataParallel`
uses (`sampan._buckets.plan`: about `bucket_mb` megabytes of one dtype, a small first
and a small last bucket; `bucket_mb` is the pass option, which the jit sets to a traced
`DataParallel`'s own, else `BUCKET_MB`; the old `graph.meta["bucket_mb"]` is still read,
with a DeprecationWarning), and right after the node that completes a bucket's last
gradient inserts

    flat = concat(reshape(g_i, (-1,)) ...);  red = all_reduce(flat, op="mean")
    g_i' = reshape(getitem(red, i's slice), shape of g_i)

(one all_reduce node straight on the gradient for a bucket of one). Every later reader
of g_i (the optimiser update nodes) and the graph output writing `.grad` read g_i'.
A graph without recorded gradients (an inference graph) is left unchanged.

Example::

    >>> from sampan.passes import pipeline
    >>> pipeline("data_parallel")[:1]
    ['distribute']
    >>> step = sampan.jit(train_step, pipeline="data_parallel")
"""
from __future__ import annotations

import warnings

import numpy as np

from .._buckets import BUCKET_MB, FIRST_BUCKET_MB, plan  # noqa: F401 (the shared policy)
from .manager import PassError, register_pass


def _bucket_mb(g, bucket_mb):
    """The option, else the deprecated `graph.meta["bucket_mb"]`, else BUCKET_MB."""
    if bucket_mb is None and g.meta.get("bucket_mb") is not None:
        warnings.warn("pass 'distribute': graph.meta['bucket_mb'] is deprecated; set the "
                      "option with PassManager(options={'distribute': {'bucket_mb': ...}})",
                      DeprecationWarning, stacklevel=4)
        bucket_mb = g.meta["bucket_mb"]
    mb = float(BUCKET_MB if bucket_mb is None else bucket_mb)
    if not mb > 0:
        raise PassError(f"pass 'distribute': bucket_mb={bucket_mb!r}; expected a number > 0")
    return mb


@register_pass("distribute", options={"bucket_mb": None})
def distribute(g, bucket_mb=None):
    """All-reduce (mean) the traced gradients in buckets before the optimiser's update."""
    pairs = g.meta.get("grads")
    if not pairs:
        return g
    mb = _bucket_mb(g, bucket_mb)
    order = sorted(pairs, key=lambda p: -p[1])      # reverse parameter order
    grads, seen = [], set()
    for out_pos, _ in order:
        v = g.outputs[out_pos]
        if id(v) not in seen and v.node is not None:   # a grad passed through is no work
            seen.add(id(v))
            grads.append(v)
    pos = {id(n): i for i, n in enumerate(g.nodes)}
    # readiness order: the order of the nodes that complete them (ties: reverse
    # parameter order), laid out by the policy eager DataParallel uses
    grads.sort(key=lambda v: pos[id(v.node)])
    items = [(int(np.prod(v.shape, dtype=np.int64)) * np.dtype(v.dtype).itemsize, v.dtype)
             for v in grads]
    replaced = {}
    inserted = []   # (index in the original node list to insert after, [new nodes])
    for idx in plan(items, mb):
        bucket = [grads[i] for i in idx]
        at = max(pos[id(v.node)] for v in bucket)
        new, outs = _reduce_bucket(g, bucket)
        inserted.append((at, new))
        replaced.update(outs)
    # put each bucket's nodes right after its last gradient (in the order of g.nodes)
    after = {}
    for at, new in inserted:
        after.setdefault(at, []).extend(new)
    added = {id(n) for _, new in inserted for n in new}
    old = [n for n in g.nodes if id(n) not in added]
    nodes = []
    for i, n in enumerate(old):
        nodes.append(n)
        for m in after.get(i, ()):
            nodes.append(m)
    # later readers (update nodes, outputs) read the reduced values; a node placed
    # before a bucket's reduction (still inside backward) keeps the local gradient
    placed = set()
    for n in nodes:
        if id(n) in added:
            placed.update(id(o) for o in n.outputs)
            continue
        n.inputs = [_swap(replaced, placed, v) for v in n.inputs]
    g.nodes = nodes
    g.outputs = [_swap(replaced, placed, v) for v in g.outputs]
    g.meta["distributed"] = {"buckets": len(inserted), "grads": len(grads)}
    return g


def _swap(replaced, placed, v):
    r = replaced.get(id(v))
    return r if r is not None and id(r) in placed else v


def _reduce_bucket(g, bucket):
    """New nodes (appended to g.nodes for now) and {id(old grad): reduced value}."""
    start = len(g.nodes)
    if len(bucket) == 1:
        v = bucket[0]
        red = g.add_node("all_reduce", [v], {"op": "mean"}).outputs[0]
        return g.nodes[start:], {id(v): red}
    flats = [g.add_node("reshape", [v], {"shape": (-1,)}).outputs[0] for v in bucket]
    flat = g.add_node("concat", flats, {"axis": 0}).outputs[0]
    red = g.add_node("all_reduce", [flat], {"op": "mean"}).outputs[0]
    outs, off = {}, 0
    for v in bucket:
        n = int(np.prod(v.shape, dtype=np.int64))
        piece = g.add_node("getitem", [red], {"index": (("s", off, off + n, None),)}
                           ).outputs[0]
        outs[id(v)] = g.add_node("reshape", [piece], {"shape": tuple(v.shape)}).outputs[0]
        off += n
    return g.nodes[start:], outs
