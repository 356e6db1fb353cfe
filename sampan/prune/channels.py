"""Structured channel pruning: whole output channels of Conv2d / Linear layers go, with the
matching input channels of the layer that reads them, so the model itself shrinks.

`channels(model, amount, example_inputs)` walks an `nn.Sequential` (nested ones are
flattened) and pairs each producer (a Conv2d of groups 1, or a Linear) with the next
producer that reads its output, through layers that keep channels apart: BatchNorm
(whose per-channel parameters and statistics are cut with the channels), activations,
dropout, pooling, and `Flatten` from a conv to a Linear (a channel is then its H*W
consecutive features; the sizes come from running `example_inputs` through the model).
Each producer keeps the `1 - amount` fraction of its channels with the largest weight
norm (`norm="l1"` or `"l2"`) in their original order. The last producer is kept whole:
its channels are the model's outputs.

Any other Layer (a forward of its own) is traced at `example_inputs` and the same pairs
are read from its graph (`traced.py`): the values between a producer and its consumers,
with the per-channel state (biases, batch-norm) they read.

A dependency that cannot be followed is refused with an error naming the layer (or the
op and its source line): a residual add, a concatenation or a branch that ties the
channels of several layers together, a grouped convolution, or a layer or op that mixes
channels between two producers. Create the optimiser after pruning: the pruned layers hold
new, smaller Parameters.

Example::

    >>> r = sampan.prune.channels(net, amount=0.5, example_inputs=(x,)); print(r)
    >>> sampan.jit.save(net, "small.sampan", (x,))
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import nn
from ..tensor import Tensor
from .magnitude import PruneError, _check_amount, is_pruned

# layers with no parameters that act on each channel by itself (shapes aside)
_PASS = tuple(getattr(nn, n) for n in (
    "ReLU", "ReLU6", "LeakyReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "ELU", "CELU", "SELU",
    "Hardtanh", "Hardswish", "Hardsigmoid", "Mish", "Softplus", "LogSigmoid", "Softsign",
    "Tanhshrink", "Identity", "Dropout", "Dropout1d", "Dropout2d", "AlphaDropout",
    "MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d", "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d") if hasattr(nn, n))
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d)


@dataclass
class ChannelReport:
    """What `channels` did: per pruned producer (name, channels before, after), and the
    parameter counts before and after."""
    pruned: list = field(default_factory=list)
    params_before: int = 0
    params_after: int = 0

    def __str__(self):
        rows = [f"{n:<12} {a:>5} -> {b:<5} channels" for n, a, b in self.pruned]
        rows.append(f"parameters {self.params_before} -> {self.params_after} "
                    f"({self.params_after / max(self.params_before, 1):.1%})")
        return "\n".join(rows)


def _flat(seq, prefix=""):
    out = []
    for name, m in seq.named_children():
        full = f"{prefix}{name}"
        if isinstance(m, nn.Sequential):
            out += _flat(m, full + ".")
        else:
            out.append((full, m))
    return out


def _is_producer(m):
    return isinstance(m, (nn.Conv2d, nn.Linear))


def _scores(m, norm):
    w = m.weight._data.astype(np.float64)
    a = np.abs(w) if norm == "l1" else w * w
    if isinstance(m, nn.Conv2d):
        return a.reshape(a.shape[0], -1).sum(1)
    return a.sum(0)                       # Linear weight is (in, out)


def _param(a, like):
    p = nn.Parameter(Tensor(np.ascontiguousarray(a)), requires_grad=like.requires_grad)
    return p


def _input_shapes(model, layers, example_inputs):
    """Shape of the input of each layer of the flattened chain at the example inputs."""
    from ..autograd import no_grad
    shapes, handles = {}, []
    for n, m in layers:
        def hook(lay, args, n=n):
            shapes[n] = tuple(args[0].shape)
        handles.append(m.register_forward_pre_hook(hook))
    was = model.training
    model.eval()
    try:
        with no_grad():
            model(*example_inputs)
    finally:
        model.train(was)
        for h in handles:
            h.remove()
    return shapes


def _plan(layers):
    """[(producer index, consumer index, [in-between indices])] and refusals."""
    pairs = []
    prods = [i for i, (_, m) in enumerate(layers) if _is_producer(m)]
    for a, b in zip(prods, prods[1:]):
        between = list(range(a + 1, b))
        for i in between:
            n, m = layers[i]
            if not isinstance(m, _PASS + _NORMS + (nn.Flatten,)):
                raise PruneError(
                    f"sampan.prune.channels: layer {n!r} ({type(m).__name__}) sits between "
                    f"{layers[a][0]!r} and {layers[b][0]!r}; only activations, dropout, "
                    "pooling, BatchNorm and Flatten can be followed channel by channel")
        pairs.append((a, b, between))
    return pairs


def channels(model, amount=0.5, example_inputs=(), norm="l2", min_channels=1):
    """Remove the `amount` fraction of output channels of each Conv2d/Linear of a
    Sequential but the last, and the matching inputs of the next (see the module doc).
    Returns a `ChannelReport`. Example:
    ``sampan.prune.channels(net, 0.5, example_inputs=(sampan.randn(1, 1, 28, 28),))``"""
    amount = _check_amount(amount, "channels")
    if norm not in ("l1", "l2"):
        raise PruneError(f"sampan.prune.channels: norm must be 'l1' or 'l2'; got {norm!r}")
    if not isinstance(model, nn.Sequential):
        return _traced(model, amount, example_inputs, norm, min_channels)
    layers = _flat(model)
    for n, m in layers:
        if isinstance(m, nn.Conv2d) and m.groups != 1:
            raise PruneError(f"sampan.prune.channels: {n!r} is a grouped convolution "
                             f"(groups={m.groups}); its channels depend on each other")
        if _is_producer(m) and is_pruned(m):
            raise PruneError(f"sampan.prune.channels: {n!r} carries a magnitude-pruning "
                             "mask; call sampan.prune.remove(model) first")
    pairs = _plan(layers)
    if any(isinstance(layers[i][1], nn.Flatten) for _, _, btw in pairs for i in btw):
        if not example_inputs:
            raise PruneError("sampan.prune.channels: the model flattens a conv's output "
                             "into a Linear; pass example_inputs= so the spatial size is "
                             "known")
        shapes = _input_shapes(model, layers, tuple(example_inputs))
    else:
        shapes = {}
    rep = ChannelReport(params_before=model.num_parameters())
    for a, b, between in pairs:
        pn, p = layers[a]
        cn, c = layers[b]
        s = _scores(p, norm)
        n_out = s.size
        k = max(min_channels, n_out - int(round(amount * n_out)))
        if k >= n_out:
            continue
        keep = np.sort(np.argsort(-s, kind="stable")[:k])
        _cut_producer(p, keep)
        feat = keep
        for i in between:
            n, m = layers[i]
            if isinstance(m, _NORMS):
                _cut_norm(m, keep)
            elif isinstance(m, nn.Flatten):
                shp = shapes[n]
                if len(shp) < 2 or m.start_dim not in (1, -len(shp) + 1):
                    raise PruneError(f"sampan.prune.channels: Flatten {n!r} does not "
                                     f"start at the channel dim (input {shp})")
                per = int(np.prod(shp[2:]))
                feat = (keep[:, None] * per + np.arange(per)[None, :]).reshape(-1)
        _cut_consumer(c, feat, cn)
        rep.pruned.append((pn, n_out, k))
    rep.params_after = model.num_parameters()
    return rep


def _cut_producer(m, keep):
    if isinstance(m, nn.Conv2d):
        m.weight = _param(m.weight._data[keep], m.weight)
        m.out_channels = len(keep)
    else:
        m.weight = _param(m.weight._data[:, keep], m.weight)
        m.out_features = len(keep)
    if m.bias is not None:
        m.bias = _param(m.bias._data[keep], m.bias)


def _cut_norm(m, keep):
    if getattr(m, "weight", None) is not None:
        m.weight = _param(m.weight._data[keep], m.weight)
        m.bias = _param(m.bias._data[keep], m.bias)
    for b in ("running_mean", "running_var"):
        t = getattr(m, b, None)
        if t is not None:
            m.register_buffer(b, Tensor(np.ascontiguousarray(t._data[keep])))
    m.num_features = len(keep)


def _cut_consumer(m, feat, name):
    if isinstance(m, nn.Conv2d):
        if m.weight.shape[1] * m.groups != m.in_channels or m.weight.shape[1] < feat.max() + 1:
            raise PruneError(f"sampan.prune.channels: {name!r} does not read the channels "
                             "of the layer before it")
        m.weight = _param(m.weight._data[:, feat], m.weight)
        m.in_channels = len(feat)
    else:
        if m.weight.shape[0] < feat.max() + 1:
            raise PruneError(f"sampan.prune.channels: {name!r} reads {m.weight.shape[0]} "
                             f"features, fewer than the layer before it gives")
        m.weight = _param(m.weight._data[feat, :], m.weight)
        m.in_features = len(feat)


def _keep(p, amount, norm, min_channels):
    s = _scores(p, norm)
    k = max(min_channels, s.size - int(round(amount * s.size)))
    return np.sort(np.argsort(-s, kind="stable")[:k]), s.size


def _traced(model, amount, example_inputs, norm, min_channels):
    """`channels` for any Layer: dependencies from its traced graph (see traced.py)."""
    from . import traced
    if not example_inputs:
        raise PruneError(f"sampan.prune.channels: {type(model).__name__} is not an "
                         "nn.Sequential, so its channel dependencies are read from a trace: "
                         "pass example_inputs=")
    for n, m in model.named_layers():
        if isinstance(m, (nn.Conv2d, nn.Linear)) and is_pruned(m):
            raise PruneError(f"sampan.prune.channels: {n!r} carries a magnitude-pruning "
                             "mask; call sampan.prune.remove(model) first")
    steps = traced.plan(model, tuple(example_inputs))
    rep = ChannelReport(params_before=model.num_parameters())
    for pname, states, consumers, _c in steps:
        p = model.get_submodule(pname)
        keep, n_out = _keep(p, amount, norm, min_channels)
        if len(keep) >= n_out:
            continue
        _cut_producer(p, keep)
        for s in states:
            if s == f"{pname}.bias":
                continue
            owner, attr = traced._owner(model, s)
            t = getattr(owner, attr)
            if isinstance(t, nn.Parameter):
                setattr(owner, attr, _param(t._data[keep], t))
            else:
                owner.register_buffer(attr, Tensor(np.ascontiguousarray(t._data[keep])))
            if isinstance(owner, _NORMS):
                owner.num_features = len(keep)
        for lname, per in consumers:
            feat = keep if per == 1 else (keep[:, None] * per
                                          + np.arange(per)[None, :]).reshape(-1)
            _cut_consumer(model.get_submodule(lname), feat, lname)
        rep.pruned.append((pname, n_out, len(keep)))
    rep.params_after = model.num_parameters()
    return rep
