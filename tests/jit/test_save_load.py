"""save -> load in a fresh process is bit for bit; damaged saves give a clear error."""
import os
import subprocess
import sys

import numpy as np
import pytest

import sampan
from sampan import nn


def _model():
    sampan.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 300), nn.ReLU(), nn.Linear(300, 4))


@pytest.fixture
def saved(tmp_path):
    m = _model()
    m.eval()
    x = sampan.randn(7, 5)
    path = str(tmp_path / "model.sampan")
    sampan.jit.save(m, path, (x,))
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", m(x).numpy())
    return tmp_path, path


def test_save_load_fresh_process_bit_for_bit(saved):
    tmp, path = saved
    code = ("import numpy as np, sampan, sys\n"
            "m = sampan.jit.load(sys.argv[1])\n"
            "y = m(sampan.from_numpy(np.load(sys.argv[2])))\n"
            "np.save(sys.argv[3], y.numpy())\n")
    subprocess.run([sys.executable, "-c", code, path, str(tmp / "x.npy"), str(tmp / "out.npy")],
                   check=True, cwd=str(tmp))
    a, b = np.load(tmp / "out.npy"), np.load(tmp / "y.npy")
    assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    assert sorted(os.listdir(path)) == ["checksums.sha256", "graph.ir", "meta.json",
                                        "weights.safetensors"]
    assert not [p for p in os.listdir(tmp) if ".tmp-" in p]


def test_load_in_process_and_example_inputs(saved):
    tmp, path = saved
    m = sampan.jit.load(path)
    y = m(*m.example_inputs)
    assert y.numpy().tobytes() == np.load(tmp / "y.npy").tobytes()


@pytest.mark.parametrize("damage", ["weights", "graph", "meta", "missing", "truncated"])
def test_damaged_save_gives_clear_error(saved, damage):
    _, path = saved
    if damage == "weights":
        p = os.path.join(path, "weights.safetensors")
        b = bytearray(open(p, "rb").read())
        b[-10] ^= 0xFF
        open(p, "wb").write(bytes(b))
        match = "weights.safetensors is damaged"
    elif damage == "graph":
        p = os.path.join(path, "graph.ir")
        open(p, "a").write("  %99: f32[2] = relu(%98)\n")
        match = "graph.ir is damaged"
    elif damage == "meta":
        open(os.path.join(path, "meta.json"), "w").write("{not json")
        match = "meta.json is damaged"
    elif damage == "missing":
        os.remove(os.path.join(path, "weights.safetensors"))
        match = "missing"
    else:
        p = os.path.join(path, "weights.safetensors")
        data = open(p, "rb").read()
        open(p, "wb").write(data[: len(data) // 2])
        match = "damaged"
    with pytest.raises(sampan.jit.LoadError, match=match):
        sampan.jit.load(path)


def test_save_function_with_state_overwrites_atomically(tmp_path):
    w = sampan.randn(3, 2, requires_grad=True)
    path = str(tmp_path / "f")
    f = lambda x: (x @ w).relu()  # noqa: E731
    x = sampan.randn(4, 3)
    sampan.jit.save(f, path, (x,))
    sampan.jit.save(f, path, (x,))   # replaces the old directory
    np.testing.assert_array_equal(sampan.jit.load(path)(x).numpy(), f(x).detach().numpy())
