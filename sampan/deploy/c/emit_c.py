"""The C sibling of `sampan.runtime.emit`: identifiers, literals and templates of the
generated C of `sampan deploy --target c` (and of the wasm/web targets built from it).

It makes only `emit.Code`: C identifiers that pass `emit.name` and are no C keyword,
numeric literals it formats itself (`num`), C string literals of ASCII text it escapes
(`cstr`), and templates of the generator's own C text whose `@hole@` fields are filled with
Code (`cfill`: C has braces everywhere, so the holes of `emit.fill` would not do). The op
table's scalar forms (`OpDef.scalar`, Python expressions such as ``a * 0.5 * (1 +
erf(a))``) are translated from their parsed form (`scalar_c`): operand names become the
generator's identifiers, literals are formatted here, and every function maps to a C99
<math.h> call or a helper of the generated file; nothing of the text is pasted.
"""
from __future__ import annotations

import ast
import math
import re

import numpy as np

from ...runtime import emit
from ..kernelsource import DeployError

Code = emit.Code

C_KEYWORDS = frozenset(
    "auto break case char const continue default do double else enum extern float for goto "
    "if inline int long register restrict return short signed sizeof static struct switch "
    "typedef union unsigned void volatile while _Bool _Complex _Imaginary main".split())

# numpy dtype name -> C type (bool is numpy's one byte 0/1)
CTYPES = {"float32": "float", "float64": "double", "int64": "int64_t", "int32": "int32_t",
          "int16": "int16_t", "int8": "int8_t", "uint8": "uint8_t", "bool": "uint8_t"}
# numpy dtype name -> the code of model.h's dtype enum
DTYPE_CODES = {"float32": 0, "float64": 1, "int64": 2, "int32": 3, "int16": 4, "int8": 5,
               "uint8": 6, "bool": 7}


def cname(text, what="C identifier") -> Code:
    """`text` as a C identifier (emit.name's check, and no C keyword)."""
    c = emit.name(text, what)
    if c in C_KEYWORDS:
        raise DeployError(f"sampan deploy: {what} {c!r} is a C keyword")
    return c


def ctype(dtype) -> Code:
    """The C type of a numpy dtype, or a DeployError."""
    n = np.dtype(dtype).name
    if n not in CTYPES:
        raise DeployError(f"sampan deploy: dtype {emit.inert(n)} has no C type in the C "
                          f"target; supported: {', '.join(CTYPES)}")
    return emit.own(CTYPES[n])


def num(x, dtype="int64") -> Code:
    """A C literal of number `x` in `dtype` (float32: a float literal that rounds to the
    float32 `x`; non-finite floats through <math.h>'s INFINITY/NAN)."""
    d = np.dtype(dtype)
    if d.kind == "f":
        f = float(x)
        if math.isnan(f):
            return emit.own("(-NAN)" if math.copysign(1.0, f) < 0 else "NAN")
        if math.isinf(f):
            return emit.own("INFINITY" if f > 0 else "(-INFINITY)")
        t = float.__repr__(float(np.float32(f)) if d == np.float32 else f)
        if "e" not in t and "." not in t and "n" not in t:
            t += ".0"
        return emit.own(f"({t}f)" if d == np.float32 else f"({t})")
    if d.kind == "b":
        return emit.own("1" if x else "0")
    i = int(x)
    if d.kind in "iu" and not np.iinfo(d).min <= i <= np.iinfo(d).max:
        raise DeployError(f"sampan deploy: literal {i} does not fit {d.name}")
    if i < 0:
        return emit.own(f"(-{-i}LL)" if abs(i) > 2**31 else f"(-{-i})")
    return emit.own(f"{i}LL" if i > 2**31 else str(i))


def cstr(text) -> Code:
    """A C string literal of `text`: ASCII printable characters, others as escapes."""
    out = []
    for ch in emit.inert(text):
        o = ord(ch)
        if ch in '"\\?':
            out.append("\\" + ch)
        elif 32 <= o < 127:
            out.append(ch)
        else:
            out.append("?")
    return emit.own('"' + "".join(out) + '"')


_HOLE = re.compile(r"@([A-Za-z_][A-Za-z0-9_]*)@")


def cfill(template: str, **holes) -> Code:
    """`template` (the generator's own C text) with every `@name@` replaced by Code."""
    def put(m):
        k = m.group(1)
        if k not in holes:
            raise emit.EmitError(f"cfill: no value for template field @{k}@")
        v = holes[k]
        if not isinstance(v, Code):
            raise emit.EmitError(f"cfill: template field @{k}@ must be Code, got "
                                 f"{type(v).__name__}")
        return v
    return emit.own(_HOLE.sub(put, template))


def join(items, sep) -> Code:
    """Code items joined by one of the separators the C generator writes."""
    if sep not in (", ", " * ", " + ", "\n", "\n\n", " && ", " || ", ""):
        raise emit.EmitError(f"cemit.join: separator {sep!r} is not one the generator writes")
    return emit.own(sep.join(emit._need_code(x, "an item") for x in items))


# ---------------------------------------------------------------------- scalar forms
_BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_CMP = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
        ast.GtE: ">="}
# scalar-form function -> C99 <math.h> name (double; "f" suffix for float)
_MATH = ("sqrt", "floor", "ceil", "trunc", "sin", "cos", "tan", "asin", "acos", "atan",
         "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "exp", "exp2", "expm1", "log",
         "log2", "log10", "log1p", "erf", "erfc", "lgamma", "atan2", "hypot", "copysign",
         "fmod")
# helpers the generated file defines (numpy's semantics: NaN propagates through max/min)
HELPERS = {"max": "sp_max", "min": "sp_min", "sign": "sp_sign", "round": "sp_rint"}


def arg_names(op) -> list:
    """The names the scalar form of `op` gives its inputs, in input order (the shape
    rule's parameter names where they are a/b/c; else a, b, c)."""
    import inspect
    try:
        ps = list(inspect.signature(op.shape_rule).parameters.values())
    except (TypeError, ValueError):
        ps = []
    if ps and ps[0].kind == ps[0].POSITIONAL_OR_KEYWORD and ps[0].name in "abc":
        return [p.name for p in ps if p.kind == p.POSITIONAL_OR_KEYWORD]
    return ["a", "b", "c"]


def scalar_c(op, args, in_dtypes, out_dtype, where="?") -> tuple:
    """(C expression, helpers used) of elementwise `op` applied to the C expressions
    `args` (Code), computed as the op table's scalar form says."""
    if not op.scalar:
        raise DeployError(f"sampan deploy: op {op.name} at {where} has no scalar form")
    env = dict(zip(arg_names(op), args))
    ct = np.dtype(in_dtypes[0]) if in_dtypes else np.dtype(out_dtype)
    out = np.dtype(out_dtype)
    f32 = ct == np.float32
    used = set()

    def bad(e):
        raise DeployError(f"sampan deploy: the scalar form of {op.name} (at {where}) uses "
                          f"{type(e).__name__}, which the C target does not write")

    def go(e) -> Code:
        if isinstance(e, ast.Name):
            if e.id not in env:
                bad(e)
            return env[e.id]
        if isinstance(e, ast.Constant) and type(e.value) in (int, float, bool):
            return num(e.value, ct if ct.kind in "fiu" else np.float32)
        if isinstance(e, ast.BinOp):
            if isinstance(e.op, ast.Pow):
                if ct.kind != "f":
                    bad(e)
                return emit.own(f"{'powf' if f32 else 'pow'}({go(e.left)}, {go(e.right)})")
            if type(e.op) not in _BIN:
                bad(e)
            return emit.own(f"({go(e.left)} {_BIN[type(e.op)]} {go(e.right)})")
        if isinstance(e, ast.UnaryOp):
            if isinstance(e.op, ast.USub):
                return emit.own(f"(-{go(e.operand)})")
            if isinstance(e.op, ast.Not):
                return emit.own(f"(!{go(e.operand)})")
            bad(e)
        if isinstance(e, ast.BoolOp):
            return emit.own("(" + (" && " if isinstance(e.op, ast.And) else " || ").join(
                go(v) for v in e.values) + ")")
        if isinstance(e, ast.Compare) and len(e.ops) == 1 and type(e.ops[0]) in _CMP:
            return emit.own(f"({go(e.left)} {_CMP[type(e.ops[0])]} {go(e.comparators[0])})")
        if isinstance(e, ast.IfExp):
            return emit.own(f"({go(e.test)} ? {go(e.body)} : {go(e.orelse)})")
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and not e.keywords:
            fn = e.func.id
            xs = [go(a) for a in e.args]
            if fn == "cast":
                if out.kind == "b":
                    return emit.own(f"({xs[0]} != 0)")
                return emit.own(f"(({ctype(out)})({xs[0]}))")
            if fn == "abs":
                fn_c = ("fabsf" if f32 else "fabs") if ct.kind == "f" else "llabs"
                return emit.own(f"{fn_c}({xs[0]})")
            if fn in HELPERS:
                if ct.kind != "f" and fn in ("round", "sign"):
                    bad(e)
                base = HELPERS[fn] + ("f" if f32 else "d" if ct.kind == "f" else "i")
                used.add(base)
                return emit.own(f"{base}({', '.join(xs)})")
            if fn == "erf" and f32:      # branch-free: the loop around it vectorises
                used.update(("sp_expf", "sp_expf_erf"))
                return emit.own(f"sp_erff({xs[0]})")
            if fn in _MATH and ct.kind == "f":
                return emit.own(f"{fn}{'f' if f32 else ''}({', '.join(xs)})")
            if fn in _MATH:     # integers: the double function, as numpy computes them
                return emit.own(f"{fn}({', '.join(f'(double)({x})' for x in xs)})")
        bad(e)

    try:
        tree = ast.parse(op.scalar, mode="eval").body
    except SyntaxError:
        raise DeployError(f"sampan deploy: the scalar form of {op.name} does not parse") from None
    return go(tree), used
