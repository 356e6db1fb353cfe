"""User model classes the custom-model tests serve by ``pkg.module:Class`` (this module is
importable as ``tests.serving._custom_classes``)."""
import threading

import numpy as np


class Scale:
    """y = x * scale (scale from config, default 2), batched: rows of 4 FP32; raises on a
    negative input, as a user's bug would."""
    inputs = [{"name": "x", "datatype": "FP32", "dims": [4]}]
    outputs = [{"name": "y", "datatype": "TYPE_FP32", "dims": [4]},
               {"name": "n", "datatype": "INT64", "dims": []}]
    max_batch_size = 3
    dynamic_batching = {"max_queue_delay_us": 2_000_000, "delay_policy": "fixed"}
    calls: list = []                # the row counts infer was called with, all instances
    _lock = threading.Lock()

    def load(self, config):
        self.scale = float(config.get("scale", 2.0))

    def infer(self, inputs):
        x = inputs["x"]
        with self._lock:
            type(self).calls.append(len(x))
        if (x < 0).any():
            raise ValueError("negative input")
        return {"y": x * self.scale, "n": np.full(len(x), len(x))}   # float64 -> FP32


class Unbatched:
    """s = sum(a) + b, no batch dim: a INT32[2, 3], b FP64[] (a scalar)."""
    inputs = [{"name": "a", "datatype": "INT32", "shape": [2, 3]},
              {"name": "b", "datatype": "FP64", "shape": []}]
    outputs = [{"name": "s", "datatype": "FP64", "shape": [-1]}]

    def infer(self, inputs):
        return {"s": np.atleast_1d(inputs["a"].sum() + inputs["b"])}


class NoInfer:
    inputs = outputs = [{"name": "x", "datatype": "FP32", "dims": [1]}]


class Affine:
    """y = 2x + 1 over rows of 3 FP32 (one input, one output), batched."""
    inputs = [{"name": "x", "datatype": "FP32", "dims": [3]}]
    outputs = [{"name": "y", "datatype": "FP32", "dims": [3]}]
    max_batch_size = 8

    def infer(self, inputs):
        return {"y": inputs["x"] * 2 + 1}


class Pair:
    """Two inputs, two outputs, batched: a FP32[2], k INT64[] -> s FP64[] = sum(a) * k,
    d FP32[2] = a - k."""
    inputs = [{"name": "a", "datatype": "FP32", "dims": [2]},
              {"name": "k", "datatype": "INT64", "dims": []}]
    outputs = [{"name": "s", "datatype": "FP64", "dims": []},
               {"name": "d", "datatype": "FP32", "dims": [2]}]
    max_batch_size = 8

    def infer(self, inputs):
        a, k = inputs["a"], inputs["k"]
        return {"s": a.astype(np.float64).sum(1) * k, "d": a - k[:, None]}
