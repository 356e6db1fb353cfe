"""The numpy provider, the reference: every op table kernel (`OpDef.kernels["numpy"]`,
with its BLAS calls and hand-written loops), so it supports every op that has one.

Example::

    >>> from sampan.backends import get_provider
    >>> get_provider("numpy").kernels["add"]
"""
from __future__ import annotations

from collections.abc import Mapping

from ...ops.registry import OPS
from ..provider import Provider


class _OpTableKernels(Mapping):
    """{op name: its numpy kernel}, read from the op table when asked (ops registered
    later are in it too)."""

    def __getitem__(self, name):
        op = OPS.get(name)
        fn = op.kernels.get("numpy") if op is not None else None
        if fn is None:
            raise KeyError(name)
        return fn

    def __contains__(self, name):
        op = OPS.get(name)
        return op is not None and op.kernels.get("numpy") is not None

    def __iter__(self):
        return (n for n, op in OPS.items() if op.kernels.get("numpy") is not None)

    def __len__(self):
        return sum(1 for _ in self)


class NumpyProvider(Provider):
    """The op table's numpy kernels (see the module doc)."""

    name = "numpy"
    kernels = _OpTableKernels()
    # the requantising int8 layers: a served program's weights prepared once per node
    bound_kernels = ("qlinear_dense", "qdense", "qlinear_conv2d", "qdense_dynamic")

    def supports(self, node) -> bool:
        return node.op in self.kernels

    def bind(self, node, inplace=None):
        if node.op in self.bound_kernels:
            from ...ops.quant_fused import bind
            return bind(node)
        return super().bind(node, inplace)


PROVIDER = NumpyProvider()
