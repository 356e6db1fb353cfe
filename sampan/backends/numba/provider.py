"""The numba provider: the generated kernel of each `fused` node (`kernelgen.bind`), one
per node, taking the memory plan's buffers (`out=`) and writing outputs over inputs where
the plan allows (`inplace`). Without numba a fused node's body runs with the op table's
numpy kernels (`ops.fused.run_body`), so a graph fused elsewhere still runs.

Example::

    >>> from sampan.backends import get_provider
    >>> get_provider("numba").supports(fused_node)
    True
"""
from __future__ import annotations

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


class NumbaProvider(Provider):
    """Generated fused kernels (see the module doc)."""

    name = "numba"
    kernels = {"fused": bind_fused}
    node_kernels = ("fused",)

    def available(self) -> bool:
        from . import available
        return available()

    def bind(self, node, inplace=None):
        return bind_fused(node, inplace=inplace)


PROVIDER = NumbaProvider()
