"""`sampan onnx import` and `sampan onnx check`: run through `sampan.cli.main` (and once as
a process), on a hand-built model and on one PyTorch exported."""
import io
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import sampan  # noqa: E402
from sampan.cli import main  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def small(tmp_path):
    """x[N,3] -> (x, shape(x), w): symbolic batch, an initializer, an int64 output."""
    w = numpy_helper.from_array(np.arange(3, dtype=np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Identity", ["w"], ["wo"])], "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("wo", TensorProto.FLOAT, [3])], [w])
    p = tmp_path / "small.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    return str(p)


@pytest.fixture
def mlp(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m.eval(), (torch.randn(2, 6),), f, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    p = tmp_path / "mlp.onnx"
    p.write_bytes(f.getvalue())
    return str(p), m


def test_check_prints_each_output_error(small, capsys):
    assert main(["onnx", "check", small]) == 0
    out = capsys.readouterr().out
    for name in ("y: float32[2, 3]", "s: int64[2]", "wo: float32[3]"):   # symbolic N = 2
        assert name in out and "max abs error 0" in out
    assert main(["onnx", "check", small, "--dim", "N=5"]) == 0
    assert "y: float32[5, 3]" in capsys.readouterr().out


def test_check_fails_over_the_tolerance(small, capsys, monkeypatch):
    from sampan.onnx import ops
    key = ("", "Identity")
    wrong = [(1, lambda ctx, node, x: x * 1.001)]      # an importer bug: off by 0.1%
    monkeypatch.setitem(ops.HANDLERS, key, wrong)
    assert main(["onnx", "check", small]) == 1
    out = capsys.readouterr().out
    assert "> tolerance" in out and out.strip().splitlines()[-1].startswith("FAIL")
    assert main(["onnx", "check", small, "--tol", "0.01"]) == 0


def test_bad_files_are_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07 not a model")
    for args in (["onnx", "check", str(bad)], ["onnx", "import", str(bad), "-o",
                                                str(tmp_path / "o")],
                 ["onnx", "check", str(tmp_path / "missing.onnx")]):
        assert main(args) == 1
        err = capsys.readouterr().err
        assert err.startswith("sampan onnx ") and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_bad_dim_option(small, capsys):
    assert main(["onnx", "check", small, "--dim", "N"]) == 1
    assert "NAME=SIZE" in capsys.readouterr().err


def test_import_writes_a_program_with_symbolic_dims(small, tmp_path, capsys):
    out = str(tmp_path / "small.sampan")
    assert main(["onnx", "import", small, "-o", out]) == 0
    assert "symbolic dims N" in capsys.readouterr().out
    prog = sampan.jit.load(out)
    for n in (1, 4):
        x = np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)
        y, s, w = prog(sampan.tensor(x))
        np.testing.assert_array_equal(y.numpy(), x)
        assert s.numpy().tolist() == [n, 3] and w.numpy().tolist() == [0, 1, 2]


def test_pytorch_mlp_import_and_check(mlp, tmp_path, capsys):
    path, m = mlp
    assert main(["onnx", "check", path, "--tol", "1e-5"]) == 0
    out = str(tmp_path / "mlp.sampan")
    assert main(["onnx", "import", path, "-o", out]) == 0
    prog = sampan.jit.load(out)
    import torch
    for n in (2, 7):
        x = np.random.default_rng(n).standard_normal((n, 6)).astype(np.float32)
        with torch.no_grad():
            want = m(torch.from_numpy(x)).numpy()
        assert np.abs(prog(sampan.tensor(x)).numpy() - want).max() <= 1e-5


def test_as_a_process(small):
    env = {**os.environ, "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "-m", "sampan.cli", "onnx", "check", small],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("ok: 3 outputs")


def test_import_then_export_round_trip(mlp, tmp_path, capsys):
    """ONNX (PyTorch's) -> saved sampan program -> ONNX (sampan's) runs in onnxruntime
    and matches sampan at another batch size."""
    path, m = mlp
    prog, again = str(tmp_path / "mlp.sampan"), str(tmp_path / "again.onnx")
    assert main(["onnx", "import", path, "-o", prog]) == 0
    # opset 17: export's default is the newest onnxruntime runs (28 here), past what the
    # importer reads (MAX_OPSET 23)
    assert main(["onnx", "export", prog, "-o", again, "--opset", "17"]) == 0
    capsys.readouterr()
    assert main(["onnx", "check", again, "--tol", "1e-5", "--dim", "batch=5"]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("ok: 1 outputs")
    assert "float32[5, 2]" in out      # the symbolic batch survived both ways
