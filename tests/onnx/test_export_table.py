"""Every op of the table with an ONNX mapping, on every sample: a one-node program is
exported, run in onnxruntime and compared with the op's numpy kernel, in the sample's
dtypes and again in float64 and int64 (where the op takes them and onnxruntime has a kernel
for them). Composites are traced from their functions (they lower through their
primitives)."""
from __future__ import annotations

import numpy as np
import pytest

import sampan.onnx
from sampan.ir.graph import Graph
from sampan.onnx.export import MIN_OPSET, check, graph_to_model, onnx_dtype, to_model
from sampan.ops.composite import COMPOSITES
from sampan.ops.registry import NO_ONNX, OPS, Spec
from sampan.tensor import wrap

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

# ops whose ONNX form cannot reproduce sampan's values, only their shape and dtype
RANDOM = {n for n, o in OPS.items() if o.random}
_OPTS = ort.SessionOptions()
_OPTS.log_severity_level = 3


def _mapped(name):
    m = OPS[name].onnx
    return m is not None and m != NO_ONNX


OP_CASES = [(n, i) for n in sorted(OPS) if _mapped(n) for i in range(len(OPS[n].samples()))]
COMP_CASES = [(n, i) for n in sorted(COMPOSITES) for i in range(len(COMPOSITES[n][1]()))]


def _as64(a):
    return a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype == np.float32 else a


def _run(model, arrays):
    try:
        s = ort.InferenceSession(model.SerializeToString(), _OPTS,
                                 providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        if "NOT_IMPLEMENTED" in str(e) or "Could not find an implementation" in str(e):
            pytest.skip(f"onnxruntime has no kernel: {str(e)[:200]}")
        raise
    if any(o.type == "tensor(bfloat16)" for o in s.get_outputs()):
        pytest.skip("onnxruntime's Python API cannot return bfloat16 arrays")
    feed = {i.name: a for i, a in zip(s.get_inputs(), arrays)}
    try:
        return s.run(None, feed)
    except Exception as e:  # noqa: BLE001
        if "is not supported now" in str(e):   # e.g. per-channel ConvInteger zero points
            pytest.skip(f"onnxruntime's kernel lacks this case: {str(e)[:200]}")
        raise


# (values, indices) ops: the index of one of several equal values is unspecified (TopK
# and sampan's selection may pick different ones), so an index is checked by what it reads
TIES = {"kthvalue", "topk", "sort"}


def _check_indices(args, attrs, got, want):
    x, axis = args[0], attrs["axis"]
    idx = got[1]
    if not attrs.get("keepdim", True) and idx.ndim < x.ndim:
        idx = np.expand_dims(idx, axis)
    read = np.take_along_axis(x, idx, axis) if x.size and idx.size else idx.astype(x.dtype)
    np.testing.assert_array_equal(read.reshape(np.shape(want[0])), want[0])
    return [got[0]], [want[0]]


def _compare(name, got, want, args=None, attrs=None):
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    if name in TIES and args is not None:
        got, want = _check_indices(args, attrs, got, want)
    assert len(got) == len(want), f"{name}: {len(got)} outputs; expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        assert g.shape == w.shape, f"{name} output {k}: shape {g.shape}; expected {w.shape}"
        if name in RANDOM:
            assert g.dtype == w.dtype
            continue
        if w.dtype.kind == "f" and w.dtype.itemsize >= 4:
            tol = 1e-4 if w.dtype == np.float32 else 1e-7
            np.testing.assert_allclose(g.astype(w.dtype), w, rtol=tol, atol=tol * 0.1,
                                       equal_nan=True, err_msg=f"{name} output {k}")
        elif w.dtype.kind == "f":
            np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32),
                                       rtol=1e-2, atol=1e-2, err_msg=f"{name} output {k}")
        else:
            assert g.dtype == w.dtype, f"{name} output {k}: {g.dtype}; expected {w.dtype}"
            np.testing.assert_array_equal(g, w, err_msg=f"{name} output {k}")


def _one_node(name, args, attrs):
    g = Graph()
    vals = [g.add_input(a.shape, a.dtype) for a in args]
    node = g.add_node(name, vals, attrs, loc="test_export_table.py")
    g.outputs = list(node.outputs)
    model = graph_to_model(g, {i: f"in{i}" for i in range(len(vals))}, {})
    check(model)
    return model


def _as_int(a):
    if isinstance(a, np.ndarray) and a.dtype == np.float32:
        return np.asarray(np.round(np.nan_to_num(a * 3, posinf=9, neginf=-9)), np.int64)
    return a


@pytest.mark.parametrize("dt", ["sample", "float64", "int64"])
@pytest.mark.parametrize("name,i", OP_CASES)
def test_op_round_trip(name, i, dt):
    s = OPS[name].samples()[i]
    args = list(s.args)
    if dt == "float64":
        if not any(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in args):
            pytest.skip("no float32 input")
        args = [_as64(a) for a in args]
        try:
            OPS[name].shape_rule(*[Spec(a.shape, a.dtype) if isinstance(a, np.ndarray)
                                   else a for a in args], **s.attrs)
        except sampan.SampanError:
            pytest.skip("the op does not take float64 inputs")
    if dt == "int64":
        if name in RANDOM or not any(isinstance(a, np.ndarray) and a.dtype == np.float32
                                     for a in args):
            pytest.skip("no float32 input")
        args = [_as_int(a) for a in args]
        try:
            rule = OPS[name].shape_rule(*[Spec(a.shape, a.dtype) for a in args], **s.attrs)
            with np.errstate(all="ignore"):
                want = OPS[name].kernel(*args, **s.attrs)
        except Exception:  # noqa: BLE001
            pytest.skip("the op does not take int64 inputs")
        rule = rule if isinstance(rule, (list, tuple)) else [rule]
        if [np.dtype(r.dtype) for r in rule] != [np.asarray(w).dtype for w in (
                want if isinstance(want, tuple) else (want,))]:
            pytest.skip("the op's shape rule and kernel disagree on the int64 output dtype")
    try:
        model = _one_node(name, args, s.attrs)
    except sampan.onnx.OnnxError as e:
        if dt != "sample" and "cannot be written" in str(e):   # e.g. float64 quantisation
            pytest.skip(str(e))
        raise
    with np.errstate(all="ignore"):
        want = OPS[name].kernel(*args, **s.attrs)
    _compare(name, _run(model, args), want, args, s.attrs)


@pytest.mark.parametrize("name,i", COMP_CASES)
def test_composite_round_trip(name, i):
    fn, samples = COMPOSITES[name]
    s = samples()[i]
    ts = [wrap(a.copy()) if isinstance(a, np.ndarray) else a for a in s.args]
    pos = [k for k, a in enumerate(s.args) if isinstance(a, np.ndarray)]

    def call(*xs):
        full = list(ts)
        for k, x in zip(pos, xs):
            full[k] = x
        return fn(*full, **s.attrs)
    try:
        model = to_model(call, tuple(ts[k] for k in pos))
    except sampan.onnx.OnnxError as e:
        if "has no ONNX mapping" in str(e) or "cannot be written" in str(e):
            pytest.skip(str(e))
        raise
    check(model)
    want = call(*[ts[k] for k in pos])
    want = [w.numpy() for w in (want if isinstance(want, (tuple, list)) else [want])]
    _compare(name, _run(model, [s.args[k] for k in pos]), want)


def _string_problems():
    """A string in the op table must be an ONNX op that takes the op's inputs and no
    attributes: no sample of the op has attributes, and the ONNX schema needs none."""
    bad = []
    for name, op in sorted(OPS.items()):
        if not isinstance(op.onnx, str) or op.onnx == NO_ONNX:
            continue
        try:
            schema = onnx.defs.get_schema(op.onnx, MIN_OPSET)
        except Exception:  # noqa: BLE001
            bad.append(f"{name}: {op.onnx!r} is no ONNX op")
            continue
        if any(a.required for a in schema.attributes.values()):
            bad.append(f"{name}: {op.onnx} has required attributes")
        if any(s.attrs for s in op.samples()):
            bad.append(f"{name}: the op has attributes; {op.onnx} takes none")
            continue
        for s in op.samples():    # ONNX's shape inference must give the op's own result
            want = OPS[name].shape_rule(*[Spec(a.shape, a.dtype) for a in s.args])
            want = list(want) if isinstance(want, (list, tuple)) else [want]
            got = _onnx_shapes(op.onnx, s.args, len(want))
            if got != [(tuple(w.shape), np.dtype(w.dtype)) for w in want]:
                bad.append(f"{name}: {op.onnx} gives {got} on a sample; the op gives {want}")
                break
    return bad


def _onnx_shapes(op_type, args, n_out):
    from onnx import helper
    ins = [helper.make_tensor_value_info(f"in{i}", onnx_dtype(a.dtype), a.shape)
           for i, a in enumerate(args)]
    node = helper.make_node(op_type, [i.name for i in ins], [f"o{k}" for k in range(n_out)])
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info(
        f"o{k}", 0, None) for k in range(n_out)])
    oid = helper.make_opsetid("", MIN_OPSET)
    try:
        m = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[oid]),
                                              strict_mode=True)
    except Exception as e:  # noqa: BLE001
        return [f"an error: {str(e)[:80]}"]
    out = []
    for o in m.graph.output:
        t = o.type.tensor_type
        dims = tuple(d.dim_value for d in t.shape.dim) if t.HasField("shape") else None
        out.append((dims, helper.tensor_dtype_to_np_dtype(t.elem_type) if t.elem_type else None))
    return out


def test_string_mappings_are_valid():
    bad = _string_problems()
    assert not bad, "\n".join(bad)


def test_the_table_checks_catch_a_missing_or_wrong_mapping(monkeypatch):
    from tests.ops.test_op_table import test_table_is_complete
    monkeypatch.setattr(OPS["relu"], "onnx", None)
    with pytest.raises(AssertionError, match="relu: no ONNX mapping"):
        test_table_is_complete()
    monkeypatch.setattr(OPS["relu"], "onnx", "Relux")
    assert _string_problems() == ["relu: 'Relux' is no ONNX op"]
    monkeypatch.setattr(OPS["relu"], "onnx", "ReduceSum")   # another result shape
    monkeypatch.setattr(OPS["cumsum"], "onnx", "CumSum")    # cumsum has an axis attribute
    bad = _string_problems()
    assert len(bad) == 2 and bad[0].startswith("cumsum: the op has attributes")
    assert bad[1].startswith("relu: ReduceSum gives")
