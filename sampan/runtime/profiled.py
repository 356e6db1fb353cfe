"""The profiling variant of a jit executor (see `codegen.py`): the same generated lines
with ``_t = _now()`` before and ``_ev(i, _t)`` after every node, run over the same
kernels and buffers (a copy of the executor's globals).

Facts that do not change between calls (the IR line, the user's source line, FLOPs,
bytes) are computed once per node when the variant is made; a call then reads the clock
around each node and appends one `Event` to the thread's buffer.
"""
from __future__ import annotations

import itertools
import linecache

from ..ir.text import node_str
from ..ops.registry import OPS
from .. import _recorder as _rec
from .._events import Event
from . import emit
from .compiled import Compiled


def _flops(n) -> int:
    op = OPS[n.op]
    if op.flops is None:
        return 0
    try:
        if n.blocks:          # control flow: counted from its blocks
            return int(op.flops(*n.inputs, blocks=n.blocks, **n.attrs))
        return int(op.flops(*n.inputs, **n.attrs))
    except Exception:  # noqa: BLE001 - a formula that cannot read symbolic dims: unknown
        return 0


def _nbytes(v) -> int:
    try:
        return int(v.nbytes)
    except Exception:  # noqa: BLE001 - a symbolic size
        return 0


def _dims(v) -> list:
    """A value's shape for an event: ints, symbolic dims as their text."""
    return [d if isinstance(d, int) else str(d) for d in v.shape]


def node_events(g, name, program=None, kernels=None):
    """({"_now", "_ev"} for the generated code's globals, per-node (op, args)).

    Besides the IR line (for people), each node's event carries its facts as fields
    (for the advisor and the tables): the value ids it reads and writes, the input and
    output shapes and dtypes, FLOPs and bytes, and (`kernels`: node index -> name) the
    executor's name of the kernel bound to it, which tells a specialised kernel
    (`s3_conv2d`, the small-GEMM `s0_matmul`) from the op table's (`k_matmul`)."""
    ren = {v.id: k for k, v in enumerate(g.values())}
    program = program or g.name or name
    kernels = kernels or {}
    meta = []
    for i, n in enumerate(g.nodes):
        args = {"ir": node_str(n, lambda v: f"%{ren[v.id]}"), "src": n.loc or "",
                "inputs": [ren[v.id] for v in n.inputs],
                "outputs": [ren[v.id] for v in n.outputs],
                "shapes": [_dims(v) for v in n.inputs],
                "dtypes": [str(v.dtype) for v in n.inputs],
                "out_shapes": [_dims(v) for v in n.outputs],
                "out_dtypes": [str(v.dtype) for v in n.outputs],
                "flops": _flops(n),
                "bytes": sum(_nbytes(v) for v in n.inputs) + sum(_nbytes(v)
                                                                 for v in n.outputs),
                "program": program}
        if i in kernels:
            args["kernel"] = kernels[i]
        meta.append((n.op, args))
    now, ident = _rec.now, _rec.get_ident

    def ev(i, t0):
        t1 = now()
        if _rec.ACTIVE:
            op, args = meta[i]
            _rec._buffer().append(Event(op, "kernel", t0, t1 - t0, ident(), dict(args)))
    return {"_now": now, "_ev": ev}, meta


_counter = itertools.count()


def profiled_variant(g, name, lines, node_at, env, plan, program=None, kernels=None):
    """The recording executor of `g` from its executor's `lines` and globals `env`;
    `node_at` maps a line index to the index of the node it runs, `kernels` a node index
    to the name its kernel has in the executor."""
    timed = []
    for j, line in enumerate(lines):
        if j in node_at:
            timed += [emit.own("    _t = _now()"), line,
                      emit.fill("    _ev({i}, _t)", i=emit.lit(node_at[j]))]
        else:
            timed.append(line)
    src = emit.block(timed) + "\n"
    genv = dict(env)
    genv.update(node_events(g, name, program, kernels)[0])
    filename = f"<sampan-jit-profiled-{next(_counter)}:{emit.inert(g.name)}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), genv)
    c = Compiled(genv[name], src, filename, plan)
    c.program = program or g.name or name
    return c
