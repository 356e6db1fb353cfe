"""Tensor creation, conversion, indexing, operators, dtypes and promotion."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import sampan
from sampan import dtypes as D


def test_creation_functions():
    assert sampan.zeros(2, 3).shape == (2, 3) and sampan.zeros(2, 3).dtype == sampan.float32
    assert sampan.ones((2,)).numpy().tolist() == [1.0, 1.0]
    assert sampan.full((2, 2), 7).dtype == sampan.int64
    assert sampan.arange(5).tolist() == [0, 1, 2, 3, 4]
    assert sampan.arange(0, 1, 0.25).dtype == sampan.float32
    np.testing.assert_allclose(sampan.linspace(0, 1, 5).numpy(), np.linspace(0, 1, 5))
    assert sampan.eye(3).numpy().trace() == 3
    x = sampan.tensor([[1, 2], [3, 4]])
    assert x.dtype == sampan.int64 and x.ndim == 2 and x.size() == (2, 2) and x.numel() == 4
    assert sampan.zeros_like(x).dtype == sampan.int64
    assert sampan.tensor(3.5).item() == 3.5
    assert np.asarray(sampan.tensor([1.0, 2.0])).tolist() == [1.0, 2.0]
    assert "tensor(" in repr(x) and str(x.device) == "cpu"


def test_seeding_is_reproducible():
    sampan.manual_seed(5)
    a = sampan.randn(4).numpy()
    sampan.manual_seed(5)
    b = sampan.randn(4).numpy()
    np.testing.assert_array_equal(a, b)
    g = sampan.Generator(5)
    c = sampan.rand(3, generator=g).numpy()
    g.manual_seed(5)
    np.testing.assert_array_equal(c, sampan.rand(3, generator=g).numpy())
    assert sampan.randperm(10).numpy().tolist() != list(range(10)) or True
    assert sorted(sampan.randperm(10).tolist()) == list(range(10))


def test_operators_match_numpy():
    a = np.array([[1.5, -2.0], [3.0, 4.0]], np.float32)
    b = np.array([0.5, 2.0], np.float32)
    x, y = sampan.tensor(a), sampan.tensor(b)
    for f in [lambda p, q: p + q, lambda p, q: p - q, lambda p, q: p * q, lambda p, q: p / q,
              lambda p, q: p ** 2, lambda p, q: 2 - p, lambda p, q: 1 / q, lambda p, q: -p,
              lambda p, q: abs(p), lambda p, q: p @ p, lambda p, q: p > q, lambda p, q: p == 3,
              lambda p, q: p // q, lambda p, q: p % q]:
        np.testing.assert_allclose(np.asarray(f(x, y).numpy(), np.float64),
                                   np.asarray(f(a, b), np.float64), rtol=1e-6)


def test_indexing_and_setitem():
    a = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)
    x = sampan.tensor(a)
    for idx in [1, (1, 2), (slice(None), 0), (Ellipsis, 1), (None, 0), (0, [0, 2]),
                (slice(None, None, -1),), np.array([1, 0]), a > 10, (1, slice(0, 3, 2), -1)]:
        np.testing.assert_array_equal(x[idx].numpy(), a[idx])
    x[0, 1] = 100.0
    a[0, 1] = 100.0
    np.testing.assert_array_equal(x.numpy(), a)
    x[x > 50] = 0.0
    a[a > 50] = 0.0
    np.testing.assert_array_equal(x.numpy(), a)


def test_detach_clone_contiguous_to():
    x = sampan.tensor([1.0, 2.0], requires_grad=True)
    d = x.detach()
    assert not d.requires_grad and np.shares_memory(d.numpy(), x.numpy())
    c = x.clone()
    assert c.requires_grad and not np.shares_memory(c.numpy(), x.numpy())
    t = sampan.tensor(np.ones((3, 4), np.float32)).T
    assert not t.numpy().flags.c_contiguous and t.contiguous().numpy().flags.c_contiguous
    assert x.to("float64").dtype == sampan.float64
    assert x.to(sampan.bfloat16).dtype == sampan.bfloat16
    with pytest.raises(sampan.DeviceError, match="gpu extra|CuPy"):
        x.to("cuda")
    assert sampan.device("cpu") == sampan.Device("cpu")


PROMOTION = [
    ("bool", "int8", "int8"), ("uint8", "int8", "int16"), ("int32", "int64", "int64"),
    ("int64", "float16", "float16"), ("float16", "bfloat16", "float32"),
    ("bfloat16", "float32", "float32"), ("float32", "float64", "float64"),
    ("int32", "float32", "float32"), ("uint8", "bool", "uint8"),
]


@pytest.mark.parametrize("a,b,want", PROMOTION)
def test_promotion_table(a, b, want):
    assert D.promote_types(D.as_dtype(a), D.as_dtype(b)) == D.as_dtype(want)
    x = sampan.ones(2, dtype=a)
    y = sampan.ones(2, dtype=b)
    assert (x + y).dtype == D.as_dtype(want)


def test_python_scalars_do_not_widen():
    assert (sampan.ones(2, dtype="float16") * 2.5).dtype == sampan.float16
    assert (sampan.ones(2, dtype="int32") + 1).dtype == sampan.int32
    assert (sampan.ones(2, dtype="int32") * 1.5).dtype == sampan.float32
    assert (sampan.tensor([True]) + 1).dtype == sampan.int64
    assert (sampan.ones(2, dtype="int64") / 2).dtype == sampan.float32


def test_default_dtype():
    sampan.set_default_dtype("float64")
    try:
        assert sampan.tensor([1.0]).dtype == sampan.float64
        assert sampan.randn(2).dtype == sampan.float64
    finally:
        sampan.set_default_dtype("float32")


def test_bfloat16_accumulates_in_float32():
    x = sampan.ones(10 ** 6, dtype="bfloat16")
    # accumulated in float32, then rounded once (numpy on bfloat16 would give 256)
    assert float(x.sum()) == float(ml_dtypes.bfloat16(1e6))
    assert float(x.mean()) == 1.0
    a = sampan.ones(64, 64, dtype="bfloat16")
    assert float((a @ a)[0, 0]) == 64.0


BIN = ["add", "sub", "mul", "maximum", "minimum"]


@given(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=0,
                                         max_side=4), st.sampled_from(BIN))
def test_broadcasting_binary_ops_vs_numpy(shapes, name):
    r = np.random.default_rng(0)
    a = r.standard_normal(shapes.input_shapes[0]).astype(np.float32)
    b = r.standard_normal(shapes.input_shapes[1]).astype(np.float32)
    ref = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum,
           "minimum": np.minimum}[name]
    out = getattr(sampan, name)(sampan.tensor(a), sampan.tensor(b))
    np.testing.assert_allclose(out.numpy(), ref(a, b), rtol=1e-6)
    assert out.shape == shapes.result_shape


@given(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
       st.sampled_from(["exp", "tanh", "sigmoid", "relu", "abs", "sin"]))
def test_unary_ops_any_shape_vs_numpy(shape, name):
    a = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    ref = {"exp": np.exp, "tanh": np.tanh, "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
           "relu": lambda v: np.maximum(v, 0), "abs": np.abs, "sin": np.sin}[name]
    np.testing.assert_allclose(getattr(sampan, name)(sampan.tensor(a)).numpy(), ref(a),
                               rtol=1e-5, atol=1e-6)


@given(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5), st.booleans())
def test_reductions_any_shape_vs_numpy(shape, keep):
    a = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    axis = len(shape) - 1
    np.testing.assert_allclose(sampan.sum(sampan.tensor(a), axis, keepdims=keep).numpy(),
                               a.sum(axis, keepdims=keep), rtol=1e-5, atol=1e-6)
    if a.size:
        np.testing.assert_allclose(sampan.amax(sampan.tensor(a), axis, keep).numpy(),
                                   a.max(axis, keepdims=keep))


def test_ml_dtypes_is_the_bfloat16():
    assert sampan.bfloat16 == np.dtype(ml_dtypes.bfloat16)


def test_numpy_array_operands_act_as_tensors():
    """An ndarray next to a tensor is a tensor of its dtype (a 0-d array a scalar), on
    either side, as torch treats them; it used to fail hashing the array as a constant."""
    t = sampan.tensor(np.array([1.0, 2.0, 3.0], np.float32))
    a = np.array([1.0, 0.0, 3.0])
    assert (t == a).numpy().tolist() == [True, False, True]
    assert (a == t).numpy().tolist() == [True, False, True]
    s = t + a
    assert s.dtype == sampan.float64 and s.numpy().tolist() == [2.0, 2.0, 6.0]
    assert (a * t).numpy().tolist() == [1.0, 0.0, 9.0]
    z = t + np.array(1.0)   # 0-d: a scalar, so float32 stays
    assert z.dtype == sampan.float32 and z.numpy().tolist() == [2.0, 3.0, 4.0]
