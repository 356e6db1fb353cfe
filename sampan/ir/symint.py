"""The ints that carry a symbolic size while `sampan.jit` traces, and the guards their
comparisons record (the expressions are `sampan.ir.symbolic`'s).

While `sampan.jit` traces with dynamic dims, a size read from a tensor (``x.shape[0]``) is a
`SymInt`: an int holding its value at the traced size, so every line of Python computes as
it would eagerly, plus the expression it stands for. Arithmetic on it keeps the expression
(``(n - 1) // 2`` is ``(batch-1)//2``; ``n / m`` a `SymFloat`); a comparison answers from
the value and, while its `ShapeEnv` records, writes a guard (the expression, the operator,
the other side, the answer, the user's line), as dynamo's shape guards do. A program
traced with guards is valid exactly where the guards still give their answers.

Example::

    >>> env = ShapeEnv(); env.recording = True
    >>> n = SymInt(6, sym("batch"), env)
    >>> ((n - 1) // 2).text, (n - 1) // 2 == 2
    ('(batch-1)//2', True)
    >>> env.guards[0].text(), env.guards[0].check({"batch": 8})
    ('(batch-1)//2==2', False)
"""
from __future__ import annotations

import math
import os
import sys
import threading

from .symbolic import _APPLY, _CMP, ExprError, combine, const, evaluate, parse, symbols, text, \
    value
from .symbolic import sym  # noqa: F401  (the module example builds a SymInt with it)


# ---------------------------------------------------------------------- guards
class Guard:
    """`lhs op rhs` gave `holds` at the traced sizes, asked at `loc` (the user's line)."""

    __slots__ = ("lhs", "op", "rhs", "holds", "loc", "line", "user")

    def __init__(self, lhs, op, rhs, holds, loc="", line=""):
        self.lhs, self.op, self.rhs, self.holds = lhs, op, rhs, bool(holds)
        self.loc, self.line = loc, line
        self.user = True          # made by the user's code (False: sampan's `deciding`)

    def text(self) -> str:
        return f"{text(self.lhs)}{self.op}{text(self.rhs)}"

    def check(self, sizes) -> bool:
        return _CMP[self.op](evaluate(self.lhs, sizes), evaluate(self.rhs, sizes)) is self.holds

    def to_json(self) -> dict:
        d = {"lhs": text(self.lhs), "op": self.op, "rhs": text(self.rhs),
             "holds": self.holds, "loc": self.loc, "line": self.line}
        if not self.user:
            d["user"] = False
        return d

    @classmethod
    def from_json(cls, d) -> "Guard":
        """A guard from `to_json`'s dict; ExprError when it is not one."""
        if not isinstance(d, dict) or d.get("op") not in _CMP or type(d.get("holds")) is not bool \
                or not all(isinstance(d.get(k), str) for k in ("lhs", "rhs", "loc", "line")):
            raise ExprError(f"not a size guard: {d!r}"[:200])
        if type(d.get("user", True)) is not bool:
            raise ExprError(f"not a size guard: {d!r}"[:200])
        g = cls(parse(d["lhs"]), d["op"], parse(d["rhs"]), d["holds"], d["loc"], d["line"])
        g.user = d.get("user", True)
        return g

    def describe(self, sizes=None) -> str:
        what = self.text() if self.holds else f"not ({self.text()})"
        at = f" at {self.loc}" + (f": {self.line}" if self.line else "") if self.loc else ""
        now = ""
        if sizes is not None:
            now = " for " + ", ".join(f"{s}={sizes[s]}" for s in sorted(symbols(self.lhs) |
                                                                        symbols(self.rhs)))
        return f"'{what}'{at}{now}"

    def __eq__(self, other):
        return isinstance(other, Guard) and (self.lhs, self.op, self.rhs, self.holds) == (
            other.lhs, other.op, other.rhs, other.holds)

    def __hash__(self):
        return hash((self.lhs, self.op, self.rhs, self.holds))

    def __repr__(self):
        return f"<Guard {self.describe()}>"


def failing(guards, sizes):
    """The first guard that does not hold at `sizes`, or None."""
    for g in guards:
        if not g.check(sizes):
            return g
    return None


_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class _Deciding(threading.local):
    n = 0            # depth of `deciding` blocks in this thread (tracing is per thread)


_DECIDING = _Deciding()


class deciding:
    """``with deciding():`` marks sampan code whose comparisons on sizes choose what the
    program computes (a variance's degrees of freedom, how a slice is clamped): they are
    recorded as guards like the user's own. Elsewhere sampan's comparisons (shape rules,
    broadcasting, the gradient engine, caches) are checks that hold at every size."""

    def __enter__(self):
        _DECIDING.n += 1

    def __exit__(self, *exc):
        _DECIDING.n -= 1


class ShapeEnv:
    """Where the comparisons on symbolic sizes of one trace are written down. `recording`
    is on while the trace runs the traced function. A comparison is recorded when the
    user's code makes it, or sampan's inside `deciding()`; `quiet()` turns recording off
    (around shape rules)."""

    def __init__(self):
        self.guards = []
        self.seen = set()
        self.recording = False
        self._quiet = 0

    def record(self, lhs, op, rhs, holds):
        if not self.recording or self._quiet:
            return
        if not _DECIDING.n and sys._getframe(2).f_code.co_filename.startswith(_PKG):
            return                      # sampan's own bookkeeping (see `deciding`)
        if lhs == rhs and op in ("==", "<=", ">=", "!="):
            return                      # decided by the expressions alone
        g = Guard(lhs, op, rhs, holds)
        g.user = not _DECIDING.n
        if g in self.seen:
            return
        import linecache

        from ..errors import user_frame
        fn, ln = user_frame()
        g.loc = f"{os.path.basename(fn)}:{ln}"
        g.line = linecache.getline(fn, ln).strip()[:200]
        self.seen.add(g)
        self.guards.append(g)

    def quiet(self):
        return _Quiet(self)


class _Quiet:
    __slots__ = ("env",)

    def __init__(self, env):
        self.env = env

    def __enter__(self):
        self.env._quiet += 1

    def __exit__(self, *exc):
        self.env._quiet -= 1


# ---------------------------------------------------------------------- symbolic numbers
def expr_of(x):
    """The Expr of a SymInt/SymFloat, of a plain number its constant, else None."""
    if isinstance(x, (SymInt, SymFloat)):
        return x.expr
    if type(x) in (int, float, bool):
        return const(int(x) if type(x) is bool else x)
    return None


def _make(v, e, env):
    c = value(e)
    if c is not None:
        return v             # the expression is a constant: a plain number
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return SymInt(v, e, env)
    if isinstance(v, float) and math.isfinite(v):
        return SymFloat(v, e, env)
    return v


def _arith(op, reflected=False):
    def f(self, other):
        eo = expr_of(other)
        if eo is None:
            return NotImplemented
        a, b = (other, self) if reflected else (self, other)
        ea, eb = (eo, self.expr) if reflected else (self.expr, eo)
        v = _APPLY[op](self._plain(a), self._plain(b))
        return _make(v, combine(op, ea, eb), self.env)
    return f


def _compare(op):
    def f(self, other):
        eo = expr_of(other)
        if eo is None:
            return NotImplemented
        r = _CMP[op](self._plain(self), self._plain(other))
        self.env.record(self.expr, op, eo, r)
        return r
    return f


class _SymOps:
    """The arithmetic and comparisons SymInt and SymFloat share."""

    __slots__ = ()

    @staticmethod
    def _plain(x):
        if isinstance(x, SymInt):
            return int.__int__(x)
        if isinstance(x, SymFloat):
            return float.__float__(x)
        return x

    __add__, __radd__ = _arith("+"), _arith("+", True)
    __sub__, __rsub__ = _arith("-"), _arith("-", True)
    __mul__, __rmul__ = _arith("*"), _arith("*", True)
    __truediv__, __rtruediv__ = _arith("/"), _arith("/", True)
    __floordiv__, __rfloordiv__ = _arith("//"), _arith("//", True)
    __mod__, __rmod__ = _arith("%"), _arith("%", True)
    __lt__, __le__, __gt__, __ge__ = _compare("<"), _compare("<="), _compare(">"), \
        _compare(">=")
    __eq__, __ne__ = _compare("=="), _compare("!=")

    def __neg__(self):
        return self * -1

    def __pos__(self):
        return self

    def __bool__(self):
        r = self._plain(self) != 0
        self.env.record(self.expr, "!=", const(0), r)
        return r

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("a symbolic size cannot be pickled (it belongs to one trace)")

    def __str__(self):
        return repr(self._plain(self))

    __repr__ = __str__

    @property
    def text(self) -> str:
        return text(self.expr)


class SymInt(_SymOps, int):
    """An int (its value at the traced size) that knows its size expression; see module
    doc."""

    def __new__(cls, v, expr, env):
        self = int.__new__(cls, v)
        self.expr, self.env = expr, env
        return self

    __hash__ = int.__hash__

    def __abs__(self):
        return self if int.__int__(self) >= 0 else -self

    def __index__(self):
        return int.__int__(self)

    def __round__(self, n=None):
        return self

    __trunc__ = __floor__ = __ceil__ = __round__


class SymFloat(_SymOps, float):
    """A float computed from symbolic sizes (``1 / batch``); see module doc."""

    def __new__(cls, v, expr, env):
        self = float.__new__(cls, v)
        self.expr, self.env = expr, env
        return self

    __hash__ = float.__hash__


def is_symbolic(x) -> bool:
    """Whether `x` (a number, or a tuple/list/dict of them) holds a SymInt or SymFloat."""
    if isinstance(x, (SymInt, SymFloat)):
        return True
    if isinstance(x, (tuple, list)):
        return any(is_symbolic(a) for a in x)
    if isinstance(x, dict):
        return any(is_symbolic(a) for a in x.values())
    return False


def as_int(d):
    """`d` as an int, keeping a SymInt's expression (``int(d)`` would drop it)."""
    return d if isinstance(d, SymInt) else int(d)


def as_float(x):
    """`x` as a float, keeping the expression of a SymInt/SymFloat."""
    if isinstance(x, SymFloat):
        return x
    if isinstance(x, SymInt):
        return _make(float(int.__int__(x)), x.expr, x.env)
    return float(x)
