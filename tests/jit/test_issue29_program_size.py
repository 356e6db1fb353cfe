"""Issue 29 item 13: an inference program stores each weight once and no gradients, so
its weights file is about the size of the model's parameters; programs written the old
way (state inputs and their .grad beside the frozen constants) still load."""
from __future__ import annotations

import json
import os
import pathlib
import shutil

import numpy as np

import sampan
import sampan.nn as nn

DATA = pathlib.Path(__file__).parent / "data"
HEADER = 4096     # the safetensors header (JSON: a name, dtype, shape, offsets per array)


def _param_bytes(m):
    return sum(p._data.nbytes for _, p in m.named_parameters())


def _weights_bytes(path):
    return os.path.getsize(os.path.join(path, "weights.safetensors"))


def _check(m, x, path, extra=0):
    m(x).sum().backward()     # parameters now carry .grad, as after training
    m.eval()
    want = m(x).numpy()
    p = sampan.jit.save(m, path, (x,))
    meta = json.load(open(os.path.join(p, "meta.json")))
    assert [s["kind"] for s in meta["inputs"]] == ["arg"], meta["inputs"]
    assert not any(".grad" in k for k in meta["dtypes"]), meta["dtypes"]
    size, params = _weights_bytes(p), _param_bytes(m)
    assert size <= 1.1 * params + x._data.nbytes + extra + HEADER, (size, params)
    got = sampan.jit.load(p)(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    return size, params


def test_inference_mlp_stores_each_weight_once(tmp_path):
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    size, params = _check(m, sampan.randn(2, 64), str(tmp_path / "mlp.sampan"))
    assert size >= 0.95 * params      # the weights are all there


def test_inference_cnn_with_batch_norm_stores_each_weight_once(tmp_path):
    sampan.manual_seed(1)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                      nn.Linear(16 * 6 * 6, 10))
    m.train()
    m(sampan.randn(4, 3, 6, 6))     # running statistics that are not the defaults
    _check(m, sampan.randn(2, 3, 6, 6), str(tmp_path / "cnn.sampan"))


def test_training_step_program_keeps_its_state(tmp_path):
    # state the program writes stays an input (and an output): only unread inputs go
    sampan.manual_seed(2)
    w = sampan.randn(3, 3)

    def step(x):
        w.add_(x.sum(0))
        return (x @ w).sum()
    x = sampan.randn(3, 3)
    p = sampan.jit.save(step, str(tmp_path / "step.sampan"), (x,))
    meta = json.load(open(os.path.join(p, "meta.json")))
    assert [s["kind"] for s in meta["inputs"]].count("state") == 1


def test_a_version_2_program_with_grad_inputs_still_loads(tmp_path):
    # written by sampan.jit.save of main on 2026-12-01 for a 4-5-2 MLP whose parameters
    # had .grad: state and grad inputs, unread, beside the frozen constants
    path = tmp_path / "v2_grads_program"
    shutil.copytree(DATA / "v2_grads_program", path)
    m = sampan.jit.load(str(path))
    assert m.meta["version"] == 2
    assert [s["kind"] for s in m.meta["inputs"]].count("grad") == 4
    want = np.load(DATA / "v2_grads_program.expected.npy")
    got = m(*m.example_inputs).numpy()
    assert got.tobytes() == want.tobytes()


def test_prune_report_bytes_and_int8_ratio_are_the_weights(tmp_path):
    sampan.manual_seed(3)
    m = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    x = sampan.randn(2, 64)
    m(x).sum().backward()
    m.eval()
    params = _param_bytes(m)
    row = sampan.prune.measure({"m": m}, (x,), repeats=3, warmup=1)["m"]
    # the whole folder: weights once, graph text, meta.json and checksums
    assert row["bytes"] <= 1.1 * params + x._data.nbytes + 4 * HEADER, (row["bytes"], params)
    f32 = sampan.jit.save(m, str(tmp_path / "f32.sampan"), (x,))
    wo = sampan.quant.quantize_program(f32, None, str(tmp_path / "wo.sampan"), weight_only=True)
    ratio = _weights_bytes(wo) / _weights_bytes(f32)
    assert 0.2 <= ratio <= 0.3, ratio       # int8 weights + per-channel scales: about 1/4
