"""Unstructured magnitude pruning: the smallest weights become zero and stay zero.

`magnitude(model, amount)` zeroes the `amount` fraction of smallest-magnitude weights of
the model's Linear and Conv2d layers, over all of them at once (`scope="global"`) or in
each layer (`scope="layer"`). Masks are kept the way torch.nn.utils.prune keeps them:
a gradient hook multiplies the weight's gradient by the mask, so an optimiser step moves
no masked weight (SGD with momentum or weight decay, Adam: each reads a gradient that is
zero there, and a zero weight's decay is zero), and a forward pre-hook writes the masked
entries back to zero before every call, so a weight changed behind the optimiser's back
(a `load_state_dict`) is pruned again. Pruning again raises the sparsity: masked weights
stay masked and the smallest of the others join them. `remove(model)` makes the zeros
permanent and drops the hooks (the saved model then needs nothing of this module).

Example::

    >>> sampan.prune.magnitude(model, amount=0.5)     # half the weights, globally
    >>> ... fine-tune ...
    >>> sampan.prune.remove(model); sampan.prune.sparsity(model)
"""
from __future__ import annotations

import numpy as np

from ..errors import SampanValueError
from ..nn import Conv2d, Linear

_ATTR = "_sampan_prune"          # per pruned layer: {"mask": array, "handles": [...]}


class PruneError(SampanValueError):
    """Pruning was asked for something it cannot do (named in the message)."""


def _check_amount(amount, what="magnitude"):
    if not isinstance(amount, (int, float)) or not 0.0 <= float(amount) < 1.0:
        raise PruneError(f"sampan.prune.{what}: amount must be a fraction in [0, 1); got "
                         f"{amount!r}")
    return float(amount)


def _targets(model, layers, name):
    out = [(n, m) for n, m in model.named_layers() if isinstance(m, tuple(layers))
           and getattr(m, name, None) is not None]
    if not out:
        kinds = ", ".join(t.__name__ for t in layers)
        raise PruneError(f"sampan.prune: {type(model).__name__} has no {kinds} layer with a "
                         f"'{name}' to prune")
    return out


def _smallest(absw, prunable, k):
    """Boolean array: the `k` smallest entries of `absw` among `prunable` ones."""
    cut = np.zeros(absw.shape, bool)
    if k <= 0:
        return cut
    idx = np.flatnonzero(prunable)
    order = np.argsort(absw.reshape(-1)[idx], kind="stable")[:k]
    cut.reshape(-1)[idx[order]] = True
    return cut


def magnitude(model, amount=0.5, layers=(Linear, Conv2d), scope="global", name="weight"):
    """Zero the `amount` fraction of smallest |weights| of `layers` in `model` (see the
    module doc); returns {layer name: sparsity}.

    Example: ``sampan.prune.magnitude(net, 0.8, scope="layer")``"""
    amount = _check_amount(amount)
    if scope not in ("global", "layer"):
        raise PruneError(f"sampan.prune.magnitude: scope must be 'global' or 'layer'; got "
                         f"{scope!r}")
    targets = _targets(model, layers, name)
    masks = {}
    for n, m in targets:
        w = getattr(m, name)._data
        old = getattr(m, _ATTR, None)
        masks[n] = old["mask"].copy() if old else np.ones(w.shape, bool)
    if scope == "global":
        absw = np.concatenate([np.abs(getattr(m, name)._data).reshape(-1).astype(np.float64)
                               for _, m in targets])
        keep = np.concatenate([masks[n].reshape(-1) for n, _ in targets])
        k = int(round(amount * absw.size)) - int((~keep).sum())
        cut = _smallest(absw, keep, k)
        pos = 0
        for n, m in targets:
            size = masks[n].size
            masks[n] &= ~cut[pos:pos + size].reshape(masks[n].shape)
            pos += size
    else:
        for n, m in targets:
            w = getattr(m, name)._data
            k = int(round(amount * w.size)) - int((~masks[n]).sum())
            masks[n] &= ~_smallest(np.abs(w).astype(np.float64), masks[n], k)
    for n, m in targets:
        _apply(m, name, masks[n])
    return {n: float(1.0 - masks[n].mean()) for n, _ in targets}


def _apply(layer, name, mask):
    from ..tensor import Tensor
    old = getattr(layer, _ATTR, None)
    if old:
        for h in old["handles"]:
            h.remove()
    w = getattr(layer, name)
    fmask = mask.astype(w._data.dtype)
    w._data *= fmask
    mt = Tensor(fmask)

    def grad_hook(g):
        return g * mt

    def pre_hook(lay, args):
        p = getattr(lay, name)
        np.multiply(p._data, fmask, out=p._data)
        return None
    handles = [w.register_hook(grad_hook), layer.register_forward_pre_hook(pre_hook)]
    object.__setattr__(layer, _ATTR, {"mask": mask, "handles": handles, "name": name,
                                      "param": w})


def is_pruned(layer) -> bool:
    """Whether `layer` carries a pruning mask (see `magnitude`)."""
    return bool(getattr(layer, _ATTR, None))


def mask_of(layer):
    """The boolean keep-mask of a pruned layer's weight (True: kept), or None."""
    st = getattr(layer, _ATTR, None)
    return st["mask"] if st else None


def remove(model):
    """Make the pruning of every layer in `model` permanent: zeros stay, masks and hooks
    go. Returns `model`. Example: ``sampan.prune.remove(net)``"""
    for _, m in model.named_layers():
        st = getattr(m, _ATTR, None)
        if not st:
            continue
        p = getattr(m, st["name"])
        p._data *= st["mask"].astype(p._data.dtype)
        for h in st["handles"]:
            h.remove()
        object.__delattr__(m, _ATTR)
    return model


def sparsity(model, layers=(Linear, Conv2d), name="weight") -> dict:
    """{layer name: fraction of zero weights} and "total" over all of them."""
    out, zeros, total = {}, 0, 0
    for n, m in _targets(model, layers, name):
        w = getattr(m, name)._data
        z = int(np.count_nonzero(w == 0))
        out[n] = z / max(w.size, 1)
        zeros += z
        total += w.size
    out["total"] = zeros / max(total, 1)
    return out
