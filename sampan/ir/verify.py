"""The verifier: SSA, defined-before-use, and types that agree with each op's shape rule.

Run after every pass in debug mode and in all tests. Raises `VerifyError` naming the
offending node as a text line.

Shape rules compute with ints, so a graph with symbolic dims (``f32[batch,4]``, attributes
``"$12*batch"``: sampan/ir/symbolic.py) has its rules checked at one concrete size per
symbol: each input type and attribute is evaluated there, and each output's declared type,
evaluated at the same sizes, must be exactly what the rule gives."""
from __future__ import annotations

from ..errors import SampanError
from . import symbolic as _sym
from .graph import spec_of
from .text import node_str

PROBE = 11
"""The size each symbol of a symbolic graph gets by default when its shape rules are
checked: above the small sizes (1, 2, 3) that slices and guards treat specially, so a
program valid from some modest batch or length on is valid there."""


class VerifyError(SampanError):
    """A graph breaks an IR invariant."""


def _dim_symbols(d) -> set:
    try:
        return _sym.symbols(d)
    except _sym.ExprError:         # a dim name from elsewhere (an ONNX model's): one symbol
        return {d}


def symbols_in(g) -> set:
    """The symbol names in the types and "$expr" attributes of `g`'s values and nodes."""
    out = set()
    for b in g.walk():
        for v in b.values():
            for d in v.shape:
                if isinstance(d, str):
                    out |= _dim_symbols(d)
        for n in b.nodes:
            _attr_symbols(n.attrs, out)
    return out


def _attr_symbols(x, out):
    if isinstance(x, str):
        if _sym.is_attr(x):
            out |= _dim_symbols(_sym.attr_text(x))
    elif isinstance(x, (tuple, list)):
        for a in x:
            _attr_symbols(a, out)
    elif isinstance(x, dict):
        for a in x.values():
            _attr_symbols(a, out)


def _size(d, sizes):
    """Dim or expression text `d` at `sizes`; ValueError saying why it has no size."""
    try:
        return _sym.evaluate(d, sizes)
    except _sym.ExprError:
        if d in sizes:
            return sizes[d]
        raise ValueError(f"{d!r} is not a size expression") from None
    except KeyError as e:
        raise ValueError(f"{d!r} names {e.args[0]!r}, which has no size") from None
    except ZeroDivisionError:
        raise ValueError(f"{d!r} divides by zero") from None


def _concrete_shape(shape, sizes):
    return tuple(_size(d, sizes) if isinstance(d, str) else d for d in shape)


def _concrete_attr(x, sizes):
    return _sym.concrete_attr(x, sizes, evaluate=_size)


def verify(g, sizes: dict | None = None) -> None:
    """Check `g`; raise VerifyError on the first broken invariant.

    `sizes` ({symbol: int}) is where the shape rules of a graph with symbolic dims are
    checked (every symbol it lacks gets `PROBE`); a concrete graph ignores it.

    Example: ``sampan.ir.verify(fn.graph)``, ``sampan.ir.verify(g, {"batch": 8})``"""
    from ..ops.registry import OPS, Spec
    syms = symbols_in(g)
    at = ""
    if syms:
        sizes = {**{s: PROBE for s in syms}, **(sizes or {})}
        at = " at " + ", ".join(f"{s}={sizes[s]}" for s in sorted(syms))
    defined = set()
    objs = set()             # the Values themselves: a block's ids repeat its parent's

    def define(v, where):
        if v.id in defined:
            raise VerifyError(f"%{v.id} is defined twice (not SSA): {where}")
        defined.add(v.id)
        objs.add(id(v))

    def spec(v, line):
        if not syms:
            return spec_of(v)
        try:
            return Spec(_concrete_shape(v.shape, sizes), v.dtype)
        except ValueError as e:
            raise VerifyError(f"%{v.id} has type {v.type_str()} with no size{at}: {e}: "
                              f"{line}") from None
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
            if v.id not in defined or id(v) not in objs:
                raise VerifyError(f"%{v.id} is used before it is defined (or dangling, or "
                                  f"a value of another graph): {line}")
        if n.blocks:         # control flow: each block on its own, then the node's rule
            _verify_control(n, op, line, sizes)
            for v in n.outputs:
                define(v, line)
            continue
        if op.n_out is not None and len(n.outputs) != op.n_out:  # None: set by attrs
            raise VerifyError(f"{n.op} has {op.n_out} outputs, node has {len(n.outputs)}: "
                              f"{line}")
        attrs = n.attrs
        if syms:
            try:
                attrs = _concrete_attr(n.attrs, sizes)
            except ValueError as e:
                raise VerifyError(f"an attribute of {n.op} has no value{at}: {e}: "
                                  f"{line}") from None
        try:
            specs = op.shape_rule(*[spec(v, line) for v in n.inputs], **attrs)
        except VerifyError:
            raise
        except Exception as e:
            raise VerifyError(f"shape rule of {n.op} rejects the node{at} ({e}): "
                              f"{line}") from None
        specs = list(specs) if op.n_out != 1 else [specs]
        for v, s in zip(n.outputs, specs):
            if v.node is not n:
                raise VerifyError(f"%{v.id} does not point back to its node: {line}")
            want = spec(v, line)
            if tuple(s.shape) != tuple(want.shape) or s.dtype != v.dtype:
                raise VerifyError(f"%{v.id} is typed {v.type_str()}"
                                  f"{f' ({want!r}{at})' if syms else ''} but the shape rule "
                                  f"of {n.op} gives {s!r}: {line}")
            define(v, line)
    for v in g.outputs:
        if v.id not in defined or id(v) not in objs:
            raise VerifyError(f"graph output %{v.id} is not defined (dangling, or a value "
                              f"of another graph)")


def _verify_control(n, op, line, sizes):
    """A control-flow node: its blocks verify as graphs (reading nothing from outside),
    and its rule, which compares types structurally (a symbolic dim is the same text on
    both sides), gives exactly the node's output types."""
    for b in n.blocks:
        try:
            verify(b, sizes)
        except VerifyError as e:
            raise VerifyError(f"block {b.name} of {n.op}: {e}: {line}") from None
    try:
        specs = list(op.shape_rule(*[spec_of(v) for v in n.inputs], blocks=n.blocks,
                                   **n.attrs))
    except Exception as e:
        raise VerifyError(f"shape rule of {n.op} rejects the node ({e}): {line}") from None
    if len(specs) != len(n.outputs):
        raise VerifyError(f"{n.op} gives {len(specs)} outputs, the node has "
                          f"{len(n.outputs)}: {line}")
    for v, s in zip(n.outputs, specs):
        if v.node is not n:
            raise VerifyError(f"%{v.id} does not point back to its node: {line}")
        if tuple(s.shape) != tuple(v.shape) or s.dtype != v.dtype:
            raise VerifyError(f"%{v.id} is typed {v.type_str()} but the blocks of {n.op} "
                              f"give {s!r}: {line}")
