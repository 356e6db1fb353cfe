"""Function transforms over the tape autograd: `grad`, `value_and_grad`, `vjp`, `jvp`,
`jacrev`, `hessian`, and `functional_call` to apply them to a Layer's weights.

They turn a function of tensors into the function that returns its gradient, in the
manner of `torch.func.grad` and `jax.grad`, and work the same eagerly and inside
`sampan.jit` (the gradient rules are ops, so the returned gradient is traced too)::

    def loss(w, x, y):
        return ((x @ w - y) ** 2).mean()

    g = grad(loss)(w, x, y)                    # d loss / d w, shaped like w
    (l, (gw, gx)) = value_and_grad(loss, argnums=(0, 1))(w, x, y)
    d2 = grad(grad(lambda x: x ** 3))          # transforms nest: 6 x, for a scalar x
    J = jacrev(sampan.tanh)(x)                 # (*y.shape, *x.shape), one vjp per output
    H = hessian(loss)(w, x, y)                 # jacrev of grad
    y, t = jvp(sampan.tanh, (x,), (v,))        # forward mode: J v, by two reverse passes

`functional_call(layer, params, args)` runs a Layer with some of its parameters and buffers
replaced by the given tensors, so the transforms apply to a model's weights::

    params = dict(model.named_parameters())
    g = grad(lambda p, x, y: loss_fn(functional_call(model, p, (x,)), y))(params, x, y)

`argnums` names the positional arguments to differentiate; each may be a tensor or a
(nested) list, tuple or dict of tensors (a parameter dict, say), and its gradient has
the same structure. Inputs that do not require grad are watched on a detached view, so
the caller's tensors are never modified and nothing accumulates in any `.grad`; an
input the output does not depend on gets a zero gradient. Where the inputs already
require grad and grad mode is on (an outer transform, or a caller differentiating the
result), the gradient is built with ``create_graph=True`` so it can be differentiated
again. Unstable: the names and the handling of nesting may change.
"""
from __future__ import annotations

import functools

import numpy as np

from ..autograd.engine import enable_grad, is_grad_enabled
from ..autograd.engine import grad as _tape_grad
from ..errors import AutogradError
from ..ops.creation import zeros_like
from ..tensor import Tensor

__all__ = ["functional_call", "grad", "hessian", "jacrev", "jvp", "value_and_grad", "vjp"]


def _floating(t: Tensor) -> bool:
    return t.dtype.kind == "f" or t.dtype.name == "bfloat16"


def _leaves(obj, where, out):
    """Structure of `obj` with tensors replaced by their index in `out`."""
    if isinstance(obj, Tensor):
        if not _floating(obj):
            raise AutogradError(f"{where} has dtype {obj.dtype}; gradients are taken "
                                "with respect to floating-point tensors")
        out.append(obj)
        return len(out) - 1
    if isinstance(obj, (list, tuple)):
        return type(obj)(_leaves(x, f"{where}[{i}]", out) for i, x in enumerate(obj))
    if isinstance(obj, dict):
        return {k: _leaves(v, f"{where}[{k!r}]", out) for k, v in obj.items()}
    raise AutogradError(f"{where} is a {type(obj).__name__}; expected a tensor or a "
                        "list, tuple or dict of tensors")


def _rebuild(tree, leaves):
    if isinstance(tree, int):
        return leaves[tree]
    if isinstance(tree, (list, tuple)):
        return type(tree)(_rebuild(t, leaves) for t in tree)
    return {k: _rebuild(v, leaves) for k, v in tree.items()}


def _watch(t: Tensor) -> Tensor:
    return t if t.requires_grad else t.detach().requires_grad_()


def _argnums(argnums):
    if isinstance(argnums, int):
        return (argnums,), True
    nums = tuple(argnums)
    if not nums or not all(isinstance(i, int) for i in nums):
        raise AutogradError(f"argnums must be an int or a non-empty tuple of ints, got "
                            f"{argnums!r}")
    return nums, False


def _name(fn):
    return getattr(fn, "__qualname__", None) or repr(fn)


def _prepare(fn, args, nums, what):
    """Watched copies of the differentiated arguments: (args, trees, flat leaves, higher),
    `higher` when grad mode is on and a given leaf already required grad (an outer
    transform or the caller differentiates the result: build it with create_graph)."""
    args = list(args)
    trees, flat = [], []
    higher = False
    for i in nums:
        if not -len(args) <= i < len(args):
            raise AutogradError(f"{what}({_name(fn)}): argnums has {i}, but the call "
                                f"passed {len(args)} positional arguments")
        leaves = []
        tree = _leaves(args[i], f"{what}({_name(fn)}): argument {i}", leaves)
        start = len(flat)
        higher = higher or any(t.requires_grad for t in leaves)
        flat.extend(_watch(t) for t in leaves)
        trees.append((tree, start, len(leaves)))
        args[i] = _rebuild(tree, flat[start:])
    return args, trees, flat, higher and is_grad_enabled()


def _regroup(full, trees):
    """Flat gradients back into each differentiated argument's structure."""
    return [_rebuild(tree, full[s:s + n]) for tree, s, n in trees]


def _grads(out, flat, trees, higher, grad_outputs=None):
    gs = _tape_grad(out, flat, grad_outputs=grad_outputs, create_graph=higher,
                    retain_graph=True if grad_outputs is not None else None,
                    allow_unused=True)
    return _regroup([zeros_like(t) if g is None else g for t, g in zip(flat, gs)], trees)


def value_and_grad(fn, argnums=0, has_aux=False):
    """`fn`'s value and its gradient with respect to `args[argnums]`: a function returning
    ``(value, grads)``, or ``((value, aux), grads)`` when `has_aux` (fn returns a pair).
    `fn` must return a one-element floating tensor. See the module docstring."""
    return _value_and_grad(fn, argnums, has_aux, "value_and_grad")


def _value_and_grad(fn, argnums, has_aux, _what):
    """value_and_grad, naming `_what` (the public transform called) in its errors."""
    nums, single = _argnums(argnums)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        args, trees, flat, higher_in = _prepare(fn, args, nums, _what)
        with enable_grad():
            res = fn(*args, **kwargs)
        aux = None
        if has_aux:
            if not (isinstance(res, tuple) and len(res) == 2):
                raise AutogradError(f"{_what}({_name(fn)}): has_aux=True needs fn "
                                    f"to return a pair (value, aux); got "
                                    f"{type(res).__name__}")
            res, aux = res
        if not isinstance(res, Tensor) or res.numel() != 1 or not _floating(res):
            got = (f"shape {tuple(res.shape)}, dtype {res.dtype}" if isinstance(res, Tensor)
                   else type(res).__name__)
            raise AutogradError(f"{_what}({_name(fn)}): fn must return a one-element "
                                f"floating tensor (got {got}); reduce it, e.g. with .sum(), "
                                "or use vjp")
        if not res.requires_grad:  # depends on none of the inputs: all gradients are zero
            gs = _grads_zero(flat, trees)
        else:
            gs = _grads(res, flat, trees, higher_in)
        value = res if higher_in else res.detach()
        g = gs[0] if single else tuple(gs)
        return ((value, aux), g) if has_aux else (value, g)

    return run


def _grads_zero(flat, trees):
    return _regroup([zeros_like(t) for t in flat], trees)


def grad(fn, argnums=0, has_aux=False):
    """The gradient of `fn` (returning a one-element tensor) with respect to
    `args[argnums]`, as a function of the same arguments; with `has_aux`, returns
    ``(grads, aux)``. Example: ``grad(lambda x: (x * x).sum())(x)`` is ``2 * x``."""
    vg = _value_and_grad(fn, argnums, has_aux, "grad")

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if has_aux:
            (_, aux), g = vg(*args, **kwargs)
            return g, aux
        return vg(*args, **kwargs)[1]

    return run


def vjp(fn, *primals):
    """``(fn(*primals), vjp_fn)``: `vjp_fn(cotangent)` returns the tuple of gradients of
    ``sum(fn(*primals) * cotangent)`` with respect to each primal (tensors or nested
    lists/tuples/dicts of them). `fn` returns one tensor; `vjp_fn` may be called again
    with other cotangents."""
    nums = tuple(range(len(primals)))
    args, trees, flat, higher = _prepare(fn, primals, nums, "vjp")
    with enable_grad():
        out = fn(*args)
    if not isinstance(out, Tensor):
        raise AutogradError(f"vjp({_name(fn)}): fn must return a tensor, got "
                            f"{type(out).__name__}")

    def vjp_fn(cotangent):
        from ..tensor import as_tensor
        ct = as_tensor(cotangent, out.dtype)
        if tuple(ct.shape) != tuple(out.shape):
            raise AutogradError(f"vjp({_name(fn)}): cotangent of shape {tuple(ct.shape)} "
                                f"for an output of shape {tuple(out.shape)}")
        if not out.requires_grad:
            return tuple(_grads_zero(flat, trees))
        return tuple(_grads(out, flat, trees, higher, grad_outputs=ct))

    return (out if higher else out.detach()), vjp_fn


def jvp(fn, primals, tangents):
    """``(fn(*primals), J @ tangents)``: the Jacobian-vector product of `fn` (returning one
    tensor) at the tensors `primals`, for tangents of the same shapes, as
    ``torch.func.jvp`` gives it. Computed by reverse mode twice (the gradient ``J^T u`` for
    a cotangent u is linear in u, and its vjp is ``J v``), so it costs two backward passes
    and needs the gradient rules to be differentiable, which sampan's are."""
    primals, tangents = tuple(primals), tuple(tangents)
    if len(primals) != len(tangents) or not all(isinstance(t, Tensor)
                                                 for t in primals + tangents):
        raise AutogradError(f"jvp({_name(fn)}): primals and tangents must be tuples of "
                            f"tensors of one length (got {len(primals)} and "
                            f"{len(tangents)})")
    for i, (p, t) in enumerate(zip(primals, tangents)):
        if tuple(p.shape) != tuple(t.shape):
            raise AutogradError(f"jvp({_name(fn)}): tangent {i} has shape "
                                f"{tuple(t.shape)}, its primal {tuple(p.shape)}")
    higher = is_grad_enabled() and any(t.requires_grad for t in primals + tangents)
    watched = [_watch(p) for p in primals]
    jv = None
    with enable_grad():
        out = fn(*watched)
        if not isinstance(out, Tensor):
            raise AutogradError(f"jvp({_name(fn)}): fn must return a tensor, got "
                                f"{type(out).__name__}")
        if out.requires_grad:
            u = zeros_like(out).requires_grad_()
            gs = _tape_grad(out, watched, grad_outputs=u, create_graph=True,
                            allow_unused=True)
            pairs = [(g, t) for g, t in zip(gs, tangents) if g is not None and g.requires_grad]
            if pairs:
                (jv,) = _tape_grad([g for g, _ in pairs], [u],
                                   grad_outputs=[t for _, t in pairs], create_graph=higher,
                                   allow_unused=True)
    if jv is None:   # the output depends on none of the primals
        jv = zeros_like(out)
    if not higher:
        out, jv = out.detach(), jv.detach()
    return out, jv


def jacrev(fn, argnums=0):
    """The Jacobian of `fn` (returning one tensor y) with respect to the tensor
    ``args[argnums]`` (an int, or a tuple for a tuple of Jacobians), by reverse mode:
    one vector-Jacobian product per element of y, each of shape ``y.shape + x.shape``.
    Meant for small outputs (a Hessian, a sensitivity matrix)."""
    nums, single = _argnums(argnums)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        for i in nums:
            if not -len(args) <= i < len(args) or not isinstance(args[i], Tensor):
                raise AutogradError(f"jacrev({_name(fn)}): argnums {i} must name a tensor "
                                    f"argument (of {len(args)} passed)")
        pos = [i % len(args) for i in nums]

        def part(*xs):
            full = list(args)
            for i, x in zip(pos, xs):
                full[i] = x
            return fn(*full, **kwargs)

        y, pull = vjp(part, *(args[i] for i in pos))
        from ..ops.shape import reshape, stack
        n = y.numel()
        eye = np.eye(n, dtype=y.dtype)
        rows = [pull(Tensor(eye[k].reshape(tuple(y.shape)))) for k in range(n)]
        jac = []
        for j, i in enumerate(pos):
            x = args[i]
            jac.append(reshape(stack([r[j] for r in rows]), tuple(y.shape) + tuple(x.shape)))
        return jac[0] if single else tuple(jac)

    return run


def hessian(fn, argnums=0):
    """The Hessian of `fn` (returning a one-element tensor) with respect to the tensor
    ``args[argnums]``: ``jacrev(grad(fn, argnums), argnums)``, of shape
    ``x.shape + x.shape``."""
    if not isinstance(argnums, int):
        raise AutogradError(f"hessian({_name(fn)}): argnums must be one int, got "
                            f"{argnums!r}")
    return jacrev(grad(fn, argnums), argnums)


def functional_call(layer, params_and_buffers, args=(), kwargs=None, strict=False):
    """``layer(*args, **kwargs)`` with the parameters and buffers named in
    `params_and_buffers` (qualified names, as `named_parameters()` gives them) replaced by
    the given tensors for this call only; the layer is restored afterwards, even when the
    call raises. A parameter registered under several names (tied weights) is replaced
    under all of them. `strict=True` also requires every parameter and buffer to be given.
    Not thread-safe: the layer is modified while the call runs (as in ``torch.func``)."""
    from ..nn.layer import Layer
    if not isinstance(layer, Layer):
        raise AutogradError(f"functional_call: expected a Layer, got {type(layer).__name__}")
    if not isinstance(args, tuple):
        args = (args,)
    by_name = {}  # qualified name -> (owner layer, registry, name in it); a name is a
    for lname, sub in layer.named_layers():     # parameter or a buffer, never both
        for kind in ("_parameters", "_buffers"):
            for name in getattr(sub, kind):
                by_name[f"{lname}.{name}" if lname else name] = (sub, kind, name)
    unknown = [k for k in params_and_buffers if k not in by_name]
    if unknown:
        raise AutogradError(f"functional_call({type(layer).__name__}): no parameter or buffer "
                            f"named {', '.join(map(repr, unknown))}; it has "
                            f"{', '.join(sorted(by_name)) or 'none'}")
    if strict:
        seen = {id(getattr(o, k)[n]) for o, k, n in (by_name[q] for q in params_and_buffers)}
        missing = [q for q, (o, k, n) in by_name.items()
                   if getattr(o, k)[n] is not None and id(getattr(o, k)[n]) not in seen]
        if missing:
            raise AutogradError(f"functional_call({type(layer).__name__}, strict=True): "
                                f"missing {', '.join(missing)}")
    new_of = {}   # id(original tensor) -> replacement (ties follow the original object)
    for q, t in params_and_buffers.items():
        if not isinstance(t, Tensor):
            raise AutogradError(f"functional_call: {q!r} got a {type(t).__name__}; expected "
                                "a tensor")
        o, k, n = by_name[q]
        old = getattr(o, k)[n]
        if old is not None and tuple(old.shape) != tuple(t.shape):
            raise AutogradError(f"functional_call: {q!r} has shape {tuple(old.shape)}, "
                                f"got {tuple(t.shape)}")
        new_of[id(old) if old is not None else ("none", q)] = t
    saved = []
    try:
        for q, (o, k, n) in by_name.items():
            reg = getattr(o, k)
            old = reg[n]
            t = new_of.get(id(old) if old is not None else ("none", q))
            if t is not None:
                saved.append((reg, n, old))
                reg[n] = t
        return layer(*args, **(kwargs or {}))
    finally:
        for reg, n, old in reversed(saved):
            reg[n] = old
