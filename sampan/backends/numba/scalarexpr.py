"""The op table's scalar expressions (OpDef.scalar, e.g. "a * 0.5 * (1 + erf(a))") as numba
source: typed literals (np.float32(1.0), never a bare float that promotes to float64),
the float32 mathlib forms of exp/log/tanh/erf, and the dtype each value is computed in
(bfloat16 and float16 in float32). `kernelgen` writes kernels from these and re-exports
the names here."""
from __future__ import annotations

import ast
import inspect

import numpy as np

from ... import dtypes as _dt
from ...ops.registry import OPS


_F32, _F64, _BOOL = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.bool_)
_NP_NAME = {"float32": "np.float32", "float64": "np.float64", "bool": "np.bool_",
            "int8": "np.int8", "int16": "np.int16", "int32": "np.int32", "int64": "np.int64",
            "uint8": "np.uint8"}
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}
_CMPOPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
           ast.GtE: ">="}
_CALLS = {"abs": "abs", "max": "max_", "min": "min_", "sqrt": "np.sqrt", "floor": "np.floor",
          "ceil": "np.ceil", "sign": "np.sign", "round": "np.rint", "sin": "np.sin",
          "cos": "np.cos", "log1p": "np.log1p", "expm1": "np.expm1", "exp": "np.exp",
          "log": "np.log", "tanh": "np.tanh", "erf": "math.erf", "dgelu": "dgelu64",
          # ops/mathops.py: libm calls numba types for float32 and float64 alike (its integer
          # np.fmod is wrong for negative operands: mathops' scalar form avoids that)
          "tan": "np.tan", "asin": "np.arcsin", "acos": "np.arccos", "atan": "np.arctan",
          "sinh": "np.sinh", "cosh": "np.cosh", "asinh": "np.arcsinh", "acosh": "np.arccosh",
          "atanh": "np.arctanh", "log2": "np.log2", "log10": "np.log10", "exp2": "np.exp2",
          "trunc": "np.trunc", "atan2": "np.arctan2", "hypot": "np.hypot",
          "copysign": "np.copysign", "fmod": "np.fmod", "logaddexp": "np.logaddexp",
          "logaddexp2": "np.logaddexp2", "lgamma": "math.lgamma", "erfc": "math.erfc"}
# the scalar functions that have float32 forms in mathlib
_CALLS32 = {"exp": "exp32", "log": "log32", "tanh": "tanh32", "erf": "erf32", "dgelu": "dgelu32"}
_MATHLIB = ("exp32", "log32", "tanh32", "erf32", "dgelu32", "dgelu64", "max_", "min_")


def compute_dtype(d) -> np.dtype:
    """The dtype a value is computed in: bfloat16 and float16 in float32."""
    d = np.dtype(d)
    return _F32 if d in (_dt.bfloat16, np.dtype(np.float16)) else d


# ---------------------------------------------------------------------- scalar expressions
def _arg_names(op):
    try:
        ps = list(inspect.signature(op.shape_rule).parameters.values())
    except (TypeError, ValueError):
        ps = []
    if ps and all(p.kind == p.POSITIONAL_OR_KEYWORD for p in ps[:1]) and ps[0].name in "abc":
        return [p.name for p in ps if p.kind == p.POSITIONAL_OR_KEYWORD]
    return ["a", "b", "c"]


def scalar_expr(op_name, args, in_dtypes, out_dtype, attrs=None) -> str:
    """Source of one primitive applied to the scalar expressions `args`.

    Example: ``scalar_expr("relu", ["t1"], [f32], f32) == "max_(t1, np.float32(0))"``"""
    op = OPS[op_name]
    env = dict(zip(_arg_names(op), args))
    ct = compute_dtype(in_dtypes[0]) if in_dtypes else compute_dtype(out_dtype)
    lit_t = _NP_NAME[ct.name]
    f32 = ct == _F32
    out_t = compute_dtype(out_dtype)

    def emit(e):
        if isinstance(e, ast.Name):
            return env[e.id]
        if isinstance(e, ast.Constant):
            v = e.value
            return f"{lit_t}({v!r})" if not isinstance(v, bool) else repr(v)
        if isinstance(e, ast.BinOp):
            return f"({emit(e.left)} {_BINOPS[type(e.op)]} {emit(e.right)})"
        if isinstance(e, ast.UnaryOp):
            if isinstance(e.op, ast.USub):
                return f"(-{emit(e.operand)})"
            if isinstance(e.op, ast.Not):
                return f"(not {emit(e.operand)})"
        if isinstance(e, ast.BoolOp):
            sym = " & " if isinstance(e.op, ast.And) else " | "
            return "(" + sym.join(emit(v) for v in e.values) + ")"
        if isinstance(e, ast.Compare) and len(e.ops) == 1:
            return f"({emit(e.left)} {_CMPOPS[type(e.ops[0])]} {emit(e.comparators[0])})"
        if isinstance(e, ast.IfExp):
            return f"({emit(e.body)} if {emit(e.test)} else {emit(e.orelse)})"
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name):
            fn = e.func.id
            xs = [emit(a) for a in e.args]
            if fn == "cast":
                return f"({xs[0]} != 0)" if out_t == _BOOL else f"{_NP_NAME[out_t.name]}({xs[0]})"
            name = _CALLS32.get(fn) if f32 and fn in _CALLS32 else _CALLS[fn]
            return f"{name}({', '.join(xs)})"
        raise NotImplementedError(f"scalar expression of {op_name}: {ast.dump(e)}")
    return emit(ast.parse(op.scalar, mode="eval").body)
