"""The oneDNN provider: GEMM, convolution and pooling (`onednn.KERNELS`) in float32 and
bfloat16, int8 GEMM (`matmul_integer`), where oneDNN's library loads.

Which library runs a call is measured on this machine (`choice.py`, under the GEMM pool
of `pool.py`, cached by `cache.py`): a node given to this provider is bound to the op's
measured kernel, which runs oneDNN for a call class where oneDNN won and the numpy kernel
where it did not (or where oneDNN refuses the call); `prefer` overrides the measurement.
So the default provider list ("onednn" before "numpy") runs exactly the kernels the
measurement picked.

It also binds `engine` nodes of engine "onednn" (the `onednn_layout` pass's regions of
float32 convolutions kept in oneDNN's blocked layouts, `blocked.py`): one compiled
`blocked.Region` per node and shape (on the process's OpenMP threads, or on one thread
where a race at bind time finds that faster: `regionrace.fastest`); where oneDNN refuses a
region's primitives, the body runs with the op table's kernels.

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
    node_kernels = ("engine",)

    def available(self) -> bool:
        from .. import cache
        return "onednn" in cache.backends()

    def supports(self, node) -> bool:
        if node.op == "engine":
            return node.attrs.get("engine") == "onednn" and self.available()
        if node.op not in KERNELS or not node.inputs:
            return False
        ins = node.inputs
        if node.op == "matmul_integer":
            ok = _dtype(ins[0]) in _I8 and _dtype(ins[1]) == np.int8
        else:
            d = _dtype(ins[0])
            ok = d in _F and all(_dtype(v) == d for v in ins[:2])
        return ok and self.available()

    def bind(self, node, inplace=None):
        if node.op != "engine":
            return super().bind(node)
        return bind_region(node)

    def kernel(self, op: str):
        # the measured choice (choice.Chooser) where one is installed, else oneDNN's own
        k = OPS[op].kernel if op in OPS else None
        return k if k is not None else KERNELS[op]


def bind_region(node):
    """The compiled kernel of an engine node of engine "onednn": a `Region` (built once per
    node and shape, on the thread count `regionrace.fastest` measured faster); where oneDNN
    refuses one of its primitives, the body with the op table's kernels (a warning names
    why)."""
    from ._lib import OneDNNError
    from .blocked import Unsupported
    from .regionrace import fastest
    try:
        region = fastest(node)
    except (Unsupported, OneDNNError) as e:
        import warnings
        warnings.warn(f"onednn region at {node.loc or '?'}: {e}; its {len(node.attrs['body'])}"
                      " ops run their op-table kernels instead", RuntimeWarning, stacklevel=2)
        return _interpreter(node)
    return region


def _interpreter(node):
    body, outputs = node.attrs["body"], node.attrs["outputs"]
    n = len(node.inputs)
    consts = {i: v.const for i, v in enumerate(node.inputs) if v.is_const}
    single = len(outputs) == 1

    def run(*arrays, out=None):
        vals = [consts.get(i, arrays[i]) for i in range(n)]
        for op_name, idx, attrs, _ in body:
            op = OPS[op_name]
            r = op.kernel(*[vals[k] for k in idx], **dict(attrs))
            vals.extend([np.asarray(x) for x in r] if op.n_out != 1 else [np.asarray(r)])
        res = [vals[k] for k in outputs]
        if out is not None:
            for j, b in enumerate(out):
                if b is not None:
                    np.copyto(b, res[j])
                    res[j] = b
        return res[0] if single else tuple(res)
    return run


PROVIDER = OneDNNProvider()
