"""The op-test harness: runs one sample of one op every way the op table promises.

Adding an op adds samples (in its OpDef) and a PyTorch oracle entry, not a test file."""
from __future__ import annotations

import numpy as np

import sampan
from sampan.ops.composite import COMPOSITES
from sampan.ops.registry import NOT_DIFFERENTIABLE, OPS, Spec
from sampan.tensor import Tensor, apply, wrap

from .torch_oracle import COMPOSITE_ORACLE, ORACLE, to_torch

try:
    from .torch_oracle_nn import ORACLE as _NN_ORACLE
    ORACLE.update(_NN_ORACLE)
except ImportError:
    pass


def _merge_area_oracles():
    """Each area's oracle module (torch_oracle_<area>.py) adds its entries here."""
    import importlib
    # spatial last: its pooling oracles replace nn's (they read ceil_mode, divisor_override)
    for area in ("math", "layout", "scatter", "linalg", "nn", "spatial", "quant", "dist"):
        mod = importlib.import_module(f"{__package__}.torch_oracle_{area}")
        ORACLE.update(mod.ORACLE)
        COMPOSITE_ORACLE.update(mod.COMPOSITE_ORACLE)


_merge_area_oracles()


def op_cases():
    """(op name, sample index) for every op in the table."""
    return [(name, i) for name, op in sorted(OPS.items()) for i in range(len(op.samples()))]


def composite_cases():
    return [(name, i) for name, (_, s) in sorted(COMPOSITES.items()) for i in range(len(s()))]


def is_float(a):
    return isinstance(a, np.ndarray) and (a.dtype.kind == "f" or a.dtype.name == "bfloat16")


def to64(args):
    return tuple(a.astype(np.float64) if is_float(a) else a for a in args)


def diff_indices(sample, op=None):
    if sample.diff is not None:
        return tuple(sample.diff)
    skip = op.nondiff_inputs if op is not None else ()
    return tuple(i for i, a in enumerate(sample.args) if is_float(a) and i not in skip)


def make_inputs(args, diff):
    out = []
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray):
            t = wrap(a.copy())
            if i in diff:
                t.requires_grad_(True)
            out.append(t)
        else:
            out.append(a)
    return out


def run_op(name, args, attrs, diff=()):
    """Run op `name` on numpy args through the table (eager)."""
    if name in OPS:
        ins = make_inputs(args, diff)
        return ins, apply(OPS[name], tuple(ins), dict(attrs))
    fn = COMPOSITES[name][0]
    ins = make_inputs(args, diff)
    return ins, fn(*ins, **attrs)


def outputs(y):
    return list(y) if isinstance(y, (tuple, list)) else [y]


def torch_run(name, args, attrs, diff=()):
    import torch
    oracle = ORACLE[name] if name in OPS else COMPOSITE_ORACLE[name]
    ts = []
    for i, a in enumerate(args):
        t = to_torch(torch, a)
        if i in diff:
            t.requires_grad_(True)
        ts.append(t)
    return ts, oracle(torch, ts, dict(attrs))


def spec_of(a):
    return Spec(tuple(a.shape), a.dtype)


def check_shape_rule(name, sample):
    op = OPS[name]
    specs = [spec_of(a) for a in sample.args]
    rule = op.shape_rule(*specs, **sample.attrs)
    _, y = run_op(name, sample.args, sample.attrs)
    rules = rule if isinstance(rule, (tuple, list)) else [rule]
    ys = outputs(y)
    assert len(rules) == len(ys) == (op.n_out or len(rules))  # None: arity from attrs
    for r, t in zip(rules, ys):
        assert len(r.shape) == len(t.shape) and all(
            isinstance(a, str) or a == b for a, b in zip(r.shape, t.shape)), (name, r, t.shape)
        assert r.dtype == t.dtype, (name, r.dtype, t.dtype)


def assert_close(a, b, rtol, atol, what=""):
    a = np.asarray(a, dtype=np.float64) if np.asarray(a).dtype != np.bool_ else np.asarray(a)
    b = np.asarray(b, dtype=np.float64) if np.asarray(b).dtype != np.bool_ else np.asarray(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=what)


def tnp(t):
    t = t.detach()
    if str(t.dtype) == "torch.bfloat16":
        t = t.float()
    return t.numpy()


def check_forward_vs_torch(name, sample):
    _, y = run_op(name, sample.args, sample.attrs)
    _, ty = torch_run(name, sample.args, sample.attrs)
    for a, b in zip(outputs(y), outputs(ty)):
        low = a.dtype in (sampan.bfloat16, sampan.float16)
        assert_close(a.numpy().astype(np.float64) if low else a.numpy(), tnp(b),
                     rtol=1e-2 if low else 2e-5, atol=1e-2 if low else 1e-6, what=name)


def grads_sampan(name, args, attrs, diff, cot_seed=0):
    ins, y = run_op(name, args, attrs, diff)
    ys = [o for o in outputs(y) if o.requires_grad]
    r = np.random.default_rng(cot_seed)
    cots = [r.standard_normal(o.shape) for o in ys]
    gs = sampan.grad(ys, [ins[i] for i in diff], [wrap(c.astype(o.dtype))
                                                  for c, o in zip(cots, ys)], allow_unused=True)
    return [None if g is None else g.numpy() for g in gs], cots


def grads_torch(name, args, attrs, diff, cots):
    import torch
    ts, y = torch_run(name, args, attrs, diff)
    ys = [o for o in outputs(y) if o.requires_grad]
    gs = torch.autograd.grad(ys, [ts[i] for i in diff], [torch.from_numpy(c) for c in cots],
                             allow_unused=True)
    return [None if g is None else g.numpy() for g in gs]


def differentiable(name):
    if name in COMPOSITES:
        return True
    return OPS[name].grad is not NOT_DIFFERENTIABLE


def float64_outputs(name, args, attrs):
    _, y = run_op(name, args, attrs)
    return all(o.dtype == np.float64 for o in outputs(y) if is_float(o._data))


# ---------------------------------------------------------------------- mutated shapes
def mutated_shapes(args):
    """Each array input with one dimension grown or shrunk by one: (input, dim, delta, args).

    Grown inputs repeat their first slice along the dimension (zeros when it is empty), so
    index inputs stay in range and only the shape is wrong."""
    for i, a in enumerate(args):
        if not isinstance(a, np.ndarray):
            continue
        for d in range(a.ndim):
            for delta in (1, -1):
                if a.shape[d] + delta < 0:
                    continue
                if delta > 0:
                    extra = (np.take(a, [0], axis=d) if a.shape[d] else
                             np.zeros(a.shape[:d] + (1,) + a.shape[d + 1:], a.dtype))
                    b = np.concatenate([a, extra], axis=d)
                else:
                    b = np.take(a, np.arange(a.shape[d] - 1), axis=d)
                out = list(args)
                out[i] = b
                yield i, d, delta, tuple(out)


def check_mutated_sample(name, sample):
    """Run op `name` eagerly on every mutation of `sample`; return the problems found.

    The op must match its own shape rule (where the rule accepts) or raise a sampan
    error; accepting what the rule rejects, or failing with a non-sampan error, is a
    problem. (A crash kills the process: run this in a subprocess, see
    `run_mutated_shapes`.)"""
    from sampan.errors import SampanError
    op = OPS[name]
    problems = []
    for i, d, delta, args in mutated_shapes(sample.args):
        where = f"{name}: input {i} dim {d} {'+1' if delta > 0 else '-1'} " \
                f"{[tuple(a.shape) for a in args if isinstance(a, np.ndarray)]}"
        try:
            rule = op.shape_rule(*[spec_of(a) for a in args], **sample.attrs)
        except SampanError:
            rule = None
        except Exception as e:
            problems.append(f"{where}: the shape rule failed with {type(e).__name__}: {e}")
            continue
        try:
            _, y = run_op(name, args, sample.attrs)
        except SampanError:
            continue
        except Exception as e:
            problems.append(f"{where}: non-sampan {type(e).__name__}: {e}")
            continue
        if rule is None:
            problems.append(f"{where}: the shape rule rejects it, eager accepted it")
            continue
        rules = rule if isinstance(rule, (tuple, list)) else [rule]
        for r, t in zip(rules, outputs(y)):
            # a symbolic (str) dim is one the data decides (nonzero, unique …): any length
            if len(r.shape) != len(t.shape) or any(
                    not isinstance(a, str) and a != b for a, b in zip(r.shape, t.shape)) \
                    or r.dtype != t.dtype:
                problems.append(f"{where}: rule says {r}, eager gave {t.dtype}{list(t.shape)}")
    return problems


def run_mutated_shapes(progress_path):
    """Every op, every sample, every mutation, in this process; writes the case about to
    run to `progress_path` first (so a parent can name the case that crashed the process)
    and returns the problems found."""
    import warnings
    problems = []
    with open(progress_path, "w", buffering=1) as progress, warnings.catch_warnings():
        warnings.simplefilter("ignore")     # e.g. divide by zero in a pooled mean
        for name, i in op_cases():
            progress.write(f"{name} sample {i}\n")
            problems += check_mutated_sample(name, OPS[name].samples()[i])
        progress.write("done\n")
    return problems


# ---------------------------------------------------------------------- second order
def second_order_error(name, sample, keep=None, seed=0, eps=1e-6):
    """Double backward against float64 central differences of the first gradient.

    With random cotangents v (of the outputs) and u (of the first gradient) and a random
    direction d of the differentiable inputs, compares d . grad(<u, grad(<v, f(x)>, x)>, x)
    (double backward) with (<u, g(x + eps d)> - <u, g(x - eps d)>) / (2 eps), where g is the
    first gradient: one directional check costs two first gradients and one double backward
    whatever the input size. A first gradient that does not require grad counts as a
    constant (its double backward is 0): a gradient rule built from a non-differentiable op
    shows up as a difference, not as a skipped case. `keep` (an output index) gives a
    cotangent to that output only and drops the others before backward, as user code that
    reads only ``eigh(A).eigenvectors`` does. Returns (max abs difference, scale)."""
    args = to64(sample.args)
    diff = diff_indices(sample, OPS.get(name))
    r = np.random.default_rng(seed)
    ds = [r.standard_normal(args[i].shape) for i in diff]

    def first(shift, create):
        xs = list(args)
        for i, d in zip(diff, ds):
            xs[i] = np.asarray(args[i] + shift * d, dtype=args[i].dtype)
        ins, y = run_op(name, tuple(xs), sample.attrs, diff)
        ys = [o for o in outputs(y) if o.requires_grad]
        if keep is not None:
            ys = [outputs(y)[keep]]
        del y                       # outputs not in ys are dropped (only the tape holds them)
        rv = np.random.default_rng(seed + 1)
        cots = [wrap(rv.standard_normal(o.shape).astype(o.dtype)) for o in ys]
        gs = sampan.grad(ys, [ins[i] for i in diff], cots, create_graph=create,
                         allow_unused=True)
        return ins, gs

    ru = np.random.default_rng(seed + 2)
    us = [ru.standard_normal(args[i].shape) for i in diff]
    ins, gs = first(0.0, True)
    live = [(g, u) for g, u in zip(gs, us) if g is not None and g.requires_grad]
    analytic = 0.0
    if live:
        total = None
        for g, u in live:
            term = (g * wrap(u.astype(g.dtype))).sum()
            total = term if total is None else total + term
        hs = sampan.grad(total, [ins[i] for i in diff], allow_unused=True)
        analytic = sum(float(np.sum(h.numpy() * d)) for h, d in zip(hs, ds) if h is not None)

    def dot(gs):
        return sum(float(np.sum(g.numpy() * u)) for g, u in zip(gs, us) if g is not None)
    numeric = (dot(first(eps, False)[1]) - dot(first(-eps, False)[1])) / (2 * eps)
    return abs(analytic - numeric), max(abs(analytic), abs(numeric), 1.0)
