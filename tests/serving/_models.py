"""Models the serving tests serve: a small saved MLP (a real program with a symbolic
batch dim), and Python `ServedModel`s whose timing the tests control."""
from __future__ import annotations

import json
import os
import threading
import time

import numpy as np

from sampan.serving.model import ServedModel, TensorSpec, register_kind


def save_mlp(folder):
    """A 12 -> 32 -> 5 MLP saved with a dynamic batch dim (and exported to ONNX in the
    model directory `folder`/mlp_ort, kind "onnxruntime"); returns (path, weights),
    weights as float64 copies for the numpy reference."""
    import sampan
    from sampan import nn
    sampan.manual_seed(3)
    net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 5))
    net.eval()
    path = sampan.jit.save(net, os.path.join(folder, "mlp.sampan"),
                           (sampan.tensor(np.zeros((2, 12), np.float32)),),
                           dynamic={"x": {0: "batch"}})
    ort = os.path.join(folder, "mlp_ort")
    os.makedirs(ort)
    sampan.onnx.export(net, (sampan.tensor(np.zeros((2, 12), np.float32)),),
                       os.path.join(ort, "mlp.onnx"), input_names=["x"],
                       dynamic_axes={"x": {0: "batch"}})
    with open(os.path.join(ort, "config.json"), "w") as f:
        json.dump({"kind": "onnxruntime", "instance_count": 1}, f)
    w = [(net[k].weight.numpy().astype(np.float64), net[k].bias.numpy().astype(np.float64))
         for k in (0, 2)]
    return path, w


def mlp_reference(w, x):
    h = np.maximum(x.astype(np.float64) @ w[0][0] + w[0][1], 0)
    return h @ w[1][0] + w[1][1]


def model_dir(folder, name, program, **config):
    """A model directory whose config.json points at `program`."""
    d = os.path.join(folder, name)
    os.makedirs(d, exist_ok=True)
    config.setdefault("path", os.path.relpath(program, d))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    return d


class Slow(ServedModel):
    """y = 2x after `delay` seconds; counts the rows it ran."""

    def __init__(self, name="slow", delay=0.2, **config):
        super().__init__(name=name, inputs=[TensorSpec("x", "FP32", (-1, 4))],
                         outputs=[TensorSpec("y", "FP32", (-1, 4))], max_batch_size=8,
                         config=config)
        self.delay = delay
        self.rows_run = 0
        self._lock = threading.Lock()

    def infer(self, inputs):
        time.sleep(self.delay)
        x = inputs["x"]
        with self._lock:
            self.rows_run += len(x)
        return {"y": x * 2}


class Mixed(ServedModel):
    """Two inputs of different datatypes, no batch dim: ids INT64[3], w FP64[3, 2];
    outputs s FP64[2] = ids @ w and flag BOOL[3] = ids > 0."""

    def __init__(self, name="mixed"):
        super().__init__(name=name,
                         inputs=[TensorSpec("ids", "INT64", (3,)),
                                 TensorSpec("w", "FP64", (3, 2))],
                         outputs=[TensorSpec("s", "FP64", (2,)),
                                  TensorSpec("flag", "BOOL", (3,))],
                         max_batch_size=0, version="7", platform="python")

    def infer(self, inputs):
        return {"s": inputs["ids"].astype(np.float64) @ inputs["w"],
                "flag": inputs["ids"] > 0}

    def metadata(self):
        return {"snapshot_sequence": 42}


@register_kind("test_sleepy")
def _sleepy(name, directory, config):
    m = Slow(name, float(config.get("delay", 0.3)))
    m.config = config
    return m
