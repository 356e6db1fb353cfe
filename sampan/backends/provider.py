"""The provider contract and the registry of providers by name.

A provider serves kernels over numpy arrays: `kernels` maps op names to callables that
take the same arrays and attributes as the op's numpy kernel and return the same result;
`supports(node)` says whether it serves one node (its op, the inputs' dtypes and shapes,
the attributes); `bind(node)` returns the callable that runs that node, over its input
arrays only (attributes bound). `node` is an IR `Node` or an eager call (`Call`: the same
`op`, `inputs`, `attrs` fields; its inputs are the arrays themselves), so one `supports`
serves the partition pass, the jit codegen and eager dispatch.

Providers are found by name (`get_provider`). The built-in ones are registered lazily
(nothing is imported until asked for): "numpy" (the reference: the op table's own
kernels), "numba" (generated fused kernels), "onednn" (GEMM, convolution and pooling
where oneDNN loads, chosen per call class by measurement on this machine), "onnxruntime"
(engine nodes: subgraphs run by onnxruntime sessions). A new provider is one folder with
a `Provider` subclass and one `register_provider` call.

Example::

    >>> from sampan.backends import Provider, register_provider, get_provider
    >>> class Mine(Provider):
    ...     name = "mine"
    ...     kernels = {"relu": lambda x: x * (x > 0)}
    >>> register_provider(Mine())
    >>> get_provider("mine").supports(node)
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import threading

from ..errors import SampanError


class ProviderError(SampanError):
    """An unknown provider name, or a provider asked to bind a node it does not serve."""


_BINDING = threading.local()


@contextlib.contextmanager
def frozen_consts():
    """While binding inside this block, a binder may treat a node's graph constants
    (`Value.const`) as frozen and prepare them once (reshaped, converted, broadcast,
    packed) instead of on every call: what executors compiled for a served program do
    (the Predictor's, whose weights are read at build). Elsewhere a constant may be a
    traced tensor's array that changes in place between calls, so binders read it per
    call. Example: ``with frozen_consts(): fn = provider.bind(node)``"""
    before = getattr(_BINDING, "frozen", False)
    _BINDING.frozen = True
    try:
        yield
    finally:
        _BINDING.frozen = before


def consts_frozen() -> bool:
    """Whether the current binding runs under `frozen_consts`."""
    return getattr(_BINDING, "frozen", False)


class Call:
    """An eager call seen as a node: `op` (name), `inputs` (the arrays), `attrs`."""

    __slots__ = ("op", "inputs", "attrs")

    def __init__(self, op, inputs, attrs):
        self.op, self.inputs, self.attrs = op, inputs, attrs


class Provider:
    """A kernel table with `supports` and `bind` (see the module doc).

    Subclasses set `name` and `kernels` and may narrow `supports` (dtypes, shapes,
    attributes). `node_kernels` names ops whose `bind(node, inplace=...)` returns a
    kernel that takes `out=` (a tuple of arrays or None per output, the memory plan's
    buffers), as generated fused kernels do. `bound_kernels` names ops whose
    `bind(node)` makes a kernel for that node (its constants prepared once: int8 weights
    packed at compile time) taking only the arrays, which executors bind instead of the
    op's table kernel."""

    name = "?"
    kernels: dict = {}
    node_kernels: tuple = ()
    bound_kernels: tuple = ()

    def available(self) -> bool:
        """Whether this provider runs on this machine (its library loads)."""
        return True

    def supports(self, node) -> bool:
        return node.op in self.kernels

    def kernel(self, op: str):
        """The callable bound for `op`: called as the op's numpy kernel (arrays, then the
        attributes as keywords)."""
        return self.kernels[op]

    def bind(self, node, inplace=None):
        """The callable running `node` over its input arrays (attributes bound)."""
        if not self.supports(node):
            raise ProviderError(f"provider {self.name!r} does not serve {node.op!r} here")
        fn = self.kernel(node.op)
        return functools.partial(fn, **node.attrs) if node.attrs else fn

    def __repr__(self):
        return f"<Provider {self.name}: {len(self.kernels)} kernels>"


_PROVIDERS: dict = {}
# the built-in providers, imported on first use: name -> "module:attribute"
_LAZY = {"numpy": "sampan.backends.numpy:PROVIDER",
         "numba": "sampan.backends.numba.provider:PROVIDER",
         "onednn": "sampan.backends.onednn.provider:PROVIDER",
         "onnxruntime": "sampan.backends.onnxruntime:PROVIDER"}


def register_provider(provider: Provider, *, replace: bool = False) -> Provider:
    """Make `provider` findable by its `name` (a second one of a name needs replace)."""
    name = getattr(provider, "name", None)
    if not isinstance(name, str) or not name or name == "?":
        raise ProviderError(f"register_provider: {provider!r} has no name")
    if not callable(getattr(provider, "supports", None)) or not callable(
            getattr(provider, "bind", None)):
        raise ProviderError(f"register_provider: {name!r} lacks supports(node) / bind(node)")
    if (name in _PROVIDERS or name in _LAZY) and not replace:
        raise ProviderError(f"register_provider: a provider {name!r} is registered already "
                            "(pass replace=True)")
    _LAZY.pop(name, None)
    _PROVIDERS[name] = provider
    return provider


def unregister_provider(name: str) -> None:
    """Forget provider `name` (tests; a built-in one comes back on the next lookup only
    if it was never loaded)."""
    _PROVIDERS.pop(name, None)


def get_provider(name: str) -> Provider:
    """The provider registered as `name`."""
    p = _PROVIDERS.get(name)
    if p is None:
        spec = _LAZY.get(name)
        if spec is None:
            raise ProviderError(f"unknown kernel provider {name!r}; registered: "
                                f"{', '.join(providers())}")
        mod, attr = spec.split(":")
        p = _PROVIDERS[name] = getattr(importlib.import_module(mod), attr)
    return p


def providers() -> list:
    """Names of every registered provider (built-in ones included, loaded or not)."""
    return sorted(set(_PROVIDERS) | set(_LAZY))


def check_order(names, what="set_providers") -> list:
    """`names` as a list of known provider names ending in a provider that serves every op
    (numpy is added last when missing); raises naming an unknown one."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ProviderError(f"{what}: expected a list of provider names; got {names!r}")
    out = []
    for n in names:
        get_provider(n)
        if n not in out:
            out.append(n)
    if "numpy" not in out:
        out.append("numpy")
    return out


def first_supporting(node, order):
    """The first provider of `order` (names) that supports `node`."""
    for name in order:
        p = get_provider(name)
        if p.supports(node):
            return p
    return get_provider("numpy")
