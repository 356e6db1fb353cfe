"""`vmap`: map a function over a batch dimension of its inputs, in the manner of
`torch.func.vmap` and `jax.vmap`::

    per_example = vmap(lambda x, w: x @ w, in_dims=(0, None))(xs, w)
    per_sample_grads = vmap(grad(loss), in_dims=(None, 0, 0))(w, xs, ys)

This version runs the function once per batch entry and stacks the results (sampan has
no per-op batching rules yet), so it has vmap's semantics (shapes, `in_dims`/`out_dims`,
nesting, composition with `grad`, gradients through it, tracing under `sampan.jit`,
where the loop is unrolled into one graph) but not its speed: prefer writing the batched
code directly where it is simple. Random ops draw different numbers per entry
(`randomness="different"`). Unstable.
"""
from __future__ import annotations

import functools

from ..errors import SampanValueError, ShapeError
from ..tensor import Tensor

__all__ = ["vmap"]


def _flatten(obj, leaves):
    if isinstance(obj, Tensor):
        leaves.append(obj)
        return ("T", len(leaves) - 1)
    if isinstance(obj, (tuple, list)):
        return (type(obj), tuple(_flatten(x, leaves) for x in obj))
    if isinstance(obj, dict):
        return (dict, tuple((k, _flatten(v, leaves)) for k, v in obj.items()))
    return ("S", obj)


def _unflatten(tree, leaves):
    kind, x = tree
    if kind == "T":
        return leaves[x]
    if kind == "S":
        return x
    if kind is dict:
        return {k: _unflatten(v, leaves) for k, v in x}
    return kind(_unflatten(v, leaves) for v in x)


def _dims_for(in_dims, args, name):
    """Per positional argument: an int or None for every tensor in it."""
    if isinstance(in_dims, int) or in_dims is None:
        return [in_dims] * len(args)
    if not isinstance(in_dims, (tuple, list)) or len(in_dims) != len(args):
        raise SampanValueError(f"vmap({name}): in_dims={in_dims!r} must be an int, None, or "
                               f"one entry per positional argument ({len(args)} given)")
    for d in in_dims:
        if not (d is None or type(d) is int):
            raise SampanValueError(f"vmap({name}): in_dims entries must be ints or None "
                                   f"(one per argument, applied to each tensor in it); got "
                                   f"{d!r}")
    return list(in_dims)


def _take(t, dim, i):
    return t[(slice(None),) * dim + (i,)]


def vmap(fn, in_dims=0, out_dims=0, randomness="different", chunk_size=None):
    """The function mapping `fn` over dim `in_dims` of its inputs (see the module doc).

    `in_dims`: an int (every tensor argument), None (none), or one int/None per positional
    argument. `out_dims`: an int or one per output. `chunk_size` is accepted for
    compatibility (the entries run one at a time anyway)."""
    if randomness != "different":
        raise SampanValueError(f"vmap: randomness={randomness!r} is not supported; this "
                               "vmap runs the function per entry, which draws different "
                               "random numbers per entry: randomness='different'")
    name = getattr(fn, "__name__", "fn")

    @functools.wraps(fn)
    def mapped(*args, **kwargs):
        from ..ops.shape import stack
        dims = _dims_for(in_dims, args, name)
        per_arg = []
        size, where = None, None
        for k, (a, d) in enumerate(zip(args, dims)):
            leaves = []
            tree = _flatten(a, leaves)
            if d is not None:
                for t in leaves:
                    if not -t.ndim <= d < max(t.ndim, 1) or t.ndim == 0:
                        raise ShapeError(f"vmap({name}): in_dims={d} for argument {k} of "
                                         f"shape {tuple(t.shape)}: no such dim")
                    n = t.shape[d % t.ndim]
                    if size is not None and n != size:
                        raise ShapeError(f"vmap({name}): argument {k} has size {n} on its "
                                         f"mapped dim {d}, but {where} has {size}; mapped "
                                         "dims must have one size")
                    size, where = n, f"argument {k}"
            per_arg.append((tree, leaves, d))
        if size is None:
            raise SampanValueError(f"vmap({name}): no argument is mapped (in_dims={in_dims!r}"
                                   " maps no tensor)")
        results = []
        for i in range(size):
            call = [_unflatten(tree, [_take(t, d % t.ndim, i) for t in leaves])
                    if d is not None else _unflatten(tree, leaves)
                    for tree, leaves, d in per_arg]
            results.append(fn(*call, **kwargs))
        out_leaves0 = []
        out_tree = _flatten(results[0], out_leaves0)
        flat = []
        for r in results:
            ls = []
            if _flatten(r, ls) != out_tree:
                raise ShapeError(f"vmap({name}): entries returned different structures")
            flat.append(ls)
        n_out = len(out_leaves0)
        if n_out == 0:
            raise SampanValueError(f"vmap({name}): the function returned no tensor")
        od = [out_dims] * n_out if isinstance(out_dims, int) else list(out_dims)
        if len(od) != n_out or not all(type(d) is int for d in od):
            raise SampanValueError(f"vmap({name}): out_dims={out_dims!r} must be an int or "
                                   f"one int per returned tensor ({n_out})")
        stacked = []
        for j in range(n_out):
            parts = [ls[j] for ls in flat]
            shapes = {tuple(p.shape) for p in parts}
            if len(shapes) != 1:
                raise ShapeError(f"vmap({name}): output {j} has shapes {sorted(shapes)} "
                                 "across entries; every entry must return one shape")
            nd = parts[0].ndim + 1
            if not -nd <= od[j] < nd:
                raise ShapeError(f"vmap({name}): out_dims={od[j]} for an output of "
                                 f"{nd - 1} dims")
            stacked.append(stack(parts, od[j] % nd))
        return _unflatten(out_tree, stacked)
    return mapped
