"""The op table's own numpy kernels as the source of the standalone module.

`sampan deploy` writes no kernel of its own: for each op a program uses it takes the op
table's numpy kernel (`OPS[op].kernels["numpy"]`, the kernel sampan runs without numba
and the numpy provider serves), binds a numpy ufunc by its numpy name, or copies a kernel
function's source together with everything it reads: the module-level functions it
calls (in any `sampan.ops` module, followed to the end) and module constants of plain
values. `np` and the builtins are all else a copied function may name; anything other
(a sampan error helper, a numba loop, a closure, a lambda) makes the op unsupported, so
a kernel that stops being plain numpy is found here, not in a user's deployment.

One node kind has no op of its own: a matmul the memory plan may give a buffer runs as
`sampan.ops.linalg.matmul_planned` (what the planned runtime computes for it).

Example::

    >>> from sampan.deploy.kernelsource import kernel_source
    >>> blocks, names = kernel_source(["relu", "add"])
    >>> names
    {'add': 'np.add', 'relu': '_relu'}
"""
from __future__ import annotations

import builtins
import dis
import inspect
import textwrap
import types

import numpy as np

from ..errors import SampanError
from ..ops.linalg import matmul_planned
from ..ops.registry import OPS
from ..runtime import emit

PLANNED = "planned_matmul"      # the body's name for a matmul into a planned buffer
_CONST_TYPES = (bool, int, float, str, type(None))
# modules whose functions a copied kernel may call (and so are copied too)
KERNEL_MODULES = ("sampan.ops.",)


class DeployError(SampanError):
    """A saved program cannot be written as a standalone numpy module."""


def kernel_of(op: str):
    """The op table's numpy kernel that runs `op` in the module (None: no such op)."""
    if op == PLANNED:
        return matmul_planned
    o = OPS.get(op)
    return o.kernels.get("numpy") if o is not None else None


def ufunc_name(k) -> str | None:
    """`k`'s name in numpy when it is numpy's own ufunc (bound as ``np.<name>``)."""
    if isinstance(k, np.ufunc) and getattr(np, k.__name__, None) is k:
        return k.__name__
    return None


def _codes(code):
    yield code
    for c in code.co_consts:     # nested functions (a helper's local helper)
        if inspect.iscode(c):
            yield from _codes(c)


def _is_const(v) -> bool:
    if isinstance(v, tuple):
        return all(_is_const(x) for x in v)
    return isinstance(v, _CONST_TYPES)


class _Collector:
    """The functions and constants a set of kernel functions needs (see module doc)."""

    def __init__(self, modules=KERNEL_MODULES):
        self.modules = modules
        self.functions: dict = {}     # name -> function, callers after their callees
        self.seen: dict = {}          # name -> function, visited or being visited
        self.constants: dict = {}     # name -> value

    def function(self, fn, who: str):
        what = getattr(fn, "__qualname__", repr(fn))
        if not isinstance(fn, types.FunctionType) or fn.__name__ != fn.__qualname__ \
                or fn.__closure__ or fn.__name__ == "<lambda>":
            raise DeployError(f"sampan deploy: {who}: {what} is not a module-level function "
                              "(a closure, lambda or compiled loop cannot be copied)")
        if not fn.__module__.startswith(self.modules):
            raise DeployError(f"sampan deploy: {who}: {what} is in {fn.__module__}, not a "
                              f"kernel module ({', '.join(self.modules)})")
        prev = self.seen.get(fn.__name__)
        if prev is fn:
            return
        if prev is not None:
            raise DeployError(f"sampan deploy: {who}: two kernel functions are named "
                              f"{fn.__name__} ({prev.__module__}, {fn.__module__})")
        self.seen[fn.__name__] = fn          # before its callees: recursion ends here
        for code in _codes(fn.__code__):
            for ins in dis.get_instructions(code):
                if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                    self.name(ins.argval, fn, who)
        self.functions[fn.__name__] = fn

    def name(self, name, fn, who):
        g = fn.__globals__
        if name not in g:
            if not hasattr(builtins, name):
                raise DeployError(f"sampan deploy: {who}: {fn.__qualname__} reads "
                                  f"{name!r}, which its module does not define")
            return
        v = g[name]
        if v is np:
            if name != "np":
                raise DeployError(f"sampan deploy: {who}: {fn.__qualname__} names numpy "
                                  f"{name!r}; kernels call it np")
        elif isinstance(v, types.FunctionType):
            self.function(v, who)
        elif _is_const(v):
            if name in self.constants and self.constants[name] != v:
                raise DeployError(f"sampan deploy: {who}: two kernel constants are named "
                                  f"{name} with different values")
            self.constants[name] = v
        else:
            raise DeployError(f"sampan deploy: {who}: {fn.__qualname__} reads {name} "
                              f"({type(v).__name__}), which is not numpy, a plain constant "
                              "or a kernel function")

    def source(self) -> list:
        """The constants' assignments, then every function's source, as emitter Code."""
        out = []
        if self.constants:
            out.append(emit.block([emit.fill("{k} = {v}", k=emit.name(k), v=emit.lit(v))
                                   for k, v in self.constants.items()]))
        for fn in self.functions.values():
            src = textwrap.dedent(inspect.getsource(fn)).rstrip()
            if not src.startswith("def "):
                raise DeployError(f"sampan deploy: {fn.__qualname__} is decorated; a copied "
                                  "kernel must be a plain def")
            out.append(emit.own(src))
        return out


def kernel_source(ops, modules=KERNEL_MODULES) -> tuple[list, dict]:
    """(source blocks, {op: the name the module calls it by}) for `ops`."""
    col = _Collector(modules)
    names = {}
    for op in sorted(ops):
        k = kernel_of(op)
        if k is None:
            raise DeployError(f"sampan deploy: op {op!r} has no numpy kernel")
        u = ufunc_name(k)
        if u is not None:
            names[op] = f"np.{u}"
            continue
        col.function(k, f"op {op}")
        names[op] = k.__name__
    return col.source(), names


def function_source(fn, modules) -> list:
    """The source of plain function `fn` and of what it calls (for the output decoder)."""
    col = _Collector(modules)
    col.function(fn, fn.__qualname__)
    return col.source()


_SUPPORTED: dict = {}     # op -> (its numpy kernel, whether it can be copied)


def standalone(op: str) -> bool:
    """Whether `op`'s numpy kernel can run in the standalone module."""
    k = kernel_of(op)
    if k is None or (op in OPS and OPS[op].random):   # random state stays in sampan
        return False
    hit = _SUPPORTED.get(op)
    if hit is not None and hit[0] is k:
        return hit[1]
    try:
        ok = ufunc_name(k) is not None or bool(kernel_source([op])[1])
    except DeployError:
        ok = False
    _SUPPORTED[op] = (k, ok)
    return ok


def supported_ops() -> list:
    """Op names the standalone module can run: every op (but the random ones) whose numpy
    kernel is numpy's ufunc or a plain-numpy function, and fused nodes (their bodies run
    op by op)."""
    return sorted({op for op in OPS if standalone(op)} | {"fused"})


def check_guards(program_dir, meta):
    """A program saved with a branch on a dynamic size serves only the sizes on its side
    (see `sampan.jit.dynamic`); the standalone module cannot check that per call."""
    from ..jit import dynamic as _dyn
    user = [x for x in _dyn.guards_from_json(meta.get("guards", []), "sampan deploy")
            if x.user]
    if user:
        raise DeployError(f"sampan deploy: {program_dir} was traced assuming "
                          f"{user[0].describe()} (a branch on a dynamic size), which a "
                          "standalone module cannot check per call; save it without the "
                          "branch, or without dynamic= for that dim")
