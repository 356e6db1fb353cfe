"""The numba provider: the generated kernel of each `fused` node (`kernelgen.bind`), one
per node, taking the memory plan's buffers (`out=`) and writing outputs over inputs where
the plan allows (`inplace`); and the hand-written loops registered by op name (`EAGER`:
the int8 ops of `qkernels.py`), which eager dispatch runs as the ops' kernels under the
default provider list (`install`). Without numba a fused node's body runs with the op
table's numpy kernels (`ops.fused.run_body`), so a graph fused elsewhere still runs, and
the int8 ops run their numpy reference.

Example::

    >>> from sampan.backends import get_provider
    >>> get_provider("numba").supports(fused_node)
    True
"""
from __future__ import annotations

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


def _eager_kernels() -> dict:
    """{op name: kernel} of the hand-written loops (empty without numba)."""
    from . import available
    if not available():
        return {}
    from . import qkernels
    return qkernels.kernels()


def _binders() -> dict:
    """{op name: bind(node)} of the loops that prepare a node's constants once (the int8
    layers pack their weights when the node is compiled)."""
    from . import available
    if not available():
        return {}
    from . import qdynamic, qkernels, qlayers
    return dict(qlayers.BINDERS, **qdynamic.BINDERS, quantize=qkernels.bind_quantize)


EAGER = _eager_kernels()
_BINDERS = _binders()


class NumbaProvider(Provider):
    """Generated fused kernels and hand-written loops (see the module doc)."""

    name = "numba"
    kernels = {"fused": bind_fused, **EAGER}
    node_kernels = ("fused",)

    def available(self) -> bool:
        from . import available
        return available()

    def bind(self, node, inplace=None):
        if node.op == "fused":
            return bind_fused(node, inplace=inplace)
        binder = _BINDERS.get(node.op)
        return binder(node) if binder is not None else super().bind(node)


PROVIDER = NumbaProvider()


def install() -> None:
    """Make the hand-written loops the ops' kernels (`op.kernel`, what eager dispatch and
    the default provider list call), each also kept as `op.kernels["numba"]`. An op
    whose kernel is a measured choice against oneDNN (`choice.Chooser`) keeps it, with
    the loop as the candidate oneDNN is measured against."""
    from ..choice import Chooser
    for name, fn in EAGER.items():
        op = OPS.get(name)
        if op is None or op.kernels.get("numba") is fn:
            continue
        op.kernels["numba"] = fn
        if isinstance(op.kernel, Chooser):
            op.kernel.numpy = fn
        else:
            op.kernel = fn
