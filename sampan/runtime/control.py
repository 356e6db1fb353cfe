"""Codegen of control-flow nodes (`cond`, `while_loop`, `scan`: sampan/ops/control.py):
each block is compiled into its own executor (`compile_graph`, so its nodes get fused
kernels, providers and checks as any graph's), and the enclosing executor runs them
under a real Python `if` / `while` / `for`:

    if x0:                                  # cond
        v3, = _blk2_0(x1, c1)
    else:
        v3, = _blk2_1(x1, c1)
    v4, v5, = (x1, x2,)                     # while_loop: the outputs are the carry
    while _blk3_0(v4, v5)[0]:
        v4, v5, = _blk3_1(v4, v5)
    v6, = (x1,)                             # scan
    v7 = _empty((16, 4), _np.dtype('float32'))
    for _i4 in range(16):
        v6, _y7, = _blk4_0(v6, x2[_i4, ...])
        v7[_i4] = _y7

Every name and literal is made by `runtime/emit.py`, as for the rest of the executor.
"""
from __future__ import annotations

import numpy as np

from ..ir.blocks import LOOPS
from . import emit


def control_lines(n, i, names, env, options, compile_graph) -> list:
    """The executor lines running control node `n` (the `i`-th node): its blocks compiled
    by `compile_graph` (the code generator hands itself in) with `options` (its keywords)
    and bound in `env`."""
    blks = []
    for k, b in enumerate(n.blocks):
        bn = emit.fresh("_blk", i, "_", k)
        env[bn] = compile_graph(b, name=str(emit.fresh("block", i, "_", k)), **options).fn
        blks.append(bn)
    args = [names[v.id] for v in n.inputs]
    body = n.blocks[LOOPS[n.op]] if n.op in LOOPS else None
    plan = body.meta.get("memory_plan") if body is not None and options["use_plan"] else None
    if plan and plan.get("donate"):
        # the body writes the new carry into the old one's arrays: the loop starts from
        # copies of the initial carry (once), which nothing outside reads
        env.setdefault("_copy", np.copy)
        for k in set(plan["donate"].values()):
            args[k] = emit.call(emit.name("_copy"), [args[k]])
    outs = [names[v.id] for v in n.outputs]
    return _KINDS[n.op](n, i, blks, args, outs, env)


def _assign(lhs, call, pad="    "):
    if not lhs:
        return emit.fill(pad + "{call}", call=call)
    return emit.fill(pad + "{lhs}, = {call}", lhs=emit.join(lhs), call=call)


def _cond(n, i, blks, args, outs, env):
    pred, rest = args[0], args[1:]
    return [emit.fill("    if {p}:", p=pred),
            _assign(outs, emit.call(blks[0], rest), "        "),
            emit.own("    else:"),
            _assign(outs, emit.call(blks[1], rest), "        ")]


def _while(n, i, blks, args, outs, env):
    k = n.attrs["n_carry"]
    carry, caps = outs, args[k:]
    lines = [_assign(carry, emit.tuple_of(args[:k]))] if carry else []
    test = emit.fill("{c}[0]", c=emit.call(blks[0], carry + caps))
    body = _assign(carry, emit.call(blks[1], carry + caps), "        ")
    mx = n.attrs.get("max_iterations")
    if mx is None:
        return lines + [emit.fill("    while {t}:", t=test), body]
    it = emit.fresh("_i", i)
    return lines + [emit.fill("    for {it} in range({m}):", it=it, m=emit.lit(int(mx))),
                    emit.fill("        if not {t}:", t=test),
                    emit.own("            break"), body]


def _scan(n, i, blks, args, outs, env):
    k, m, length = n.attrs["n_carry"], n.attrs["n_xs"], int(n.attrs["length"])
    carry, ys = outs[:k], outs[k:]
    xs, caps = args[k:k + m], args[k + m:]
    lines = [_assign(carry, emit.tuple_of(args[:k]))] if carry else []
    env.setdefault("_empty", np.empty)
    for y, v in zip(ys, n.outputs[k:]):
        lines.append(emit.fill("    {y} = _empty({s}, {d})", y=y, s=emit.lit(tuple(v.shape)),
                               d=emit.lit(v.dtype, numpy="_np")))
    it = emit.fresh("_i", i)
    rng = emit.lit((length - 1, -1, -1)) if n.attrs.get("reverse") else emit.lit((length,))
    step = [emit.fill("{x}[{it}, ...]", x=x, it=it) for x in xs]   # 0-d: an array
    tmp = [emit.fresh("_y", i, "_", j) for j in range(len(ys))]
    lines.append(emit.fill("    for {it} in range{r}:", it=it, r=rng))
    lines.append(_assign(carry + tmp, emit.call(blks[0], carry + step + caps), "        "))
    for y, t in zip(ys, tmp):
        lines.append(emit.fill("        {y}[{it}] = {t}", y=y, it=it, t=t))
    return lines


_KINDS = {"cond": _cond, "while_loop": _while, "scan": _scan}
