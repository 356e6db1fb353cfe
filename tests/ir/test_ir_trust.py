"""IR text keeps every bit of a constant: NaN signs and payloads round-trip (issue 16, item 13)."""
import numpy as np
import pytest
import torch

import sampan
from sampan import dtypes as _dt
from sampan.ir import Graph, parse, verify

NEG_NAN32 = np.array(0xFFC00000, np.uint32).view(np.float32)     # -nan
PAYLOAD32 = np.array(0x7FC00001, np.uint32).view(np.float32)     # nan with a payload


def _graph_with(const):
    g = Graph("nans")
    x = g.add_input(const.shape, const.dtype, "x")
    c = g.add_const(const)
    g.outputs = [g.add_node("add", [x, c], {}).output]
    return g


def _roundtrip(g):
    g2 = parse(str(g), {c.name: c.const for c in g.consts if c.name})
    verify(g2)
    assert g2 == g
    assert str(g2) == str(g)
    return g2


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_negative_nan_constant_round_trips(dtype):
    d = _dt.as_dtype(dtype)
    a = np.array([np.nan, 1.5, np.nan, -0.0], np.float64).astype(d)
    a[0] = -a[0]          # sign bit set on the first NaN only
    g2 = _roundtrip(_graph_with(a))
    back = g2.consts[0].const
    assert back.tobytes() == a.tobytes()
    # the reference: torch reads the sign of each NaN as we wrote it
    signs = torch.from_numpy(a.astype(np.float32)).signbit().tolist()
    assert np.signbit(back.astype(np.float32)).tolist() == signs == [True, False, False, True]


def test_scalar_negative_nan_and_payload_nan_keep_their_bits():
    for a in (np.array(NEG_NAN32), np.array([PAYLOAD32, NEG_NAN32, 2.0], np.float32)):
        g2 = _roundtrip(_graph_with(a))
        assert g2.consts[0].const.view(np.uint32).tolist() == a.view(np.uint32).tolist()
    text = str(_graph_with(np.array([PAYLOAD32], np.float32)))
    assert "const(bits=[2143289345])" in text
    assert "const(value=-nan)" in str(_graph_with(np.array(NEG_NAN32)))


def test_nan_sign_in_attributes_round_trips_and_counts_for_equality():
    def fill(value):
        g = Graph("fill")
        g.outputs = [g.add_node("full", [], {"shape": (2,), "value": value,
                                             "dtype": "float32"}).output]
        return g
    neg, pos = fill(float(NEG_NAN32)), fill(float("nan"))
    assert "value=-nan" in str(neg)
    g2 = _roundtrip(neg)
    assert np.signbit(g2.nodes[0].attrs["value"])
    assert neg != pos


def test_jit_keeps_the_sign_of_a_nan_fill():
    f = sampan.jit(lambda x: x + sampan.full((3,), float(NEG_NAN32)))
    y = f(sampan.zeros(3)).numpy()
    ref = (torch.zeros(3) + torch.full((3,), float(NEG_NAN32))).signbit().numpy()
    np.testing.assert_array_equal(np.signbit(y), ref)
    g = f.graph
    assert parse(str(g), {c.name: c.const for c in g.consts if c.name}) == g


def test_generated_code_keeps_the_sign_of_a_nan_attribute():
    # 100 elements: too large for constant folding, so the fill runs in generated code
    f = sampan.jit(lambda x: x + sampan.full((100,), float(NEG_NAN32)))
    y = f(sampan.zeros(100)).numpy()
    assert "full(" in str(f.graph) or "fused(" in str(f.graph)
    ref = torch.full((100,), float(NEG_NAN32)).signbit().numpy()
    np.testing.assert_array_equal(np.signbit(y), ref)
