"""`amp`: a float32 program computed in mixed bfloat16 precision by the op table's autocast
policy (`OpDef.amp`, the one `sampan.amp.autocast` reads), for inference.

"lower" ops (matmul, convolutions, einsum) compute in bfloat16: their float32 weights
become bfloat16 constants of the same name (a weight that other ops read in float32 too
is cast by a node that `fold_constants` folds), their other float32 inputs are cast.
"float32" ops (log_softmax, layer norm, sums, exp/log ...) get bfloat16 inputs cast up;
"follow" ops compute in bfloat16 when all their float inputs are, otherwise the bfloat16
ones are cast up (float32 wins, as promotion does under autocast). Fused nodes compute
in float32 (their bodies were built for it). Graph outputs keep their float32 dtype.
`simplify` then removes cast round trips and `fuse_elementwise` folds the casts next to
elementwise ops into its kernels.

Option `dtype` (declared at registration): "bfloat16" (default) or "float16".

Example::

    >>> g2 = PassManager(["amp", "simplify", "fuse_elementwise"]).run(g)
    >>> g3 = PassManager(["amp"], options={"amp": {"dtype": "float16"}}).run(g)
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..ops.registry import OPS
from .manager import PassError, register_pass

_F32, _BF16, _F16 = np.dtype(np.float32), _dt.bfloat16, np.dtype(np.float16)
_LOW = (_BF16, _F16)


def _is_float(d) -> bool:
    return d.kind == "f" or d == _BF16


@register_pass("amp", options={"dtype": "bfloat16"}, blocks=True)
def amp(g, dtype="bfloat16"):
    """Compute in bfloat16 (option `dtype`) where the op table's autocast policy says.

    `dtype`: "bfloat16" (default) or "float16"."""
    from ..ir.graph import infer
    low = _dt.as_dtype(dtype)
    if low not in _LOW:
        raise PassError(f"pass 'amp': option dtype must be bfloat16 or float16; got {dtype!r}")
    name = _dt.dtype_name(low)
    users = g.users()
    out_dtypes = [v.dtype for v in g.outputs]
    lower_only = {c.id for c in g.consts if c.dtype == _F32 and users.get(c.id) and all(
        OPS[u.op].amp == "lower" for u in users[c.id])}
    down, up = {}, {}          # value id -> its bfloat16 / float32 version (cast once)
    body = []

    def cast(v, to, cache):
        hit = cache.get(v.id)
        if hit is not None:
            return hit
        if v.id in lower_only and to == low:
            c = g.add_const(v.const.astype(low), name=v.name)
        else:
            n = g.add_node("cast", [v], {"dtype": _dt.dtype_name(to)}, loc=_loc(v))
            body.append(g.nodes.pop())
            c = n.outputs[0]
        cache[v.id] = c
        return c

    for n in list(g.nodes):
        # fused bodies and control-flow blocks were built for their inputs' dtypes (the
        # blocks get the pass on their own: their inputs and outputs keep their dtypes)
        pol = "float32" if n.op == "fused" or n.blocks else OPS[n.op].amp
        ins = list(n.inputs)
        fl = [i for i, v in enumerate(ins) if _is_float(v.dtype)]
        if pol == "lower":
            for i in fl:
                if ins[i].dtype == _F32:
                    ins[i] = cast(ins[i], low, down)
        elif pol == "float32" or any(ins[i].dtype not in _LOW for i in fl):
            for i in fl:
                if ins[i].dtype in _LOW:
                    ins[i] = cast(ins[i], _F32, up)
        n.inputs = ins
        attrs = n.attrs
        if n.op != "fused" and not n.blocks:
            try:
                specs = infer(n.op, n.inputs, attrs)
            except Exception as e:  # noqa: BLE001 - an op without a bfloat16 form
                raise PassError(f"pass 'amp': {n.op} at {n.loc or '?'} does not take "
                                f"{name} inputs ({e})") from None
            for v, sp in zip(n.outputs, specs):
                v.dtype = sp.dtype
        body.append(n)
    g.nodes = body
    outs = []
    for v, d in zip(g.outputs, out_dtypes):
        if v.dtype != d:
            v = g.add_node("cast", [v], {"dtype": _dt.dtype_name(d)}).outputs[0]
        outs.append(v)
    g.outputs = outs
    g.prune_consts()
    return g


def _loc(v):
    return v.node.loc if v.node is not None else ""
