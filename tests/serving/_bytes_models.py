"""Custom models over BYTES tensors for tests/serving/test_bytes.py (importable as
``tests.serving._bytes_models``)."""
import threading

import numpy as np


class Upper:
    """upper = each string upper-cased, length = its byte count; batched (rows of one
    string each). Records the dtype and element types it was given."""
    inputs = [{"name": "text", "datatype": "BYTES", "dims": [1]}]
    outputs = [{"name": "upper", "datatype": "TYPE_STRING", "dims": [1]},
               {"name": "length", "datatype": "INT32", "dims": [1]}]
    max_batch_size = 8
    dynamic_batching = {"max_queue_delay_us": 200_000, "delay_policy": "fixed",
                        "preferred_batch_sizes": [4]}
    seen: list = []
    _lock = threading.Lock()

    def infer(self, inputs):
        t = inputs["text"]
        with self._lock:
            type(self).seen.append((t.dtype, {type(v) for v in t.ravel().tolist()}, len(t)))
        up = np.empty(t.shape, object)
        up.ravel()[:] = [v.upper() for v in t.ravel().tolist()]
        return {"upper": up,
                "length": np.array([[len(v) for v in row] for row in t.tolist()], np.int32)}


class Echo:
    """s as it came, returned as a numpy str array (the server sends its UTF-8 bytes);
    no batch dim."""
    inputs = [{"name": "s", "datatype": "BYTES", "shape": [-1]}]
    outputs = [{"name": "s", "datatype": "BYTES", "shape": [-1]}]

    def infer(self, inputs):
        return {"s": np.array([v.decode("utf-8", "replace") for v in inputs["s"].tolist()])}


class Raw:
    """s as it came (any bytes, not only UTF-8); no batch dim."""
    inputs = [{"name": "s", "datatype": "BYTES", "shape": [-1]}]
    outputs = [{"name": "s", "datatype": "BYTES", "shape": [-1]}]

    def infer(self, inputs):
        return {"s": inputs["s"]}
