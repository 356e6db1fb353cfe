"""Guards: the Python world a trace read, checked before each call (as dynamo's guards).

A trace bakes into its graph whatever it read besides its tensor arguments: numbers in
closure cells, globals and default arguments, the items of dicts and lists those hold,
a Layer's attributes, and which Parameter, buffer or captured tensor objects it used.
`build` lists one guard per such source: a name for messages and a function giving a
*snapshot* (plain data, objects compared by identity). A cached trace whose guards no
longer give the same snapshots is traced again; the RetraceWarning names the source.

What is guarded is what the traced function can reach: its closure cells, the globals
its code names, its defaults, and through them user functions, Layers (attributes,
registries of parameters/buffers/sub-layers, hooks), dicts, lists, tuples,
SimpleNamespace, dataclass and other plain instances of the user's classes (a config
object, argparse.Namespace: their `__dict__`), to a small depth and size. Reads through
objects reached otherwise (a global of a module the function does not name, an object's
property computed on the fly) are not guarded: pass such values as arguments, or as
tensors.

Example::

    >>> cfg = {"scale": 2.0}
    >>> f = sampan.jit(lambda x: x * cfg["scale"])
    >>> f(x); cfg["scale"] = 5.0; f(x)            # traced again: multiplies by 5
"""
from __future__ import annotations

import dataclasses
import dis
import functools
import types

import numpy as np

MAX_ITEMS = 64        # containers larger than this are guarded by identity and length
MAX_DEPTH = 3         # nesting of containers, and of functions reached from functions
_SCALARS = frozenset((bool, int, float, complex, str, bytes, type(None)))
_REGISTRIES = ("_parameters", "_buffers", "_layers")
_HOOKS = ("_forward_pre_hooks", "_forward_hooks")
_MISSING = object()
_DEEP = frozenset((list, dict, tuple, types.SimpleNamespace))



def _jitted(v) -> bool:
    """Whether `v` is a jitted function (`JitFunction`: its `.fn` is what it runs)."""
    return getattr(type(v), "jit_wrapped", False) is True

class Ref:
    """A snapshot part that compares by identity (tensors, layers, functions, objects)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return type(other) is Ref and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)

    def __repr__(self):
        o = self.obj
        return f"<{type(o).__name__} at {id(o):#x}>"


def snapshot(v, depth=0):
    """Plain data standing for `v`: equal snapshots, equal traces."""
    t = type(v)
    if t in _SCALARS:
        return (t, v)              # the type too: 2 and 2.0 trace differently
    if isinstance(v, np.generic):
        return (t, v.item())
    if depth < MAX_DEPTH:
        if t is tuple or t is list:
            if len(v) <= MAX_ITEMS:
                return (t, tuple([snapshot(x, depth + 1) for x in v]))
            return (t, Ref(v), len(v))
        if t is dict:
            if len(v) <= MAX_ITEMS:
                return (t, tuple([(k if type(k) in _SCALARS else Ref(k),
                                   snapshot(x, depth + 1)) for k, x in v.items()]))
            return (t, Ref(v), len(v))
        if t is types.SimpleNamespace or (dataclasses.is_dataclass(v) and not isinstance(
                v, type)) or _plain(v):
            d = getattr(v, "__dict__", None)      # None for a dataclass with __slots__
            if d is not None and len(d) <= MAX_ITEMS:
                return (t, Ref(v), tuple([(k, snapshot(x, depth + 1)) for k, x in d.items()]))
    return Ref(v)


def _plain(v) -> bool:
    """An instance of a user's class holding its data in `__dict__` (a config object,
    argparse.Namespace): its attributes are data a trace may bake in. Not a Layer (its own
    check), nor sampan's or numpy's objects, functions, modules or classes."""
    t = type(v)
    if t.__module__ in ("builtins", "types") or _internal(t) or isinstance(v, type) \
            or not hasattr(v, "__dict__"):
        return False
    from ..nn.layer import Layer
    return not isinstance(v, (Layer, types.ModuleType, types.FunctionType,
                              types.MethodType, functools.partial))


class LayersCheck:
    """Whether some Layers' attributes, registries of parameters, buffers and sub-layers
    (by identity) and hooks are as they were when made; call it for the answer.

    It runs before every call, so it compares dicts in C: each attribute dict against a
    shallow copy (values the same objects, or equal scalars), each registry against a
    copy of it; containers held in attributes are compared by snapshot."""

    __slots__ = ("pairs", "deep", "names", "lives", "copies")

    def __init__(self):
        self.pairs = []           # (live dict, copy, layer name)
        self.deep = []            # (attribute dict, key, snapshot, layer name)
        self.names = []
        self.lives = self.copies = ()

    def add(self, layer, name):
        d = layer.__dict__
        self.pairs.append((d, dict(d), name))
        for k in _REGISTRIES + _HOOKS:
            if k in d:
                self.pairs.append((d[k], d[k].copy(), name))
        for k, v in d.items():
            if k not in _REGISTRIES and k not in _HOOKS and (type(v) in _DEEP or _plain(v)):
                self.deep.append((d, k, snapshot(v), name))
        self.names.append(name)
        self.lives = tuple(p[0] for p in self.pairs)
        self.copies = tuple(p[1] for p in self.pairs)

    def __call__(self):
        try:      # one comparison of two tuples of dicts: the loop runs in C
            if self.lives != self.copies:
                return False
        except Exception:
            return False
        for d, k, snap, _ in self.deep:
            if snapshot(d.get(k)) != snap:
                return False
        return True

    def changed(self):
        """The name of the first layer that changed, or None."""
        for live, copy, name in self.pairs:
            try:
                if live != copy:
                    return name
            except Exception:   # a new tensor or array compared elementwise: changed
                return name
        for d, k, snap, name in self.deep:
            if snapshot(d.get(k)) != snap:
                return name
        return None


def _internal(obj) -> bool:
    """sampan's own code and libraries': what they read is not the user's to change."""
    mod = getattr(obj, "__module__", None) or ""
    return mod == "sampan" or mod.startswith(("sampan.", "numpy", "builtins"))


def _code_names(code, out):
    """The global names `code` (and the code nested in it) loads: not attribute names,
    which share co_names (a module-level `out = step(x)` must not guard `self.out`)."""
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            out.add(ins.argval)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _code_names(c, out)
    return out


def _cell(c):
    try:
        return c.cell_contents
    except ValueError:     # an empty cell (a variable assigned later)
        return _MISSING


class _Builder:
    def __init__(self):
        self.guards = []          # (name, getter)
        self.seen = set()

    def watch(self, name, getter, value, depth):
        if isinstance(value, (types.ModuleType, type)) or value is _MISSING:
            return                # modules and classes: not data a trace bakes in
        if isinstance(value, types.BuiltinFunctionType):
            return
        self.guards.append((name, getter))
        self.explore(value, name, depth)

    def explore(self, v, where, depth):
        """Follow `v` to the functions and Layers it holds (their reads are guarded too)."""
        from ..nn.layer import Layer
        if depth > MAX_DEPTH or id(v) in self.seen:
            return
        if isinstance(v, Layer):
            self.layer(v, where)
        elif isinstance(v, (types.FunctionType, types.MethodType, functools.partial)) \
                or _jitted(v):
            self.function(v, depth + 1)
        elif type(v) in (list, tuple) and len(v) <= MAX_ITEMS:
            self.seen.add(id(v))
            for i, x in enumerate(v):
                self.explore(x, f"{where}[{i}]", depth + 1)
        elif type(v) is dict and len(v) <= MAX_ITEMS:
            self.seen.add(id(v))
            for k, x in v.items():
                self.explore(x, f"{where}[{k!r}]", depth + 1)

    def layer(self, root, where):
        check = LayersCheck()
        for path, sub in root.named_layers():
            if id(sub) in self.seen:
                continue
            self.seen.add(id(sub))
            check.add(sub, f"{where}.{path} ({type(sub).__name__})" if path else
                      f"{where} ({type(sub).__name__})")
            if not _internal(type(sub)):
                self.function(type(sub).forward, 1)
        if check.names:
            self.guards.append((_LayersName(check), check))

    def function(self, f, depth):
        if id(f) in self.seen or depth > MAX_DEPTH:
            return
        self.seen.add(id(f))
        if _jitted(f):
            return self.function(f.fn, depth)
        if isinstance(f, types.MethodType):
            self.explore(f.__self__, _qual(f.__self__), depth)
            return self.function(f.__func__, depth)
        if isinstance(f, functools.partial):
            self.watch(f"the arguments bound by {f!r}"[:200],
                       lambda p=f: snapshot((p.args, p.keywords)), f.args, depth)
            return self.function(f.func, depth)
        if not isinstance(f, types.FunctionType) or _internal(f):
            return
        qual = f.__qualname__
        code = f.__code__
        for name, cell in zip(code.co_freevars, f.__closure__ or ()):
            self.watch(f"'{name}' (a variable {qual} captured)",
                       lambda c=cell: snapshot(_cell(c)), _cell(cell), depth)
        g = f.__globals__
        for name in sorted(_code_names(code, set())):
            if name in g:
                self.watch(f"global '{name}' (read by {qual})",
                           lambda g=g, n=name: snapshot(g.get(n, _MISSING)), g[name], depth)
        if f.__defaults__ or f.__kwdefaults__:
            self.watch(f"the default arguments of {qual}",
                       lambda f=f: snapshot((f.__defaults__, f.__kwdefaults__)),
                       (f.__defaults__, f.__kwdefaults__), depth)


class _LayersName(str):
    """A guard name that says which layer changed when asked after the change."""

    def __new__(cls, check):
        self = super().__new__(cls, f"the attributes, parameters or buffers of "
                                    f"{check.names[0]} or its sub-layers")
        self.check = check
        return self

    def now(self):
        which = self.check.changed()
        return f"the attributes, parameters or buffers of {which}" if which else str(self)


def _qual(obj):
    return type(obj).__name__


def build(fn, layer=None):
    """[(name, getter)] guarding what a trace of `fn` (or of `layer`) may have read."""
    b = _Builder()
    if layer is not None:
        b.layer(layer, type(layer).__name__)
    b.function(fn, 0)
    return b.guards


class TensorGuard:
    """Whether the tensors a trace read are as traced: each constant tensor still wraps
    the same array, unmodified and not requiring grad (the graph baked it in, maybe
    folded); each state tensor still requires grad or not as traced (that decides its
    gradient). Call it for the answer; `changed()` says what changed."""

    __slots__ = ("consts", "state")

    def __init__(self, consts, state):
        self.consts = tuple(consts)     # (tensor, array, version)
        self.state = tuple(state)       # (tensor, requires_grad)

    def __call__(self):
        for t, a, ver in self.consts:
            b = t._base
            if t._data is not a or (b if b is not None else t)._version != ver \
                    or t.requires_grad:
                return False
        for t, rg in self.state:
            if t.requires_grad is not rg:
                return False
        return True

    def changed(self):
        from ..dtypes import short_name
        for t, a, ver in self.consts:
            b = t._base
            what = ("was given another array" if t._data is not a else "now requires grad"
                    if t.requires_grad else "was changed in place"
                    if (b if b is not None else t)._version != ver else None)
            if what:
                return (f"a tensor {short_name(a.dtype)}{list(a.shape)} that the trace read as "
                        f"a constant (it {what}: pass it as an argument to read it per call)")
        for t, rg in self.state:
            if t.requires_grad is not rg:
                return (f"the requires_grad of a state tensor {short_name(t.dtype)}"
                        f"{list(t.shape)}")
        return None


class _TensorGuardName(str):
    def __new__(cls, guard):
        self = super().__new__(cls, "a tensor the trace read (replaced, changed in place, "
                                    "or its requires_grad)")
        self.guard = guard
        return self

    def now(self):
        return self.guard.changed() or str(self)


def tensor_guard(consts, state):
    """(name, guard) over the tensors a trace read (see `TensorGuard`)."""
    g = TensorGuard(consts, state)
    return _TensorGuardName(g), g
