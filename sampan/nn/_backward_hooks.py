"""Full backward hooks of a Layer (`register_full_backward_hook`,
`register_full_backward_pre_hook`), written with ordinary ops.

The tensors a layer receives (and those it returns) go through one copy each call, so
their gradients arrive at one tape node together: all of them (joined into one vector
when there are several) reach a tensor hook at once, which calls the layer's hooks
with the whole tuple and may replace it, as PyTorch's BackwardHook does."""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor


def _funnel(ts, on_grads):
    """Copies of `ts` whose gradients all reach one hook: `on_grads(tuple of grads)`
    returns the (possibly replaced) tuple, which flows on to `ts`."""
    from ..ops.elementwise import cast
    from ..ops.shape import clone, concat, narrow, reshape
    if len(ts) == 1:
        w = clone(ts[0])
        w.register_hook(lambda g: _one(on_grads((g,))))
        return [w]
    common = np.result_type(*[t.dtype for t in ts])
    sizes = [t.numel() for t in ts]
    w = clone(concat([reshape(cast(t, common) if t.dtype != common else t, (-1,))
                      for t in ts], 0))

    def split(v):
        out, start = [], 0
        for t, n in zip(ts, sizes):
            piece = reshape(narrow(v, 0, start, n), tuple(t.shape))
            out.append(cast(piece, t.dtype) if t.dtype != common else piece)
            start += n
        return out

    def hook(g):
        gs = on_grads(tuple(split(g)))
        return concat([reshape(cast(x, common), (-1,)) for x in gs], 0)
    w.register_hook(hook)
    return split(w)


def _one(gs):
    return gs[0]


def call_with_backward_hooks(layer, args, kwargs, run):
    """Run `run(*args, **kwargs)` (forward and forward hooks) with layer's backward hooks
    attached to the gradients of its tensor inputs and outputs."""
    from ..ops.registry import STATE
    if not STATE.grad_enabled or STATE.tracer is not None:
        return run(*args, **kwargs)
    tensor_args = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    diff = [i for i in tensor_args if args[i].requires_grad]
    state = {"grad_output": None}

    def fire(grad_input):
        for hook in list(layer._backward_hooks.values()):
            r = hook(layer, grad_input, state["grad_output"])
            if r is not None:
                grad_input = tuple(r) if isinstance(r, (tuple, list)) else (r,)
        return grad_input

    def on_input_grads(gs):
        got = dict(zip(diff, gs))
        # an input that needs no gradient gets zeros next to one that does (PyTorch's)
        grad_input = fire(tuple(got[i] if i in got else Tensor(np.zeros(
            args[i].shape, args[i].dtype)) for i in tensor_args))
        pos = {i: k for k, i in enumerate(tensor_args)}
        return tuple(grad_input[pos[i]] if grad_input[pos[i]] is not None else got[i]
                     for i in diff)

    def on_output_grads(gs):
        for hook in list(layer._backward_pre_hooks.values()):
            r = hook(layer, gs)
            if r is not None:
                gs = tuple(r) if isinstance(r, (tuple, list)) else (r,)
        state["grad_output"] = gs
        if not diff:   # no input needs a gradient: the hooks run now, with None for each
            fire(tuple(None for _ in tensor_args))
        return gs

    args = list(args)
    if diff:
        for i, t in zip(diff, _funnel([args[i] for i in diff], on_input_grads)):
            args[i] = t
    out = run(*args, **kwargs)
    seq = isinstance(out, (tuple, list))
    flat = list(out) if seq else [out]
    outs = [k for k, o in enumerate(flat) if isinstance(o, Tensor) and o.requires_grad]
    if not outs:
        return out
    for k, t in zip(outs, _funnel([flat[k] for k in outs], on_output_grads)):
        flat[k] = t
    if not seq:
        return flat[0]
    return type(out)(flat) if not hasattr(out, "_fields") else type(out)(*flat)
