"""Sequence and optional ops, as far as they map when the graph is built.

A sequence is a `Seq` (sampan/onnx/subgraph.py): a list of tensors whose length is known
when the graph is built, so every position (SequenceAt, SequenceInsert, SequenceErase)
must be known too (a constant, or computed from shapes; eagerly any value is). An optional
is an `Opt`. A program traced from the model holds their tensors only: ConcatFromSequence
and SplitToSequence become concat/stack and split nodes.
"""
from __future__ import annotations

import numpy as np

import sampan
from ...tensor import Tensor
from ..subgraph import Opt, Seq, run_subgraph, subgraph_attr
from . import onnx_op
from .control import known
from .shape import ints, norm_axis


def _seq(ctx, s, what="the input sequence"):
    if isinstance(s, Opt):
        s = s.value
    if not isinstance(s, Seq):
        raise ctx.error(f"{what} must be a sequence; got "
                        f"{'none' if s is None else type(s).__name__}")
    return s


def _position(ctx, pos, n, default, insert=False):
    """A sequence position known when the graph is built, in range (negatives count from
    the end; an insert may also take n)."""
    if pos is None:
        return default
    v = known(ctx, pos)
    if v is None:
        raise ctx.error("the position must be known when the graph is built (a constant or "
                        "computed from shapes); it is computed from data")
    p = int(np.asarray(v).reshape(()))
    hi = n if insert else n - 1
    if not -n <= p <= hi:
        raise ctx.error(f"position {p} is out of range for a sequence of length {n} "
                        f"(expected {-n} to {hi})")
    return p + n if p < 0 else p


def _check_elem(ctx, s, t):
    if s and (s[0].dtype != t.dtype):
        raise ctx.error(f"a {t.dtype} tensor cannot join a sequence of {s[0].dtype} tensors")


@onnx_op("SequenceEmpty", since=11)
def sequence_empty(ctx, node):
    return Seq([], node.attr("dtype", 1))


@onnx_op("SequenceConstruct", since=11)
def sequence_construct(ctx, node, *xs):
    if not xs:
        raise ctx.error("needs at least one tensor")
    for x in xs[1:]:
        _check_elem(ctx, xs[:1], x)
    return Seq(xs)


@onnx_op("SequenceLength", since=11)
def sequence_length(ctx, node, s):
    return ctx.make_static(np.array(len(_seq(ctx, s)), np.int64))


@onnx_op("SequenceAt", since=11)
def sequence_at(ctx, node, s, pos):
    s = _seq(ctx, s)
    if not s:
        raise ctx.error("the sequence is empty")
    return s[_position(ctx, pos, len(s), None)]


@onnx_op("SequenceInsert", since=11)
def sequence_insert(ctx, node, s, t, pos=None):
    s = _seq(ctx, s)
    _check_elem(ctx, s, t)
    out = Seq(s, s.elem)
    out.insert(_position(ctx, pos, len(s), len(s), insert=True), t)
    return out


@onnx_op("SequenceErase", since=11)
def sequence_erase(ctx, node, s, pos=None):
    s = _seq(ctx, s)
    if not s:
        raise ctx.error("the sequence is empty")
    out = Seq(s, s.elem)
    del out[_position(ctx, pos, len(s), len(s) - 1)]
    return out


@onnx_op("ConcatFromSequence", since=11)
def concat_from_sequence(ctx, node, s):
    s = _seq(ctx, s)
    if not s:
        raise ctx.error("the sequence is empty (the output's shape is unknown)")
    new_axis = int(node.attr("new_axis", 0))
    axis = node.attr("axis")
    if axis is None:
        raise ctx.error("needs the axis attribute")
    axis = norm_axis(ctx, axis, s[0].ndim + new_axis)
    if new_axis:
        return sampan.stack(list(s), axis)
    return s[0] if len(s) == 1 else sampan.concat(list(s), axis)


@onnx_op("SplitToSequence", since=11)
def split_to_sequence(ctx, node, x, split=None):
    axis = norm_axis(ctx, node.attr("axis", 0), x.ndim)
    n = int(x.shape[axis])
    keepdims = int(node.attr("keepdims", 1))
    if split is None:
        parts = [sampan.narrow(x, axis, i, 1) for i in range(n)] if n > 1 else [x]
        if not keepdims:
            parts = [sampan.squeeze(p, axis) for p in parts]
        return Seq(parts)
    sv = known(ctx, split)
    if sv is None:
        raise ctx.error("split must be known when the graph is built; it is computed "
                        "from data")
    sv = np.asarray(sv)
    if sv.ndim == 0:
        k = int(sv)
        if k <= 0:
            raise ctx.error(f"split {k} must be positive")
        sizes = [k] * (n // k) + ([n % k] if n % k else [])
    else:
        sizes = ints(sv)
        if sum(sizes) != n or min(sizes, default=0) < 0:
            raise ctx.error(f"split {sizes} does not add up to the axis size {n}")
    if len(sizes) == 1:
        return Seq([x])
    return Seq(sampan.split(x, sizes, axis))


@onnx_op("SequenceMap", since=17)
def sequence_map(ctx, node, s, *more):
    """The body once per position of the sequences (tensor inputs given whole)."""
    body = subgraph_attr(ctx, node, "body")
    ins = [s, *more]
    seqs = [x for x in ins if isinstance(x, Seq)]
    n = len(_seq(ctx, s))
    if any(len(q) != n for q in seqs):
        raise ctx.error(f"the sequences have lengths {[len(q) for q in seqs]}; they must "
                        "be equal")
    outs = [Seq() for _ in body.outputs]
    for i in range(n):
        ys = run_subgraph(ctx, body, [x[i] if isinstance(x, Seq) else x for x in ins],
                          "the body")
        for o, y in zip(outs, ys):
            o.append(y)
    return tuple(outs)


# ---------------------------------------------------------------------- optional
@onnx_op("Optional", since=15)
def optional(ctx, node, x=None):
    node.attr("type")
    return Opt(x)


@onnx_op("OptionalHasElement", since=15)
def optional_has_element(ctx, node, x=None):
    has = x.value is not None if isinstance(x, Opt) else x is not None
    return ctx.make_static(np.array(has))


@onnx_op("OptionalGetElement", since=15)
def optional_get_element(ctx, node, x):
    if isinstance(x, Opt):
        if x.value is None:
            raise ctx.error("the optional is empty")
        return x.value
    if isinstance(x, (Tensor, Seq)):
        return x
    raise ctx.error("the input is none")
