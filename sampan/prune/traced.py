"""Channel dependencies of any Layer, read from its traced graph (`sampan.jit`'s tracer).

`channels` walks an nn.Sequential directly; any other model is traced in eval mode at
`example_inputs` and each producer (a conv2d or matmul node whose weight is the `weight`
of a Conv2d of groups 1 or of a Linear) is followed forward through the values that keep
its channels apart: elementwise ops whose other operands depend only on state and vary at
most along the channel axis (a bias, eval batch-norm), pooling, and a flatten of the
channels into a Linear's features. The walk ends at consumers (conv2d / matmul reading the
value as their input, with a layer's weight). The per-channel state met on the way (the
producer's bias, batch-norm's weight, bias and statistics) is cut with the channels.

A producer whose channels reach the model's outputs, or an op that mixes them before
any consumer (a classifier's softmax), is kept whole. Anything else is refused with a
`PruneError` naming the op and the source line: a second activation joining the channels
(a residual add, a concatenation), an op that mixes channels on the way to a consumer
(a softmax over them, a sum, a transpose), or a per-channel constant that is not state.
"""
from __future__ import annotations

import numpy as np

from .. import nn
from ..ops.registry import OPS
from .magnitude import PruneError

_POOL = ("max_pool2d", "avg_pool2d")


def _owner(model, name):
    """(layer, attribute) owning state `name` ('c1.weight' -> (model.c1, 'weight'))."""
    mod, _, attr = name.rpartition(".")
    return (model.get_submodule(mod) if mod else model), attr


def plan(model, example_inputs):
    """[(producer layer name, [(state name, axis)] per-channel state, [(consumer layer
    name, per)], channel count)]: what `channels` cuts for each prunable producer; `per`
    is 1 for a conv consumer, H*W for a Linear after a flatten."""
    from ..autograd import no_grad
    from ..jit.api import trace
    state = list(model.named_parameters())
    state += [(n, b) for n, b in model.named_buffers() if b is not None]
    was = model.training
    model.eval()
    try:
        with no_grad():
            g, slots, _, _, _ = trace(model, tuple(example_inputs), {}, state)
    finally:
        model.train(was)
    names = {}
    for v, (kind, ref) in zip(g.inputs, slots):
        if kind == "state":
            names[v.id] = v.name
    dyn = {v.id for v, (kind, _) in zip(g.inputs, slots) if kind == "arg"}
    for n in g.nodes:
        if any(v.id in dyn for v in n.inputs):
            dyn |= {o.id for o in n.outputs}
    users = g.users()
    outs = {v.id for v in g.outputs}

    def weight_layer(n):
        """The layer name whose weight node `n` multiplies by, or None."""
        if n.op not in ("conv2d", "matmul") or len(n.inputs) < 2:
            return None
        w = n.inputs[1]
        nm = names.get(w.id)
        if nm is None or not nm.endswith(".weight") or n.inputs[0].id not in dyn:
            return None
        layer, _ = _owner(model, nm)
        if n.op == "conv2d" and isinstance(layer, nn.Conv2d) and layer.groups == 1:
            return nm[:-len(".weight")]
        if n.op == "matmul" and isinstance(layer, nn.Linear) and w.ndim == 2:
            return nm[:-len(".weight")]
        return None

    def side_state(v, where):
        """State names a side operand is computed from (through reshapes, arithmetic)."""
        found, stack, seen = [], [v], set()
        while stack:
            x = stack.pop()
            if x.id in seen:
                continue
            seen.add(x.id)
            if x.id in names:
                found.append(names[x.id])
            elif x.const is not None:
                if x.size > 1:
                    raise PruneError(f"sampan.prune.channels: {where} reads a constant of "
                                     f"shape {tuple(x.shape)} along the channels; only state "
                                     "(parameters, buffers) can be cut with them")
            elif x.node is not None:
                stack.extend(x.node.inputs)
        return found

    out = []
    for i, n in enumerate(g.nodes):
        pname = weight_layer(n)
        if pname is None:
            continue
        v0 = n.outputs[0]
        C = v0.shape[1 if n.op == "conv2d" else -1]
        info = {v0.id: (1 if n.op == "conv2d" else v0.ndim - 1, 1)}   # value -> (axis, per)
        per_channel, consumers = [], []
        for u in g.nodes[i + 1:]:       # in order: a node's region inputs are known
            mine = [x for x in u.inputs if x.id in info]
            if not mine:
                continue
            where = f"{u.op} at {u.loc or '?'} (after layer {pname!r})"
            lname = weight_layer(u)
            if lname is not None and u.inputs[0].id in info and u.inputs[1].id not in info:
                consumers.append((lname, info[u.inputs[0].id][1]))
                continue
            others = [x for x in u.inputs if x.id not in info]
            if any(x.id in dyn for x in others) or len({info[x.id] for x in mine}) > 1:
                raise PruneError(
                    f"sampan.prune.channels: the channels of layer {pname!r} meet another "
                    f"activation in {where} (a residual add, a concatenation or a branch): "
                    "that dependency ties several layers' channels together and cannot be "
                    "followed")
            axis, per = info[mine[0].id]
            o = u.outputs[0] if len(u.outputs) == 1 else None
            cur = mine[0]
            if o is not None and u.op in _POOL and axis == 1 and per == 1:
                info[o.id] = (1, 1)
            elif (o is not None and OPS[u.op].kind == "elementwise" and o.ndim == cur.ndim
                  and tuple(o.shape) == tuple(cur.shape)):
                for x in others:
                    full = (1,) * (o.ndim - x.ndim) + tuple(x.shape)
                    if any(sz != 1 and d != axis for d, sz in enumerate(full)):
                        raise PruneError(f"sampan.prune.channels: {where} reads an operand "
                                         f"of shape {tuple(x.shape)} that varies along more "
                                         "than the channels")
                    if full[axis] != 1:
                        if per != 1:
                            raise PruneError(f"sampan.prune.channels: {where} reads a "
                                             "per-feature operand after a flatten")
                        per_channel += side_state(x, where)
                info[o.id] = (axis, per)
            elif (o is not None and u.op == "reshape" and axis == 1 and per == 1
                  and cur.ndim == 4 and o.ndim == 2 and o.shape[0] == cur.shape[0]):
                info[o.id] = (1, int(np.prod(cur.shape[2:])))
            else:
                blocked = where
                break
        else:
            blocked = None
        reaches_out = blocked is not None or any(v.id in info for v in g.outputs)
        if blocked and consumers:
            raise PruneError(f"sampan.prune.channels: {blocked} mixes or moves the channels "
                             f"of layer {pname!r}; only elementwise ops, pooling, a flatten "
                             "and conv/linear layers can be followed channel by channel")
        if reaches_out or not consumers:
            continue
        own = f"{pname}.bias"
        states = sorted(set(per_channel) | ({own} if own in dict(state) else set()))
        for s in states:
            t = dict(state)[s]
            if t.ndim != 1 or t.shape[0] != C:
                raise PruneError(f"sampan.prune.channels: state {s!r} of shape "
                                 f"{tuple(t.shape)} acts on the {C} channels of layer "
                                 f"{pname!r}; only vectors of one entry a channel can be cut")
        out.append((pname, states, consumers, C))
    return out
