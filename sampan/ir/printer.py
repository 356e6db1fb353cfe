"""The Graph text format, written: literals, types and one node a line (`node_str`,
`print_graph`). It reads Graphs without importing `graph.py`, so a Graph prints itself
through it and `text.py` (the parser, which builds Graphs) sits above both.
"""
from __future__ import annotations

import ast
import math

import numpy as np

from .. import dtypes as _dt
from ..errors import SampanError

INLINE_CONST_MAX = 16

# ---------------------------------------------------------------------- literals
def fmt_lit(x) -> str:
    """Python-like literal for plain attribute data (inf/nan spelled as names)."""
    if x is None or isinstance(x, (bool, np.bool_)):
        return repr(None if x is None else bool(x))
    if isinstance(x, (int, np.integer)):
        return repr(int(x))
    if isinstance(x, (float, np.floating)):
        x = float(x)
        if math.isnan(x):  # the sign of a NaN is data too (copysign, signbit read it)
            return "-nan" if math.copysign(1.0, x) < 0 else "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return repr(x)
    if isinstance(x, str):
        return repr(x)
    if isinstance(x, tuple):
        inner = ", ".join(fmt_lit(v) for v in x)
        return f"({inner},)" if len(x) == 1 else f"({inner})"
    if isinstance(x, list):
        return "[" + ", ".join(fmt_lit(v) for v in x) + "]"
    if isinstance(x, np.dtype):
        return repr(_dt.dtype_name(x))
    raise SampanError(f"IR attribute {x!r} of type {type(x).__name__} is not plain data "
                      "(ints, floats, strings, bools, None and tuples of them)")


def _eval_lit(node):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_eval_lit(e) for e in node.elts)
    if isinstance(node, ast.List):
        return [_eval_lit(e) for e in node.elts]
    if isinstance(node, ast.Name) and node.id in ("inf", "nan"):
        return float(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_lit(node.operand)
    raise ValueError(f"not a literal: {ast.dump(node)}")


def type_str(shape, dtype):
    return f"{_dt.short_name(dtype)}[{','.join(map(str, shape))}]"


def _wide(dtype):
    # float16/bfloat16 constants are written through float64 (exact for both)
    return np.float64 if dtype in (_dt.bfloat16, _dt.float16) else dtype


def _inline_array(value, shape, dtype):
    """The array an inline `const(value=...)` literal stands for."""
    return np.asarray(value, dtype=_wide(dtype)).astype(dtype).reshape(shape)


def _const_rhs(v) -> str:
    a = v.const
    if a.size <= INLINE_CONST_MAX and a.ndim <= 4:
        text = fmt_lit(a.astype(_wide(a.dtype)).tolist())
        # `nan`/`-nan` stand for one NaN bit pattern each: a NaN with another payload is
        # written as its bits, so that the text parses back to the same bytes
        if _dt.is_floating(a.dtype) and np.isnan(a.astype(np.float64)).any():
            back = _inline_array(_eval_lit(ast.parse(text, mode="eval").body), a.shape,
                                 a.dtype)
            if back.tobytes() != a.tobytes():
                bits = np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")
                return f"const(bits={fmt_lit(bits.tolist())})"
        return f"const(value={text})"
    return f"const(ref={v.name!r})"


# ---------------------------------------------------------------------- printer
def print_graph(g, *, ids=None) -> str:
    """The text form of `g` (values renumbered in order: inputs, constants, nodes); the
    nested blocks of a control-flow node follow its line, indented, each numbered on its
    own, between `{` and `}`."""
    taken = _unique_names(g)
    # one name per array: a block reading an array its parent also holds as a constant
    # refers to it by the same name (a saved program stores it once)
    by_array = {id(c.const): c.name for b in g.walk() for c in b.consts
                if c.name is not None}
    lines = []
    _print(g, "", taken, lines, by_array)
    return "\n".join(lines) + "\n"


def _unique_names(g) -> set:
    """Every constant name of `g` and its blocks, made unique across all of them where two
    constants of different graphs share one but not their data (a saved program keeps
    constants by name); returns the names."""
    taken = {c.name for b in g.walk() for c in b.consts if c.name is not None}
    seen = {}
    for b in g.walk():
        for c in b.consts:
            if c.name is None:
                continue
            a = seen.setdefault(c.name, c.const)
            if a is c.const or (a.shape == c.const.shape and a.dtype == c.const.dtype
                                and a.tobytes() == c.const.tobytes()):
                continue
            c.name = b.const_name(c.name, taken)
            taken.add(c.name)
            seen[c.name] = c.const
    return taken


def _print(g, pad, taken, lines, by_array):
    ren = {}
    for v in g.values():
        ren[v.id] = len(ren)

    def nm(v):
        try:
            return f"%{ren[v.id]}"
        except KeyError:
            return f"%<undefined {v.id}>"
    args = ", ".join(f"{nm(v)}: {v.type_str()}" + (f" {v.name!r}" if v.name else "")
                     for v in g.inputs)
    lines.append(f"{pad}graph {g.name}({args}) {{")
    for c in g.consts:
        if c.name is None and not (c.const.size <= INLINE_CONST_MAX and c.const.ndim <= 4):
            # unique in the graph and its blocks (a saved program keeps them by name)
            c.name = by_array.get(id(c.const)) or g.const_name(f"c{c.id}", taken)
            taken.add(c.name)
            by_array[id(c.const)] = c.name
        lines.append(f"{pad}  {nm(c)}: {c.type_str()} = {_const_rhs(c)}")
    for n in g.nodes:
        if not n.blocks:
            lines.append(f"{pad}  " + node_str(n, nm))
            continue
        line = node_str(n, nm, loc=False) + " {"
        lines.append(f"{pad}  {line}" + (f"  # {n.loc}" if n.loc else ""))
        for b in n.blocks:
            _print(b, pad + "    ", taken, lines, by_array)
        lines.append(f"{pad}  }}")
    outs = ", ".join(nm(v) for v in g.outputs)
    lines.append(f"{pad}  return ({outs})")
    lines.append(f"{pad}}}")


def node_str(n, nm=None, loc=True) -> str:
    """One node as a line: `%3: f32[8,3] = matmul(%0, %1)  # model.py:12` (a control-flow
    node's blocks are not in it: `print_graph` writes them below)."""
    nm = nm or (lambda v: f"%{v.id}")
    lhs = ", ".join(f"{nm(v)}: {v.type_str()}" for v in n.outputs)
    parts = [nm(v) for v in n.inputs] + [f"{k}={fmt_lit(a)}" for k, a in n.attrs.items()]
    s = f"{lhs} = {n.op}({', '.join(parts)})"
    return s + (f"  # {n.loc}" if n.loc and loc else "")
