"""The verifier: SSA, defined-before-use, and types that agree with each op's shape rule.

Run after every pass in debug mode and in all tests. Raises `VerifyError` naming the
offending node as a text line."""
from __future__ import annotations

from ..errors import SampanError
from .graph import spec_of
from .text import node_str


class VerifyError(SampanError):
    """A graph breaks an IR invariant."""


def _dims_match(a, b):
    if len(a) != len(b):
        return False
    return all(x == y or isinstance(x, str) or isinstance(y, str) for x, y in zip(a, b))


def verify(g) -> None:
    """Check `g`; raise VerifyError on the first broken invariant.

    Example: ``sampan.ir.verify(fn.graph)``"""
    from ..ops.registry import OPS
    defined = set()

    def define(v, where):
        if v.id in defined:
            raise VerifyError(f"%{v.id} is defined twice (not SSA): {where}")
        defined.add(v.id)
    for v in g.inputs:
        if v.node is not None or v.const is not None:
            raise VerifyError(f"graph input %{v.id} also has a producer")
        define(v, "graph input")
    for v in g.consts:
        if v.const is None:
            raise VerifyError(f"constant %{v.id} has no data")
        if tuple(v.const.shape) != tuple(v.shape) or v.const.dtype != v.dtype:
            raise VerifyError(f"constant %{v.id} is typed {v.type_str()} but holds "
                              f"{v.const.dtype}{list(v.const.shape)}")
        define(v, "constant")
    for n in g.nodes:
        line = node_str(n)
        op = OPS.get(n.op)
        if op is None:
            raise VerifyError(f"unknown op {n.op!r}: {line}")
        for v in n.inputs:
            if v.id not in defined:
                raise VerifyError(f"%{v.id} is used before it is defined (or dangling): {line}")
        if op.n_out is not None and len(n.outputs) != op.n_out:  # None: set by attrs
            raise VerifyError(f"{n.op} has {op.n_out} outputs, node has {len(n.outputs)}: "
                              f"{line}")
        try:
            specs = op.shape_rule(*[spec_of(v) for v in n.inputs], **n.attrs)
        except Exception as e:
            raise VerifyError(f"shape rule of {n.op} rejects the node ({e}): {line}") from None
        specs = list(specs) if op.n_out != 1 else [specs]
        for v, s in zip(n.outputs, specs):
            if v.node is not n:
                raise VerifyError(f"%{v.id} does not point back to its node: {line}")
            if not _dims_match(tuple(s.shape), v.shape) or s.dtype != v.dtype:
                raise VerifyError(f"%{v.id} is typed {v.type_str()} but the shape rule of "
                                  f"{n.op} gives {s!r}: {line}")
            define(v, line)
    for v in g.outputs:
        if v.id not in defined:
            raise VerifyError(f"graph output %{v.id} is not defined (dangling)")
