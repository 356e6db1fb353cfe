"""Export errors (an op with no ONNX mapping, an opset out of range), external data and
the `sampan onnx export` command."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import sampan
import sampan.onnx
from sampan import nn

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _inverse(x):
    return sampan.linalg.inv(x) + 1     # linalg_inv has no ONNX op


def test_op_without_mapping_names_op_line_and_opset(tmp_path):
    with pytest.raises(sampan.onnx.OnnxError) as e:
        sampan.onnx.export(_inverse, (sampan.randn(3, 3),), tmp_path / "m.onnx", opset=18)
    msg = str(e.value)
    assert "'linalg_inv'" in msg and "opset 18" in msg
    assert "test_export_errors.py:" in msg       # the user's source line
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("opset", [16, 10_000, "18", 18.0])
def test_opset_out_of_range(tmp_path, opset):
    with pytest.raises(sampan.onnx.OnnxError, match="opset"):
        sampan.onnx.export(nn.Linear(2, 2), (sampan.randn(1, 2),), tmp_path / "m.onnx",
                           opset=opset)


def test_every_supported_opset_and_the_default(tmp_path):
    from sampan.onnx.export import default_opset, max_opset
    assert 17 <= default_opset() <= max_opset() == onnx.defs.onnx_opset_version()
    m = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.LayerNorm(4))
    m.eval()
    x = sampan.randn(2, 3)
    for opset in range(17, max_opset() + 1):
        mp = sampan.onnx.export(m, (x,), tmp_path / f"m{opset}.onnx", opset=opset)
        assert mp.opset_import[0].version == opset
        if opset <= default_opset():
            s = ort.InferenceSession(str(tmp_path / f"m{opset}.onnx"),
                                     providers=["CPUExecutionProvider"])
            y = s.run(None, {s.get_inputs()[0].name: x.numpy()})[0]
            np.testing.assert_allclose(y, m(x).numpy(), atol=1e-5)


def test_external_data_above_the_threshold(tmp_path):
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    m.eval()
    x = sampan.randn(4, 8)
    path = tmp_path / "big.onnx"
    sampan.onnx.export(m, (x,), path, external_data_threshold=256)
    assert (tmp_path / "big.onnx.data").exists()
    assert os.path.getsize(path) < 2000          # the weights live in the .data file
    onnx.checker.check_model(str(path), full_check=True)
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    y = s.run(None, {s.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(y, m(x).numpy(), atol=1e-5)
    assert not [f for f in os.listdir(tmp_path) if ".tmp-" in f]   # no temporaries left


def test_cli_exports_a_saved_program(tmp_path):
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    m.eval()
    x = sampan.randn(5, 4)
    prog = tmp_path / "m.sampan"
    sampan.jit.save(m, prog, (x,), dynamic="batch")
    out = tmp_path / "m.onnx"
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(sampan.__file__)))
    r = subprocess.run([sys.executable, "-m", "sampan.cli", "onnx", "export", str(prog),
                        "-o", str(out), "--opset", "18"], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert str(out) in r.stdout
    s = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for n in (5, 2):
        xn = sampan.randn(n, 4)
        y = s.run(None, {s.get_inputs()[0].name: xn.numpy()})[0]
        np.testing.assert_allclose(y, m(xn).numpy(), atol=1e-5)
    bad = subprocess.run([sys.executable, "-m", "sampan.cli", "onnx", "export",
                          str(tmp_path / "missing"), "-o", str(out)], capture_output=True,
                         text=True, env=env)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr


def test_dynamic_axes_naming_no_input(tmp_path):
    with pytest.raises(sampan.onnx.OnnxError, match="'y'"):
        sampan.onnx.export(nn.Linear(2, 2), (sampan.randn(1, 2),), tmp_path / "m.onnx",
                           dynamic_axes={"y": {0: "batch"}})


def test_input_and_output_names_and_list_dynamic_axes(tmp_path):
    m = nn.Linear(2, 3)
    mp = sampan.onnx.export(m, (sampan.randn(4, 2),), tmp_path / "m.onnx",
                            input_names=["features"], output_names=["scores"],
                            dynamic_axes={"features": [0], "scores": [0]})
    assert [i.name for i in mp.graph.input] == ["features"]
    assert [o.name for o in mp.graph.output] == ["scores"]
    assert mp.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "features_dim0"
    with pytest.raises(sampan.onnx.OnnxError, match="input_names"):
        sampan.onnx.export(m, (sampan.randn(4, 2),), tmp_path / "m.onnx", input_names=["a", "b"])
