"""Rewrites of the lowered ONNX node list that give a runtime the ONNX op it knows:
`standardize` followed by a per-channel scale (mul) and shift (add) is one
LayerNormalization with that scale and bias (sampan lowers standardize to a
LayerNormalization with unit scale; the mul and add stay separate ops in sampan, or in a
fused group)."""
from __future__ import annotations

import numpy as np


def fold_patterns(ctx, keep) -> None:
    """Rewrite `ctx.nodes` in place; names in `keep` (graph outputs) stay defined."""
    _fold_layer_norm(ctx, keep)
    _fold_conv_bias(ctx, keep)


def _const_like(ctx, name, value):
    a = ctx.inits.get(name)
    return a is not None and a.size > 0 and bool(np.all(a == value))


def _fold_layer_norm(ctx, keep):
    nodes = ctx.nodes
    made = {o: k for k, (_, _, outs, _) in enumerate(nodes) for o in outs}
    users = {}
    for k, (_, ins, _, _) in enumerate(nodes):
        for i in ins:
            users.setdefault(i, []).append(k)
    dead = set()
    for k, (t, ins, outs, attrs) in enumerate(nodes):
        if t != "LayerNormalization" or attrs.get("axis", -1) != -1 or len(outs) != 1:
            continue
        scale = ins[1]
        a = ctx.inits.get(scale)
        if a is None or a.ndim != 1 or not _const_like(ctx, scale, 1):
            continue
        if len(ins) > 2 and not _const_like(ctx, ins[2], 0):
            continue
        c, dtype = a.shape[0], a.dtype
        new_scale, new_bias, y = scale, ins[2] if len(ins) > 2 else None, outs[0]
        for want in ("Mul", "Add"):
            nxt = users.get(y, [])
            if y in keep or len(nxt) != 1 or nodes[nxt[0]][0] != want:
                break
            j = nxt[0]
            other = [i for i in nodes[j][1] if i != y]
            if len(other) != 1 or len(nodes[j][1]) != 2 or not _per_channel(
                    ctx, other[0], c, dtype) or made.get(other[0], -1) > k:
                break
            if want == "Mul":
                if new_bias is not None:
                    break
                new_scale = other[0]
            else:
                new_bias = other[0]
            dead.add(j)
            y = nodes[j][2][0]
        if y != outs[0]:
            nodes[k] = (t, [ins[0], new_scale] + ([new_bias] if new_bias else []), [y], attrs)
    ctx.nodes[:] = [n for k, n in enumerate(nodes) if k not in dead]


def _fold_conv_bias(ctx, keep):
    """Conv then Add of a (1, C, 1, ...) constant (sampan adds a conv's bias reshaped to
    broadcast over the channels) is one Conv with its B input: the ONNX form every runtime
    fuses, and what an importer maps back to a conv with a bias."""
    nodes = ctx.nodes
    users = {}
    for k, (_, ins, _, _) in enumerate(nodes):
        for i in ins:
            users.setdefault(i, []).append(k)
    dead = set()
    for k, (t, ins, outs, attrs) in enumerate(nodes):
        if t != "Conv" or len(ins) != 2 or len(outs) != 1 or outs[0] in keep:
            continue
        nxt = users.get(outs[0], [])
        if len(nxt) != 1 or nodes[nxt[0]][0] != "Add" or len(nodes[nxt[0]][1]) != 2:
            continue
        j = nxt[0]
        other = [i for i in nodes[j][1] if i != outs[0]]
        if len(other) != 1 or len(users.get(other[0], [])) != 1:
            continue
        b = ctx.inits.get(other[0])
        w = ctx.inits.get(ins[1])
        if b is None or b.ndim < 3 or b.shape[0] != 1 or any(d != 1 for d in b.shape[2:]) \
                or (w is not None and (w.shape[0] != b.shape[1] or w.dtype != b.dtype)):
            continue
        ctx.inits[other[0]] = b.reshape(b.shape[1])
        nodes[k] = (t, ins + [other[0]], list(nodes[j][2]), attrs)
        dead.add(j)
    ctx.nodes[:] = [n for k, n in enumerate(nodes) if k not in dead]


def _per_channel(ctx, name, c, dtype) -> bool:
    """Whether `name` is a [c] tensor of `dtype` (a scale or bias over the last dim)."""
    a = ctx.inits.get(name)
    if a is not None:
        return a.shape == (c,) and a.dtype == dtype
    s = ctx.specs.get(name)
    return s is not None and tuple(s.shape) == (c,) and np.dtype(s.dtype) == dtype
