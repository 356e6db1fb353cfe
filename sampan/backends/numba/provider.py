"""The numba provider: the generated kernel of each `fused` node (`kernelgen.bind`), one
per node, taking the memory plan's buffers (`out=`) and writing outputs over inputs where
the plan allows (`inplace`); binders that prepare a node's constants once (the int8
layers pack their weights at compile time, `_BINDERS`). Without numba a fused node's
body runs with the op table's numpy kernels (`ops.fused.run_body`), so a graph fused
elsewhere still runs, and the int8 ops run their numpy reference.

Its table also holds the hand-written loops: every op's `kernels["numba"]` (registered
by op name where numba is installed; the op's default kernel then, see
`ops.registry.DEFAULT_BACKENDS`). Each serves every call of its op: what its loops do
not cover it hands to the op's numpy kernel.

Example::

    >>> from sampan.backends import get_provider
    >>> get_provider("numba").supports(fused_node)
    True
"""
from __future__ import annotations

from collections.abc import Mapping

from ...ops.registry import OPS
from ..provider import Provider


def bind_fused(node, inplace=None):
    """The generated kernel of a fused node (its numpy body without numba).

    The kernel takes `out=` (an array or None per output); `inplace` {output j: input i}
    makes output j overwrite input i (see `sampan.runtime.memory`)."""
    from . import available
    if available():
        from .kernelgen import bind
        return bind(node, inplace=inplace)
    from ...ops.fused import run_body
    body, outputs = node.attrs["body"], node.attrs["outputs"]
    inplace = dict(inplace or {})

    def run(*arrays, out=None):
        r = list(run_body(arrays, body, outputs))
        for j, i in inplace.items():
            arrays[i][...] = r[j]
            r[j] = arrays[i]
        if out is not None:
            for j, p in enumerate(out):
                if p is not None and j not in inplace:
                    p[...] = r[j]
                    r[j] = p
        return r[0] if len(r) == 1 else tuple(r)
    return run


def _binders() -> dict:
    """{op name: bind(node)} of the loops that prepare a node's constants once (the int8
    layers pack their weights when the node is compiled)."""
    from . import available
    if not available():
        return {}
    from . import qdirect, qdynamic, qkernels, qlayers  # noqa: F401  (qdirect registers the direct conv)
    from . import convblock, gemv     # the float layers with their epilogues (issue 31)
    return dict(qlayers.BINDERS, **qdynamic.BINDERS, quantize=qkernels.bind_quantize,
                dense=gemv.bind_dense, conv2d_block=convblock.bind_block)


_BINDERS = _binders()


class _Kernels(Mapping):
    """{"fused": its binder} and {op: the op's hand-written numba kernel}, read from the op
    table when asked."""

    def __getitem__(self, name):
        if name == "fused":
            return bind_fused
        op = OPS.get(name)
        fn = op.kernels.get("numba") if op is not None else None
        if fn is None:
            raise KeyError(name)
        return fn

    def __contains__(self, name):
        if name == "fused":
            return True
        op = OPS.get(name)
        return op is not None and op.kernels.get("numba") is not None

    def __iter__(self):
        yield "fused"
        yield from (n for n, op in OPS.items() if op.kernels.get("numba") is not None)

    def __len__(self):
        return sum(1 for _ in self)


class NumbaProvider(Provider):
    """Generated fused kernels and the hand-written loops (see the module doc)."""

    name = "numba"
    kernels = _Kernels()
    node_kernels = ("fused",)
    bound_kernels = tuple(_BINDERS)

    def available(self) -> bool:
        from . import available
        return available()

    def bind(self, node, inplace=None):
        if node.op == "fused":
            return bind_fused(node, inplace=inplace)
        binder = _BINDERS.get(node.op)
        return binder(node) if binder is not None else super().bind(node)


PROVIDER = NumbaProvider()
