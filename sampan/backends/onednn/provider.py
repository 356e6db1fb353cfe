"""The oneDNN provider: GEMM, convolution and pooling (`onednn.KERNELS`) in float32 and
bfloat16, int8 GEMM (`matmul_integer`), where oneDNN's library loads.

Which library runs a call is measured on this machine (`choice.py`, under the GEMM pool
of `pool.py`, cached by `cache.py`): a node given to this provider is bound to the op's
measured kernel, which runs oneDNN for a call class where oneDNN won and the numpy kernel
where it did not (or where oneDNN refuses the call); `prefer` overrides the measurement.
So the default provider list ("onednn" before "numpy") runs exactly the kernels the
measurement picked.

Example::

    >>> from sampan.backends import get_provider
    >>> sorted(get_provider("onednn").kernels)
"""
from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...ops.registry import OPS
from ..provider import Provider
from . import KERNELS

_F = (np.dtype(np.float32), _dt.bfloat16)
_I8 = (np.dtype(np.int8), np.dtype(np.uint8))


def _dtype(v):
    return np.dtype(v.dtype)


class OneDNNProvider(Provider):
    """oneDNN's kernel table, bound through the per-machine measured choice."""

    name = "onednn"
    kernels = KERNELS

    def available(self) -> bool:
        from .. import cache
        return "onednn" in cache.backends()

    def supports(self, node) -> bool:
        if node.op not in KERNELS or not node.inputs:
            return False
        ins = node.inputs
        if node.op == "matmul_integer":
            ok = _dtype(ins[0]) in _I8 and _dtype(ins[1]) == np.int8
        else:
            d = _dtype(ins[0])
            ok = d in _F and all(_dtype(v) == d for v in ins[:2])
        return ok and self.available()

    def kernel(self, op: str):
        # the measured choice (choice.Chooser) where one is installed, else oneDNN's own
        k = OPS[op].kernel if op in OPS else None
        return k if k is not None else KERNELS[op]


PROVIDER = OneDNNProvider()
