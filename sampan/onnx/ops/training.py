"""Import handlers for the `ai.onnx.preview.training` domain's optimizer steps: Adagrad,
Momentum and Adam (each updates any number of tensors at once: inputs R, T, then the
tensors, their gradients and their state tensors; outputs the new tensors, then the new
states). Built from sampan ops, so a step can itself be traced or differentiated.
"""
from __future__ import annotations

import sampan
from . import onnx_op

DOMAIN = "ai.onnx.preview.training"


def _groups(ctx, node, ins, k):
    """(R, T, [(X, G, state...)]) of a node whose variadic inputs come in k+2 groups."""
    r, t, rest = ins[0], ins[1], ins[2:]
    if len(rest) % (k + 2) or not rest:
        raise ctx.error(f"takes R, T and {k + 2} equal groups of tensors (X, G"
                        f"{', state' * k}); got {len(ins)} inputs")
    m = len(rest) // (k + 2)
    cols = [rest[i * m:(i + 1) * m] for i in range(k + 2)]
    if node.n_outputs != m * (k + 1):
        raise ctx.error(f"{m} tensors to update give {m * (k + 1)} outputs; the node has "
                        f"{node.n_outputs}")
    return r, t, list(zip(*cols))


def _f(t, like):
    return t if t.dtype == like.dtype else sampan.cast(t, like.dtype)


@onnx_op("Adagrad", since=1, domain=DOMAIN)
def adagrad(ctx, node, *ins):
    decay = float(node.attr("decay_factor", 0.0))
    eps = float(node.attr("epsilon", 0.0))
    wd = float(node.attr("norm_coefficient", 0.0))
    r, t, groups = _groups(ctx, node, ins, 1)
    xs, hs = [], []
    for x, g, h in groups:
        lr = _f(r, x) / (1.0 + _f(t, x) * decay)
        g = g + wd * x
        h_new = h + g * g
        xs.append(x - lr * g / (sampan.sqrt(h_new) + eps))
        hs.append(h_new)
    return tuple(xs + hs)


@onnx_op("Momentum", since=1, domain=DOMAIN)
def momentum(ctx, node, *ins):
    req = {k: node.attr(k) for k in ("alpha", "beta", "norm_coefficient", "mode")}
    if any(v is None for v in req.values()):
        raise ctx.error(f"needs the attributes alpha, beta, norm_coefficient and mode; got "
                        f"{sorted(k for k, v in req.items() if v is not None)}")
    alpha, beta, wd = float(req["alpha"]), float(req["beta"]), float(req["norm_coefficient"])
    mode = req["mode"]
    if mode not in ("standard", "nesterov"):
        raise ctx.error(f"mode={mode!r} (expected 'standard' or 'nesterov')")
    r, t, groups = _groups(ctx, node, ins, 1)
    xs, vs = [], []
    for x, g, v in groups:
        g = g + wd * x
        b = sampan.where(t > 0, beta, 1.0)        # the first step takes the whole gradient
        v_new = alpha * v + _f(b, x) * g
        step = v_new if mode == "standard" else g + alpha * v_new
        xs.append(x - _f(r, x) * step)
        vs.append(v_new)
    return tuple(xs + vs)


@onnx_op("Adam", since=1, domain=DOMAIN)
def adam(ctx, node, *ins):
    alpha, beta = float(node.attr("alpha", 0.9)), float(node.attr("beta", 0.999))
    eps = float(node.attr("epsilon", 0.0))
    wd = float(node.attr("norm_coefficient", 0.0))
    post = float(node.attr("norm_coefficient_post", 0.0))
    r, t, groups = _groups(ctx, node, ins, 2)
    xs, vs, hs = [], [], []
    for x, g, v, h in groups:
        g = g + wd * x
        v_new = alpha * v + (1 - alpha) * g
        h_new = beta * h + (1 - beta) * g * g
        tf = _f(t, x)
        # bias correction from the second step on
        # bias correction from the second step on (the unused branch kept finite, so the
        # gradient through `where` stays finite too)
        first = t <= 0
        corr = sampan.sqrt(1 - beta ** tf) / sampan.where(first, 1.0, 1 - alpha ** tf)
        lr = _f(r, x) * sampan.where(first, 1.0, corr)
        x_new = (x - lr * v_new / (sampan.sqrt(h_new) + eps)) * (1 - post)
        xs.append(x_new)
        vs.append(v_new)
        hs.append(h_new)
    return tuple(xs + vs + hs)
