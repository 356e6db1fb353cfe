"""Every op in the table, every sample: completeness, shape rule, forward and gradients
against PyTorch, float64 finite differences, second order for the ops that promise it."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
from sampan.autograd import gradcheck, gradgradcheck
from sampan.ops.composite import COMPOSITES
from sampan.ops.registry import NO_ONNX, NOT_DIFFERENTIABLE, OPS

from . import harness as H
from .torch_oracle import COMPOSITE_ORACLE, ORACLE

OP_CASES = H.op_cases()
COMP_CASES = H.composite_cases()
SECOND_ORDER_KINDS = {"elementwise"}
SECOND_ORDER_OPS = {"matmul", "sum", "mean", "reshape", "permute", "expand", "concat",
                    "getitem", "conv2d"}


def _sample(name, i):
    return (OPS[name].samples() if name in OPS else COMPOSITES[name][1]())[i]


def test_table_is_complete():
    problems = []
    for name, op in OPS.items():
        if op.kernels.get("numpy") is None:
            problems.append(f"{name}: no numpy kernel")
        if op.grad is None:
            problems.append(f"{name}: no gradient rule (or NOT_DIFFERENTIABLE)")
        if op.shape_rule is None:
            problems.append(f"{name}: no shape rule")
        if op.onnx is None:
            problems.append(f"{name}: no ONNX mapping (or NO_ONNX)")
        if op.flops is None:
            problems.append(f"{name}: no FLOP formula")
        if op.kind not in ("elementwise", "reduction", "opaque"):
            problems.append(f"{name}: unknown fusion kind {op.kind}")
        if op.kind == "elementwise" and not op.scalar:
            problems.append(f"{name}: elementwise op without a scalar expression")
        if not op.samples or not op.samples():
            problems.append(f"{name}: no test samples")
        if name not in ORACLE:
            problems.append(f"{name}: no PyTorch oracle entry (or None)")
    for name in COMPOSITES:
        if name not in COMPOSITE_ORACLE:
            problems.append(f"composite {name}: no PyTorch oracle")
    assert not problems, "\n".join(problems)


def test_no_onnx_marker_is_explicit():
    assert NO_ONNX == "none" and NOT_DIFFERENTIABLE == "not differentiable"


@pytest.mark.parametrize("name,i", OP_CASES)
def test_shape_rule_matches_kernel(name, i):
    H.check_shape_rule(name, _sample(name, i))


@pytest.mark.parametrize("name,i", [c for c in OP_CASES if ORACLE.get(c[0]) is not None]
                         + COMP_CASES)
def test_forward_matches_torch(name, i):
    H.check_forward_vs_torch(name, _sample(name, i))


def _grad_cases():
    out = []
    for name, i in OP_CASES + COMP_CASES:
        if not H.differentiable(name):
            continue
        s = _sample(name, i)
        if H.diff_indices(s, OPS.get(name)):
            out.append((name, i))
    return out


GRAD_CASES = _grad_cases()


def _float64_case(name, i):
    """(sample, differentiable input indices, float64 args); skips samples whose output is
    not float64 (a cast to a narrower dtype cannot be checked in float64)."""
    s = _sample(name, i)
    diff = H.diff_indices(s, OPS.get(name))
    args = H.to64(s.args)
    if not H.float64_outputs(name, args, s.attrs):
        pytest.skip("output is not float64 (cast to a narrower dtype)")
    return s, diff, args


@pytest.mark.parametrize("name,i", GRAD_CASES)
def test_gradients_match_torch(name, i):
    s, diff, args = _float64_case(name, i)
    ours, cots = H.grads_sampan(name, args, s.attrs, diff)
    theirs = H.grads_torch(name, args, s.attrs, diff, cots)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        if b is None:
            assert a is None or not np.any(a), f"{name}: input {diff[k]} should get no gradient"
            continue
        H.assert_close(a, b, rtol=1e-7, atol=1e-9, what=f"{name} grad of input {diff[k]}")


@pytest.mark.parametrize("name,i", GRAD_CASES)
def test_gradcheck_float64(name, i):
    s, diff, args = _float64_case(name, i)
    ins = H.make_inputs(args, diff)
    fn = _fn(name, ins, s.attrs)
    assert gradcheck(fn, [ins[j] for j in diff], atol=1e-6, rtol=1e-5)


def _fn(name, ins, attrs):
    """A function of the differentiable inputs only (others fixed)."""
    from sampan.tensor import apply
    diff_pos = [j for j, t in enumerate(ins) if isinstance(t, sampan.Tensor) and t.requires_grad]

    def f(*xs):
        full = list(ins)
        for j, x in zip(diff_pos, xs):
            full[j] = x
        if name in OPS:
            return apply(OPS[name], tuple(full), dict(attrs))
        return COMPOSITES[name][0](*full, **attrs)
    return f


def _second_order_cases():
    out = []
    for name, i in GRAD_CASES:
        if name in COMPOSITES or OPS[name].kind in SECOND_ORDER_KINDS or \
                name in SECOND_ORDER_OPS:
            s = _sample(name, i)
            if all(a.size <= 40 for a in s.args if isinstance(a, np.ndarray)):
                out.append((name, i))
    return out


@pytest.mark.parametrize("name,i", _second_order_cases())
def test_second_order_gradients(name, i):
    s, diff, args = _float64_case(name, i)
    ins = H.make_inputs(args, diff)
    assert gradgradcheck(_fn(name, ins, s.attrs), [ins[j] for j in diff])


@pytest.mark.parametrize("name", sorted(n for n, o in OPS.items() if o.random))
def test_random_ops_are_deterministic_per_key(name):
    s = OPS[name].samples()[0]
    _, a = H.run_op(name, s.args, s.attrs)
    _, b = H.run_op(name, s.args, s.attrs)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    key2 = s.args[0] + np.array([0, 1])
    _, c = H.run_op(name, (key2,), s.attrs)
    assert not np.array_equal(a.numpy(), c.numpy())


def test_random_distributions():
    g = sampan.Generator(1)
    u = sampan.rand(20000, generator=g).numpy()
    n = sampan.randn(20000, generator=g).numpy()
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    assert abs(n.mean()) < 0.03 and abs(n.std() - 1) < 0.03
    r = sampan.randint(3, 7, (5000,), generator=g).numpy()
    assert set(np.unique(r)) == {3, 4, 5, 6}
