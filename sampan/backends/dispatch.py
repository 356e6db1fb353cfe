"""The provider list of eager dispatch and the jit: `set_providers([...])`.

The default list, ["onednn", "numba", "numpy"], binds exactly the kernels sampan always
ran: each op's `kernel` (the numpy kernel, or for GEMM, convolution and pooling the
per-machine measured choice between numpy and oneDNN), and generated kernels for fused
nodes in compiled code. Under it eager dispatch (`tensor.apply`) calls `op.kernel`
directly: no lookup is added to the hot path.

Another list rebinds `op.kernel` of only the ops whose choice it changes: an op that a
provider before "numpy" has a kernel for gets a dispatcher that gives each call to the
first provider of the list that supports it (`Provider.supports` on a `Call`: the op,
the arrays, the attributes); without "onednn" in the list the measured ops run their
numpy kernels. The jit's codegen assigns each node it compiles by the same list (the
partition pass's `assign`), so compile after choosing it: executors compiled earlier
keep their kernels. Setting the default list back restores every op's kernel.

Example::

    >>> from sampan.backends import set_providers
    >>> with set_providers(["numpy"]):       # the reference kernels only
    ...     y = sampan.matmul(a, b)
"""
from __future__ import annotations

from ..ops.registry import OPS
from .provider import Call, Provider, check_order, get_provider

DEFAULT = ("onednn", "numba", "numpy")
_state = {"order": DEFAULT, "saved": {}}


def get_providers() -> list:
    """The provider list eager dispatch and the jit use now."""
    return list(_state["order"])


def set_providers(names=None):
    """Use provider list `names` (None: the default) for eager dispatch and code the jit
    compiles from now on. Holds until changed; as ``with set_providers(...)`` it is undone
    at the end of the block. Raises naming an unknown provider."""
    prev = _state["order"]
    order = DEFAULT if names is None else tuple(check_order(names))
    _apply(order)
    return _Handle(prev)


class _Handle:
    """set_providers()'s result: in force already; as a context manager, undone at exit."""

    def __init__(self, prev):
        self.prev = prev

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _apply(self.prev)
        return False


class _Dispatch:
    """`op.kernel` under a non-default list: the first provider supporting the call."""

    def __init__(self, name, provs):
        self.name = name
        self.provs = provs
        # each provider's kernel looked up now, before `op.kernel` becomes this dispatcher
        # (oneDNN's is the op's measured choice, read from `op.kernel`)
        self.kerns = [(p, p.kernel(name)) for p in provs]
        self.fallback = self.kerns[-1][1]
        self.__name__ = getattr(self.fallback, "__name__", name)

    def __call__(self, *arrays, **attrs):
        call = Call(self.name, arrays, attrs)
        for p, k in self.kerns:
            if p.supports(call):
                return k(*arrays, **attrs)
        return self.fallback(*arrays, **attrs)


def _apply(order) -> None:
    saved = _state["saved"]
    for name, k in saved.items():            # every op back to its own kernel first
        OPS[name].kernel = k
    saved.clear()
    _state["order"] = tuple(order)
    if tuple(order) == DEFAULT:
        return
    provs = [get_provider(n) for n in order]
    names = set()
    for p in provs:
        if p.name != "numpy":
            names.update(op for op in p.kernels if op in OPS and op not in p.node_kernels)
    if "onednn" not in order:
        names.update(get_provider("onednn").kernels)
    if "numba" not in order:     # the hand-written loops are numba's: off without it
        names.update(op for op in get_provider("numba").kernels if op in OPS)
    for name in sorted(names):
        op = OPS.get(name)
        if op is None or op.kernels.get("numpy") is None:
            continue
        cands = [p for p in provs if name in p.kernels and name not in p.node_kernels]
        saved[name] = op.kernel
        pn = [p.name for p in cands]
        dflt = [n for n in DEFAULT if n in pn]
        if pn == ["numpy"]:
            op.kernel = op.kernels["numpy"]
        elif pn == dflt and (len(pn) == 3 or "numba" not in op.kernels):
            op.kernel = saved[name]          # the measured choice, as by default
        elif pn[0] == "numba" and type(cands[0]).supports is Provider.supports:
            op.kernel = op.kernels["numba"]  # serves every call (its loops or numpy)
        else:
            op.kernel = _Dispatch(name, cands)
