"""Symbolic sizes: expressions over named dims ('batch', 'seq'), as the IR writes them.

An expression is a sum of monomials with integer (or float) coefficients, or a quotient or
remainder of two expressions: ``4*batch*seq``, ``batch-1``, ``(batch-1)//2``, ``0.5/batch``.
It prints as text without spaces (Graph types and "$<expr>" attributes hold that text)
and parses back with `parse`, a small recursive-descent reader that knows only numbers,
names, ``+ - * / // %`` and parentheses: nothing is evaluated as Python. This module is
the one reader: `evaluate` computes one at given sizes, `is_attr`/`attr`/`attr_text`/
`concrete_attr` read and write the "$<expr>" form attributes carry, and `unify_int`/
`unify_float` find the expression a number seen at several sizes stands for.

The ints that carry an expression while `sampan.jit` traces (`SymInt`), and the guards
their comparisons record, are in `sampan.ir.symint`.

Example::

    >>> e = parse("(batch-1)//2")
    >>> text(e), evaluate(e, {"batch": 9}), attr(e)
    ('(batch-1)//2', 4, '$(batch-1)//2')
    >>> unify_int(8, [12], {"batch": 2}, [("batch", 3)])
    '4*batch'
"""
from __future__ import annotations

import functools
import math
import re

from ..errors import DynamicShapeError

# ---------------------------------------------------------------------- expressions
# An Expr is ("p", ((mono, coef), ...)): a polynomial, mono a sorted tuple of symbol
# names (the constant term's is ()), terms sorted; or (op, a, b) for op in / // %.


def const(c) -> tuple:
    return ("p", (((), c),) if c else ())


def sym(name: str) -> tuple:
    return ("p", (((name,), 1),))


def _poly(terms: dict) -> tuple:
    return ("p", tuple(sorted(((m, c) for m, c in terms.items() if c),
                              key=lambda t: (-len(t[0]), t[0]))))


def value(e):
    """The constant an expression is, or None when it names a symbol."""
    if e[0] == "p":
        if not e[1]:
            return 0
        if len(e[1]) == 1 and e[1][0][0] == ():
            return e[1][0][1]
    return None


def _add(a, b, sign=1):
    if a[0] == "p" and b[0] == "p":
        t = dict(a[1])
        for m, c in b[1]:
            t[m] = t.get(m, 0) + sign * c
        return _poly(t)
    if value(b) == 0:
        return a
    return ("+" if sign > 0 else "-", a, b)


def _mul(a, b):
    if a[0] == "p" and b[0] == "p":
        t = {}
        for m1, c1 in a[1]:
            for m2, c2 in b[1]:
                m = tuple(sorted(m1 + m2))
                t[m] = t.get(m, 0) + c1 * c2
        return _poly(t)
    va, vb = value(a), value(b)
    if va == 0 or vb == 0:
        return const(0)
    if va == 1:
        return b
    if vb == 1:
        return a
    return ("*", a, b)


def _div(op, a, b):
    va, vb = value(a), value(b)
    if va is not None and vb is not None and vb != 0:
        return const(_APPLY[op](va, vb))
    if vb == 1 and op in ("//", "/"):
        return a
    if op == "//" and a[0] == "p" and type(vb) is int and vb > 0 and all(
            type(c) is int and c % vb == 0 for _, c in a[1]):
        return _poly({m: c // vb for m, c in a[1]})
    return (op, a, b)


_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
          "/": lambda a, b: a / b, "//": lambda a, b: a // b, "%": lambda a, b: a % b}
_CMP = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def combine(op, a, b):
    """The expression `a op b` (op one of + - * / // %), simplified where exact."""
    if op == "+":
        return _add(a, b)
    if op == "-":
        return _add(a, b, -1)
    if op == "*":
        return _mul(a, b)
    return _div(op, a, b)


def _num(c) -> str:
    if type(c) is int:
        return str(c)
    c = float(c)
    return str(int(c)) + ".0" if c.is_integer() and abs(c) < 1e16 else repr(c)


def _term(m, c) -> str:
    if not m:
        return _num(c)
    body = "*".join(m)
    return body if c == 1 else f"{_num(c)}*{body}"


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2, "%": 2}


def text(e, prec=0) -> str:
    """`e` as text that `parse` reads back (fully determined by `e`)."""
    if e[0] == "p":
        if not e[1]:
            return "0"
        s = ""
        for m, c in e[1]:
            neg = c < 0
            t = _term(m, -c if neg else c)
            s = (("-" if neg else "") + t) if not s else s + ("-" if neg else "+") + t
        p = 1 if len(e[1]) > 1 or e[1][0][1] < 0 else (2 if e[1][0][0] and
                                                       e[1][0][1] != 1 else 3)
    else:
        op, a, b = e
        p = _PREC[op]
        s = f"{text(a, p)}{op}{text(b, p + 1)}"
    return f"({s})" if p < prec else s


_TOKEN = re.compile(r"\s*(?:(\d+\.\d*(?:e[-+]?\d+)?|\d+e[-+]?\d+|\d+)|([A-Za-z_]\w*)|"
                    r"(//|[-+*/%()]))")


class ExprError(ValueError):
    """Text that is not a symbolic size expression."""


@functools.lru_cache(maxsize=4096)
def parse(s: str):
    """The Expr that text `s` (as `text` writes it) stands for. Raises ExprError."""
    if not isinstance(s, str) or len(s) > 1000:
        raise ExprError(f"not a size expression: {s!r}")
    toks, pos = [], 0
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if m is None or m.end() == pos:
            if s[pos:].strip() == "":
                break
            raise ExprError(f"size expression {s!r}: unexpected {s[pos:pos + 10]!r}")
        pos = m.end()
        num, name, op = m.groups()
        toks.append(("n", (float(num) if ("." in num or "e" in num) else int(num)))
                    if num else ("s", name) if name else ("o", op))
    toks.append(("end", None))
    i = 0

    def peek():
        return toks[i]

    def take():
        nonlocal i
        i += 1
        return toks[i - 1]

    def expr(depth=0):
        if depth > 50:
            raise ExprError(f"size expression {s!r} nests too deep")
        e = term(depth)
        while peek() in (("o", "+"), ("o", "-")):
            e = combine(take()[1], e, term(depth))
        return e

    def term(depth):
        e = unary(depth)
        while peek()[0] == "o" and peek()[1] in ("*", "/", "//", "%"):
            e = combine(take()[1], e, unary(depth))
        return e

    def unary(depth):
        if peek() == ("o", "-"):
            take()
            return combine("*", const(-1), unary(depth))
        k, v = take()
        if k == "n":
            return const(v)
        if k == "s":
            return sym(v)
        if (k, v) == ("o", "("):
            e = expr(depth + 1)
            if take() != ("o", ")"):
                raise ExprError(f"size expression {s!r}: unbalanced parentheses")
            return e
        raise ExprError(f"size expression {s!r}: unexpected {v!r}")
    e = expr()
    if peek()[0] != "end":
        raise ExprError(f"size expression {s!r}: unexpected {peek()[1]!r}")
    return e


def evaluate(e, sizes: dict):
    """The value of Expr (or text) `e` with each symbol at `sizes[symbol]`; KeyError names
    a symbol `sizes` lacks."""
    if isinstance(e, str):
        e = parse(e)
    if e[0] == "p":
        total = 0
        for m, c in e[1]:
            for s in m:
                c = c * sizes[s]
            total += c
        return total
    op, a, b = e
    return _APPLY[op](evaluate(a, sizes), evaluate(b, sizes))


def symbols(e) -> set:
    """The symbol names in Expr (or text) `e`."""
    if isinstance(e, str):
        e = parse(e)
    if e[0] == "p":
        return {s for m, _ in e[1] for s in m}
    return symbols(e[1]) | symbols(e[2])


# ---------------------------------------------------------------------- in attributes
ATTR = "$"       # a symbolic size inside a node attribute is the string "$<expr>"


def is_attr(x) -> bool:
    """Whether attribute value `x` is a symbolic size ("$8*batch")."""
    return isinstance(x, str) and x.startswith(ATTR)


def attr(e) -> str:
    """Expr or text `e` as an attribute value: "$<text>"."""
    return ATTR + (e if isinstance(e, str) else text(e))


def attr_text(x) -> str:
    """The expression text of attribute value `x` ("$batch-1" -> "batch-1"); text that
    is not an attribute (a Graph type's dim, "batch") is returned as it is."""
    return x[len(ATTR):] if is_attr(x) else x


def concrete_attr(x, sizes, evaluate=evaluate):
    """Attribute value `x` with every "$expr" in it (nested in tuples, lists and dicts) computed
    at `sizes` by `evaluate(text, sizes)`."""
    if is_attr(x):
        return evaluate(x[len(ATTR):], sizes)
    if isinstance(x, tuple):
        return tuple(concrete_attr(a, sizes, evaluate) for a in x)
    if isinstance(x, list):
        return [concrete_attr(a, sizes, evaluate) for a in x]
    if isinstance(x, dict):
        return {k: concrete_attr(a, sizes, evaluate) for k, a in x.items()}
    return x


# ---------------------------------------------------------------------- graphs at sizes
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def sizes_text(sizes) -> str:
    """`batch=4, seq=7`: sizes as messages name them."""
    return ", ".join(f"{s}={n}" for s, n in sorted(sizes.items()))


def size_at(expr: str, sizes: dict):
    """The value of a symbolic expression under `sizes`: a dim ('batch', '4*batch*seq',
    'batch-1', an int) or a value that scales with the sizes ('0.5/batch': a float);
    DynamicShapeError for an unbound symbol, bad text or a division by zero."""
    try:
        return evaluate(expr, sizes)
    except KeyError as e:
        raise DynamicShapeError(f"sampan.jit: symbolic expression {expr!r} names {e.args[0]!r}, "
                                f"which no input binds (bound: {sorted(sizes)})") from None
    except ExprError as e:
        raise DynamicShapeError(f"sampan.jit: {e}") from None
    except ZeroDivisionError:
        raise DynamicShapeError(f"sampan.jit: symbolic expression {expr!r} divides by zero at "
                                f"{sizes_text(sizes)}") from None


def symbols_of(g) -> set:
    """The symbols in the dims of Graph `g`'s values (its blocks' too)."""
    out = set()
    for v in (v for b in g.walk() for v in b.values()):
        for d in v.shape:
            if isinstance(d, str):
                try:
                    out |= symbols(d)
                except ExprError:     # a dim name from elsewhere (an ONNX model's)
                    out.add(d)
    return out


def concrete(g, sizes):
    """A copy of symbolic Graph `g` with every symbol replaced by its size."""
    c = g.copy()
    for b in c.walk():                 # the blocks of control-flow nodes too
        for v in b.values():
            if any(isinstance(d, str) for d in v.shape):
                v.shape = tuple(size_at(d, sizes) if isinstance(d, str) else d
                                for d in v.shape)
        for n in b.nodes:
            n.attrs = {a: concrete_attr(x, sizes, size_at) for a, x in n.attrs.items()}
    return c


def input_dims(g, positions) -> dict:
    """{input position: {dim: symbol}} for the graph inputs `positions` (the call's
    arguments) with symbolic dims; a symbol is bound by a dim that is exactly it."""
    out = {}
    for p in positions:
        dims = {d: s for d, s in enumerate(g.inputs[p].shape)
                if isinstance(s, str) and _NAME.fullmatch(s)}
        if dims:
            out[p] = dims
    return out


def fits(shape, want, sizes) -> bool:
    """Whether a concrete `shape` matches symbolic `want` under `sizes`."""
    return len(shape) == len(want) and all(
        (size_at(w, sizes) if isinstance(w, str) else w) == n for n, w in zip(shape, want))


# ---------------------------------------------------------------------- unification
def expr_str(coef: int, syms) -> str:
    """The text of monomial `coef*syms` ("4*batch*seq"; `coef` alone without symbols)."""
    parts = ([str(coef)] if coef != 1 else []) + sorted(syms)
    return "*".join(parts) if parts else str(coef)


def unify_int(x0, xs, base, probes):
    """The symbolic form of an int seen as x0 at the `base` sizes and xs[k] when only
    probes[k] = (symbol, size) changed: x0 itself when no probe changes it, else the
    text coef*syms; None when it is not such a multiple."""
    syms = []
    for (s, size), x in zip(probes, xs):
        if x == x0:
            continue
        if x0 <= 0 or x * base[s] != x0 * size:
            return None
        syms.append(s)
    if not syms:
        return x0
    den = 1
    for s in syms:
        den *= base[s]
    if x0 % den:
        return None
    return expr_str(x0 // den, syms)


def unify_float(x0, xs, base, probes, digits=17):
    """A float seen as x0 at the base sizes and xs[k] when probes[k] changed: x0, or the
    text c*syms / c/syms (a value computed from the sizes, e.g. the 1/n of a mean); None
    when it is neither."""
    if x0 != x0 or x0 in (math.inf, -math.inf) or x0 == 0:
        return x0 if all(y == x0 or (y != y and x0 != x0) for y in xs) else None
    num, den = [], []
    c = x0
    for (s, size), x in zip(probes, xs):
        if x == x0:
            continue
        r = size / base[s]
        if math.isclose(x, x0 / r, rel_tol=10.0 ** (1 - digits)):
            den.append(s)
            c *= base[s]
        elif math.isclose(x, x0 * r, rel_tol=10.0 ** (1 - digits)):
            num.append(s)
            c /= base[s]
        else:
            return None
    if not num and not den:
        return x0
    c = float(f"{c:.{digits}g}")
    return "*".join([repr(c)] + sorted(num)) + "".join("/" + d for d in sorted(den))
