"""Symbolic dimensions: one traced program for every batch size (or sequence length).

``sampan.jit(fn, dynamic={"x": {0: "batch"}})`` (or ``dynamic="batch"``: dim 0 of every
tensor argument) marks dims whose size varies between calls. The function is traced at
the call's sizes and once more per symbol at another size, and the optimised graphs are
unified node for node into one with symbolic dims (``f32[batch,4]``) and attributes
(``"$8*batch"``); it is compiled once per concrete size, on first use (`SymbolicProgram`),
which costs milliseconds: generated kernels are shared.

While tracing, a marked dim is a `SymInt` (`sampan.ir.symbolic`): an int with its value
at the traced size, so Python runs as it would eagerly, that also carries its expression.
``x.shape[0] - 1``, ``(n - 1) // 2``, ``x.numel()``, ``arange(x.shape[1])``, the extent of
``x[1:]`` or ``w[:seq]`` stay symbolic, and where such a number reaches the graph (an
attribute, a scalar operand, a fill) it is written as its expression, checked against the
probe traces. Sizes guessed from the probes' values alone are what the unifier falls back
to for the rest (dims and constants that are multiples of the symbols: ``8*batch``,
``0.5/batch``); a value that agrees at both probe sizes by chance (the median's index) is
no longer baked in, because it arrives as a SymInt.

Every comparison the traced code makes on a symbolic size (``if x.shape[0] > 4:``,
``max(n - 1, 1)``, how ``w[:seq]`` clamps to ``len(w)``) is recorded as a guard
``(expression, op, other side, answer, user's line)``, as dynamo's shape guards. sampan's
own comparisons count only where marked (`sampan.ir.symbolic.deciding`: a variance's
degrees of freedom, slices, arange); shape rules, broadcasting and the gradient engine
check, they do not decide. The traces at the probe sizes must give every guard the same
answer; a call is served only where the guards still hold:
- `sampan.jit(fn, dynamic=...)` traces again for a call outside them (a program for the
  other side of the branch), and where the probe traces themselves disagree (``> 2``
  traced at 2 and 3) traces a program for exactly the call's sizes;
- `sampan.jit.save(..., dynamic=...)` stores the guards in meta.json ("guards"; programs
  without them load as before), refuses to save when the probes disagree, and the loaded
  program raises `DynamicShapeError` naming the user's line for a call outside them.

What still depends on the size in a way no SymInt reaches (numpy computing from
``x.shape[0]``, a Python loop of ``range(n)`` steps) fails with an error naming the op and
the source line. Small fills that constant folding turned into arrays (``zeros(n, 8)``)
become ``full`` nodes again. A float computed as ``0.5 / n`` (a float on the left) is a
plain float: the unifier recognises the multiples of the sizes among those.
"""
from __future__ import annotations

import math
import re

import numpy as np

from ..errors import DynamicShapeError, SampanError
from ..ir import symbolic as _sym
from ..ir import symint as _symint
from ..ir.symint import SymFloat, SymInt
from ..ops.registry import Spec
from ..tensor import Tensor
from .pytree import flatten

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")




# ---------------------------------------------------------------------- marking
def leaf_dims(dynamic, params, args, kwargs) -> dict:
    """{leaf index: {dim: symbol}} for `dynamic` (see module doc) over the call's tensors,
    in the order `pytree.flatten((args, kwargs))` lists them."""
    if dynamic is None:
        return {}
    if isinstance(dynamic, str):
        _check_name(dynamic)
    elif not isinstance(dynamic, dict):
        raise SampanError(f"sampan.jit: dynamic= must be a symbol name (dim 0 of every tensor "
                          f"argument) or a dict {{argument: {{dim: name}}}}; got {dynamic!r}")
    named = [(params[i] if i < len(params) else f"arg{i}", i, a) for i, a in enumerate(args)]
    named += [(k, k, a) for k, a in kwargs.items()]
    out, n = {}, 0
    known = set()
    for name, pos, a in named:
        leaves = []
        flatten(a, leaves)
        known |= {name, pos}
        if isinstance(dynamic, str):
            spec = {0: dynamic} if isinstance(a, Tensor) and a.ndim else None
        else:
            spec = dynamic.get(name, dynamic.get(pos))
        if spec is not None:
            if not isinstance(a, Tensor):
                raise SampanError(f"sampan.jit: dynamic= marks argument {name!r}, which is "
                                  f"{type(a).__name__}, not a tensor")
            out[n] = _dims_of(name, spec, a.ndim)
        n += len(leaves)
    if isinstance(dynamic, dict):
        unknown = [k for k in dynamic if k not in known]
        if unknown:
            raise SampanError(f"sampan.jit: dynamic= names {unknown}, which are not arguments "
                              f"of this call (arguments: {[p for p, _, _ in named]})")
    return out


def _check_name(s):
    if not isinstance(s, str) or not _NAME.fullmatch(s):
        raise SampanError(f"sampan.jit: a dynamic dim's name must be an identifier such as "
                          f"'batch'; got {s!r}")


def _dims_of(name, spec, ndim):
    if not isinstance(spec, dict):
        raise SampanError(f"sampan.jit: dynamic= for {name!r} must be {{dim: name}}; "
                          f"got {spec!r}")
    out = {}
    for d, s in spec.items():
        _check_name(s)
        if type(d) is not int or not -ndim <= d < ndim:
            raise SampanError(f"sampan.jit: dynamic= marks dim {d!r} of {name!r}, which has "
                              f"{ndim} dims")
        out[d % ndim] = s
    return out


def symbolic_shape(shape, dims):
    return tuple(dims.get(i, d) for i, d in enumerate(shape))


def bind(leaves, dyn) -> dict:
    """{symbol: size} of a call; one symbol must have one size in every input."""
    sizes, where = {}, {}
    for i, dims in dyn.items():
        shape = leaves[i].shape
        for d, s in dims.items():
            n = shape[d]
            if s in sizes and sizes[s] != n:
                raise DynamicShapeError(
                    f"sampan.jit: dim {d} of input {i} is {n}, but dynamic dim '{s}' is "
                    f"{sizes[s]} in {where[s]}; inputs that share a symbol must agree")
            sizes[s], where[s] = n, f"dim {d} of input {i}"
    return sizes


# ---------------------------------------------------------------------- guards
def merge_guards(lists, base, probes):
    """The comparisons on sizes that the traces at `base` and at each probe made (one
    list per trace), and the first that gives another answer at one of those sizes, as
    (guard, sizes) or None: where one does, the traces took different decisions and no
    single program serves all of them."""
    out, seen = [], set()
    for gl in lists:
        for g in gl:
            if g not in seen:
                seen.add(g)
                out.append(g)
    for sizes in [base] + [dict(base, **{s: n}) for s, n in probes]:
        bad = _symint.failing(out, sizes)
        if bad is not None:
            return out, (bad, sizes)
    return out, None


def guard_error(guard, sizes, what="program") -> DynamicShapeError:
    """The error for a call (or a probe trace) at `sizes` outside `guard`."""
    return DynamicShapeError(
        f"sampan.jit: the {what} was traced assuming {guard.describe()}, which does not "
        f"hold for {_sizes(sizes)}: the code decides on a dynamic size there (a comparison "
        "of x.shape[...], a slice clamped to a length), so this size needs another program. "
        "Trace (or save) at a size on the side you serve, or compute both sides with "
        "sampan.where")


def check_unguarded(guards, base, what, upto=1024):
    """For a program that cannot check guards per call (an ONNX model): raise
    DynamicShapeError for the first guard of the user's code (a branch on a size) that
    some size from 1 to `upto` of one of its symbols (the others at `base`) breaks; guards
    that hold at every such size say nothing about the sizes served. sampan's own
    decisions (how a slice clamps) stay unchecked there, as before guards existed."""
    for g in guards:
        if not g.user:
            continue
        for s in sorted(guard_symbols(g)):
            for k in range(1, upto + 1):
                sizes = dict(base, **{s: k})
                try:
                    ok = g.check(sizes)
                except ZeroDivisionError:
                    ok = False
                if not ok:
                    raise guard_error(g, sizes, what)


def failing_guard(guards, sizes):
    """The first of `guards` that `sizes` break, or None."""
    return _symint.failing(guards, sizes)


def guard_symbols(guard) -> set:
    return _sym.symbols(guard.lhs) | _sym.symbols(guard.rhs)


def guards_json(guards) -> list:
    return [g.to_json() for g in guards]


def guards_from_json(items, what) -> list:
    """Guards read from a saved program's meta.json; SampanError when malformed."""
    if not isinstance(items, list):
        raise SampanError(f"{what}: 'guards' is {type(items).__name__}, not a list")
    try:
        return [_symint.Guard.from_json(d) for d in items]
    except _sym.ExprError as e:
        raise SampanError(f"{what}: {e}") from None


# ---------------------------------------------------------------------- unification
def unify(g0, others, base, probes, what="program"):
    """Merge the base graph `g0` (traced at sizes `base`) with `others[k]`, traced with
    probes[k] = (symbol, size) changed, into one graph with symbolic dims (in place on a
    copy of g0). Raises DynamicShapeError naming the first op that does not generalise."""
    g = g0.copy()
    # the graph and the blocks of its control-flow nodes, unified as one sequence
    gs = list(g.walk())
    ogs = [list(o.walk()) for o in others]
    vals = [[v for b in og for v in b.values()] for og in ogs]
    owner = [b for b in gs for _ in b.values()]
    mine = [v for b in gs for v in b.values()]
    nodes = [n for b in gs for n in b.nodes]
    onodes = [[n for b in og for n in b.nodes] for og in ogs]
    if any(len(v) != len(mine) or len(og) != len(gs) or len(on) != len(nodes)
           or [n.op for n in on] != [n.op for n in nodes]
           for v, og, on in zip(vals, ogs, onodes)):
        bad = _first_diff(g, others)
        raise DynamicShapeError(
            f"sampan.jit: the {what} traced at another size of {_syms(probes)} is a different "
            f"program{bad}: something reads the size as a Python value (a branch, a loop "
            "count). Mark only dims the code treats generically, or pad to one size")
    fills, vectors, ranges = [], [], []
    for k, v in enumerate(mine):
        blk = owner[k]
        others_v = [vs[k] for vs in vals]
        shape = []
        for j, d in enumerate(v.shape):
            ds = [o.shape[j] if j < len(o.shape) else None for o in others_v]
            e = (_symbolic_int(d, ds, base, probes) if isinstance(d, SymInt) else None) \
                if None not in ds else None
            if e is None and None not in ds:
                e = _sym.unify_int(int(d), [int(x) for x in ds], base, probes)
            if e is None:
                raise DynamicShapeError(
                    f"sampan.jit: dim {j} of {v.type_str()}{_where(v, g)} is {d} at "
                    f"{_sizes(base)} and {ds} when {_syms(probes)} change: it is not a "
                    f"multiple of the dynamic dims, so one program cannot serve every size")
            shape.append(e)
        v.shape = tuple(shape)
        if v.const is not None:
            cs = [o.const for o in others_v]
            if all(c.shape == v.const.shape and np.array_equal(c, v.const, equal_nan=True)
                   for c in cs):
                continue
            fill = _uniform(v.const)
            fills_o = [_uniform(c) for c in cs]
            if fill is not None and None not in fills_o and v.dtype.kind == "f":
                digits = 15 if v.dtype.itemsize == 8 else 6 if v.dtype.itemsize == 4 else 3
                fill = _sym.unify_float(float(fill), [float(f) for f in fills_o], base, probes,
                                    digits)
            elif fill is not None and any(f != fill for f in fills_o):
                fill = None
            if fill is None and v.dtype.kind in "iu" and v.ndim <= 1 and all(
                    c.shape == v.const.shape for c in cs):
                # a shape vector (x.shape as a tensor): each entry a multiple of the symbols
                ents = [_sym.unify_int(int(x), [int(c.reshape(-1)[j]) for c in cs], base, probes)
                        for j, x in enumerate(v.const.reshape(-1))]
                if None not in ents:
                    vectors.append((blk, v, ents))
                    continue
            start = _arange_start(v, cs)
            if fill is None and start is not None:
                ranges.append((blk, v, start))    # positions 0..seq-1 folded from the size
                continue
            if fill is None or (not isinstance(fill, str)
                                and all(isinstance(d, int) for d in v.shape)):
                raise DynamicShapeError(
                    f"sampan.jit: a constant {v.type_str()}{_where(v, g)} holds other values "
                    f"at another size of {_syms(probes)}: the traced code computed it from "
                    "the size (e.g. x.shape[0] as a number); compute it with ops on the "
                    "input instead")
            fills.append((blk, v, fill))
    for n, *ons in zip(nodes, *onodes):
        try:
            n.attrs = {a: _unify_attr(x, [o.attrs.get(a) for o in ons], base, probes)
                       for a, x in n.attrs.items()}
        except _NoUnify:
            raise DynamicShapeError(
                f"sampan.jit: {n.op} at {n.loc or '?'} has attributes {n.attrs} that change "
                f"with {_syms(probes)} in a way that is not a multiple of them") from None
    for g, v, fill in fills:     # folded fills become fills of the symbolic shape again
        value = _sym.attr(fill) if isinstance(fill, str) else fill
        value = value.item() if isinstance(value, np.generic) else value
        node = g.add_node("full", [], {"shape": tuple(_attr_of(d) for d in v.shape),
                                       "value": value, "dtype": v.dtype.name},
                          out_specs=[v])
        out = node.outputs[0]
        g.nodes.insert(0, g.nodes.pop())
        g.replace_all_uses_with(v, out)
    for g, v, ents in vectors:   # symbolic shape vectors: one fill per entry, concatenated
        parts = [g.add_node("full", [], {"shape": (1,), "value": _attr_of(e),
                                         "dtype": v.dtype.name},
                            out_specs=[Spec((1,), v.dtype)]).outputs[0] for e in ents]
        if v.ndim == 0:
            node = g.add_node("reshape", parts, {"shape": ()}, out_specs=[v])
        else:
            node = g.add_node("concat", parts, {"axis": 0}, out_specs=[v])
        made = g.nodes[-(len(parts) + 1):]
        del g.nodes[-(len(parts) + 1):]
        g.nodes[0:0] = made
        g.replace_all_uses_with(v, node.outputs[0])
    for g, v, start in ranges:   # a folded arange of a symbolic length: an arange node again
        stop = _attr_of(v.shape[0]) if start == 0 else _sym.attr(f"{start}+{v.shape[0]}")
        node = g.add_node("arange", [], {"start": start, "stop": stop, "step": 1,
                                         "dtype": v.dtype.name}, out_specs=[v])
        g.nodes.insert(0, g.nodes.pop())
        g.replace_all_uses_with(v, node.outputs[0])
    if fills or vectors or ranges:
        for b in gs:
            b.prune_consts()
    return gs[0]


def _arange_start(v, consts):
    """`start` when constant `v` and its probes' `consts` are each start, start+1, ... of
    their own lengths (an ONNX model's Range over a Shape, folded at each size) and the
    length is symbolic; else None."""
    if v.ndim != 1 or v.dtype.kind not in "iu" or isinstance(v.shape[0], int) or not len(
            v.const):
        return None
    start = int(v.const[0])
    for c in [v.const] + list(consts):
        if c.ndim != 1 or not np.array_equal(c, np.arange(start, start + len(c))):
            return None
    return start


class _NoUnify(Exception):
    pass


def _attr_of(d):
    return d if isinstance(d, int) else _sym.attr(d)


def _symbolic_int(x, xs, base, probes):
    """The expression text of SymInt `x` (an int seen as `xs` at the probes) when it
    agrees with every probe; None when it does not (the probes traced otherwise)."""
    for (s, n), y in zip(probes, xs):
        if _sym.evaluate(x.expr, dict(base, **{s: n})) != y:
            return None
    return _sym.text(x.expr)


def _symbolic_float(x, xs, base, probes):
    for (s, n), y in zip(probes, xs):
        try:
            want = float(_sym.evaluate(x.expr, dict(base, **{s: n})))
        except ZeroDivisionError:
            return None
        if not isinstance(y, (int, float)) or not math.isclose(want, y, rel_tol=1e-9,
                                                               abs_tol=1e-12):
            return None
    return _sym.text(x.expr)


def _unify_attr(x, xs, base, probes):
    if isinstance(x, (SymInt, SymFloat)):
        # a number the traced code computed from the sizes: its expression, checked
        # against the probes (it would agree at them by chance if guessed from values)
        e = (_symbolic_int if isinstance(x, SymInt) else _symbolic_float)(
            x, xs, base, probes)
        if e is not None:
            return _sym.attr(e)
        # its expression does not fit the probes (a number a cache kept from another
        # trace): read it as a plain number, as below
        x = int(x) if isinstance(x, SymInt) else float(x)
    if isinstance(x, dict):
        if any(not isinstance(y, dict) or y.keys() != x.keys() for y in xs):
            raise _NoUnify
        return {k: _unify_attr(a, [y[k] for y in xs], base, probes) for k, a in x.items()}
    if type(x) is int:
        if any(not isinstance(y, int) or isinstance(y, bool) for y in xs):
            raise _NoUnify
        xs = [int(y) for y in xs]
        e = _sym.unify_int(x, xs, base, probes)
        if e is None:
            raise _NoUnify
        return _attr_of(e)
    if type(x) is float:
        if any(not isinstance(y, float) for y in xs):
            raise _NoUnify
        xs = [float(y) for y in xs]
        e = _sym.unify_float(x, xs, base, probes)
        if e is None:
            raise _NoUnify
        return _attr_of(e) if isinstance(e, str) else e
    if isinstance(x, tuple):
        if any(not isinstance(y, tuple) or len(y) != len(x) for y in xs):
            raise _NoUnify
        return tuple(_unify_attr(a, [y[i] for y in xs], base, probes) for i, a in enumerate(x))
    if isinstance(x, list):
        return list(_unify_attr(tuple(x), [tuple(y) for y in xs], base, probes))
    if any(y != x for y in xs if not (isinstance(x, float) and x != x)):
        raise _NoUnify
    return x


def _uniform(a):
    if a.size == 0:
        return None
    f = a.reshape(-1)[0]
    return f if np.all(a == f) else None


def _where(v, g):
    if v.node is not None:
        return f" (made by {v.node.op} at {v.node.loc or '?'})"
    users = [n for n in g.nodes if any(u is v for u in n.inputs)]
    if users:
        return f" (read by {users[0].op} at {users[0].loc or '?'})"
    return ""


def _first_diff(g, others):
    for o in others:
        for a, b in zip(g.nodes, o.nodes):
            if a.op != b.op:
                return f" (first difference: {a.op} at {a.loc or '?'} vs {b.op} at " \
                       f"{b.loc or '?'})"
        if len(o.nodes) != len(g.nodes):
            return f" ({len(g.nodes)} vs {len(o.nodes)} nodes)"
    return ""


def _syms(probes):
    return ", ".join(f"'{s}'" for s, _ in probes)


_sizes = _sym.sizes_text


# ---------------------------------------------------------------------- probes
def probe_sizes(base: dict) -> tuple[dict, list]:
    """Sizes to trace at: the call's own (a size of 1 is traced at 2 instead, since
    broadcasting treats 1 specially) and, per symbol, one more."""
    b = {s: (n if n >= 2 else 2) for s, n in base.items()}
    return b, [(s, n + 1) for s, n in sorted(b.items())]


def resized(leaves, dyn, sizes):
    """The call's tensors with their dynamic dims at `sizes`: slices repeat cyclically, so
    the values (ids into a table …) stay valid inputs. A dim of stride 0 (a broadcast view,
    as `sampan.onnx.load` traces on) keeps stride 0: probes of a declared f32[b, 65536,
    65536] hold one element, as the example does."""
    out = list(leaves)
    for i, dims in dyn.items():
        t = leaves[i]
        a = t._data
        for d, s in dims.items():
            n = sizes[s]
            if a.shape[d] != n:
                if a.shape[d] == 0:
                    raise DynamicShapeError(f"sampan.jit: dynamic dim '{s}' of input {i} is "
                                            "0; trace with a non-empty example")
                if a.strides[d] == 0:   # every index of dim d reads the same memory
                    a = np.lib.stride_tricks.as_strided(
                        a, a.shape[:d] + (n,) + a.shape[d + 1:], a.strides, writeable=False)
                else:
                    a = np.take(a, np.arange(n) % a.shape[d], axis=d)
        if a is not t._data:
            a = a if 0 in a.strides else np.ascontiguousarray(a)
            out[i] = Tensor(a, requires_grad=t.requires_grad)
    return out


# ---------------------------------------------------------------------- concretising
# (a symbolic graph at given sizes: the IR's, `sampan.ir.symbolic`; their names here too)
evaluate, symbols_of, concrete = _sym.size_at, _sym.symbols_of, _sym.concrete
input_dims, fits = _sym.input_dims, _sym.fits


class SymbolicProgram:
    """A graph with symbolic dims, callable like `runtime.Compiled`: each new binding of
    the symbols is concretised, planned and compiled once and cached."""

    MAX_CACHED = 64

    def __init__(self, graph, arg_positions, debug=False, release=True, label="program",
                 guards=()):
        self.graph = graph
        self.guards = list(guards)   # comparisons on sizes the trace decided (see above)
        self.debug = debug
        self.release = release
        self.label = label
        self.dims = input_dims(graph, arg_positions)
        self.symbols = symbols_of(graph)
        unbound = self.symbols - {s for d in self.dims.values() for s in d.values()}
        if unbound:
            raise DynamicShapeError(f"sampan.jit: symbols {sorted(unbound)} appear in the "
                                    f"{label} but no input dim is exactly one of them")
        self.cache = {}
        self.last = None

    @property
    def code(self):
        """The generated source for the most recent concrete size."""
        return self.last.code if self.last is not None else \
            "# compiled per concrete size on first call"

    def sizes_of(self, arrays) -> dict:
        sizes, where = {}, {}
        for p, dims in self.dims.items():
            shape = arrays[p].shape
            for d, s in dims.items():
                if d >= len(shape):
                    continue          # a rank mismatch: the caller's check names it
                n = shape[d]
                if s in sizes and sizes[s] != n:
                    raise DynamicShapeError(
                        f"{self.label}: dim {d} of input {p} is {n}, but '{s}' is {sizes[s]} "
                        f"from {where[s]}; inputs that share a dynamic dim must agree")
                sizes[s], where[s] = n, f"dim {d} of input {p}"
        return sizes

    def compiled_for(self, sizes):
        key = tuple(sorted(sizes.items()))
        c = self.cache.get(key)
        if c is None:
            from ..passes import PassManager
            from ..runtime import compile_graph
            g = PassManager(["plan_memory"]).run(concrete(self.graph, sizes))
            c = compile_graph(g, debug=self.debug, release=self.release)
            if len(self.cache) >= self.MAX_CACHED:
                self.cache.pop(next(iter(self.cache)))
            self.cache[key] = c
        self.last = c
        return c

    def check(self, sizes):
        """Raise DynamicShapeError when `sizes` are outside one of the guards."""
        bad = _symint.failing(self.guards, sizes)
        if bad is not None:
            raise guard_error(bad, sizes, self.label)

    def __call__(self, *arrays):
        sizes = self.sizes_of(arrays)
        if self.guards:
            self.check(sizes)
        return self.compiled_for(sizes)(*arrays)

