"""The open inference protocol, spoken by the real client (tritonclient.http)."""
import json
import os

import httpx
import numpy as np
import pytest

http = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

from ._models import mlp_reference  # noqa: E402


@pytest.fixture(scope="module")
def client(served):
    c = http.InferenceServerClient(served.url[len("http://"):])
    yield c
    c.close()


def _x(rows, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, 12)).astype(np.float32)


def test_health_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and client.is_model_ready("mixed", "7")
    meta = client.get_server_metadata()
    assert meta["name"] == "sampan" and "binary_tensor_data" in meta["extensions"]


def test_model_metadata_shapes_and_dtypes(client):
    m = client.get_model_metadata("mlp")
    assert m["name"] == "mlp" and m["versions"] == ["1"]
    assert m["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 12]}]
    assert m["outputs"] == [{"name": "output_0", "datatype": "FP32", "shape": [-1, 5]}]
    m = client.get_model_metadata("mixed", "7")
    assert m["platform"] == "python" and m["snapshot_sequence"] == 42
    assert m["inputs"] == [{"name": "ids", "datatype": "INT64", "shape": [3]},
                           {"name": "w", "datatype": "FP64", "shape": [3, 2]}]
    assert [(o["name"], o["datatype"], o["shape"]) for o in m["outputs"]] == [
        ("s", "FP64", [2]), ("flag", "BOOL", [3])]
    assert client.get_model_config("mlp")["max_batch_size"] == 16


@pytest.mark.parametrize("bin_in,bin_out", [(False, False), (True, True), (True, False),
                                            (False, True)])
def test_infer_json_and_binary(served, client, bin_in, bin_out):
    x = _x(3, int(bin_in) * 2 + bin_out)
    i = http.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=bin_in)
    o = http.InferRequestedOutput("output_0", binary_data=bin_out)
    r = client.infer("mlp_single", [i], outputs=[o], request_id="req-7")
    assert r.get_response()["id"] == "req-7"
    y = r.as_numpy("output_0")
    assert y.dtype == np.float32 and y.shape == (3, 5)
    np.testing.assert_allclose(y, mlp_reference(served.weights, x), rtol=1e-5, atol=1e-5)


def test_infer_default_outputs_are_binary_and_mixed_dtypes(client):
    ids = np.array([1, -2, 3], np.int64)
    w = np.arange(6, dtype=np.float64).reshape(3, 2) / 7
    a = http.InferInput("ids", [3], "INT64")
    a.set_data_from_numpy(ids, binary_data=False)
    b = http.InferInput("w", [3, 2], "FP64")
    b.set_data_from_numpy(w)
    r = client.infer("mixed", [a, b])           # no outputs named: all come back binary
    assert all("binary_data_size" in o["parameters"] for o in r.get_response()["outputs"])
    np.testing.assert_array_equal(r.as_numpy("s"), ids.astype(np.float64) @ w)
    np.testing.assert_array_equal(r.as_numpy("flag"), ids > 0)


def test_nested_json_data_and_curl_style_request(served):
    x = _x(2, 9)
    body = {"id": "n1", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 12],
                                    "data": x.tolist()}]}
    r = httpx.post(served.url + "/v2/models/mlp/infer", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"] == "n1" and out["model_name"] == "mlp"
    (o,) = out["outputs"]
    assert o["shape"] == [2, 5] and o["datatype"] == "FP32"
    np.testing.assert_allclose(np.array(o["data"]).reshape(2, 5),
                               mlp_reference(served.weights, x), rtol=1e-5, atol=1e-5)


def _raises(client, name, inputs, outputs=None):
    with pytest.raises(InferenceServerException) as ei:
        client.infer(name, inputs, outputs=outputs)
    return ei.value


def test_errors_come_back_as_inference_server_exception(client):
    x = _x(1)
    i = http.InferInput("nope", [1, 12], "FP32")
    i.set_data_from_numpy(x)
    e = _raises(client, "mlp", [i])
    assert e.status() == "400" and "unknown input 'nope'" in e.message()
    i = http.InferInput("x", [1, 12], "FP64")
    i.set_data_from_numpy(x.astype(np.float64))
    e = _raises(client, "mlp", [i])
    assert "input 'x'" in e.message() and "FP32" in e.message()
    i = http.InferInput("x", [1, 13], "FP32")
    i.set_data_from_numpy(np.zeros((1, 13), np.float32))
    e = _raises(client, "mlp", [i])
    assert "input 'x'" in e.message() and "[-1, 12]" in e.message()
    a = http.InferInput("ids", [3], "INT64")
    a.set_data_from_numpy(np.ones(3, np.int64))
    e = _raises(client, "mixed", [a])
    assert "missing input" in e.message() and "'w'" in e.message()
    e = _raises(client, "nosuch", [a])
    assert e.status() == "404" and "unknown model 'nosuch'" in e.message()
    i = http.InferInput("x", [1, 12], "FP32")
    i.set_data_from_numpy(x)
    e = _raises(client, "mlp", [i], [http.InferRequestedOutput("zz")])
    assert "unknown output 'zz'" in e.message()
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("nosuch")
    assert not client.is_model_ready("nosuch")


def _post(served, model, body, headers=None):
    return httpx.post(f"{served.url}/v2/models/{model}/infer", content=body,
                      headers=headers or {})


def test_malformed_bodies_answer_400_naming_the_input(served):
    r = _post(served, "mlp", b'{"inputs": [')
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    bad = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 12],
                       "data": [0.0] * 23}]}
    r = _post(served, "mlp", json.dumps(bad).encode())
    assert r.status_code == 400
    assert "input 'x'" in r.json()["error"] and "24 values" in r.json()["error"]
    bad["inputs"][0]["data"] = ["a"] * 24
    r = _post(served, "mlp", json.dumps(bad).encode())
    assert r.status_code == 400 and "input 'x'" in r.json()["error"]
    bad = {"inputs": [{"name": "ids", "datatype": "INT64", "shape": [3],
                       "data": [1.5, 2, 3]}, {"name": "w", "datatype": "FP64",
                                              "shape": [3, 2], "data": [0] * 6}]}
    r = _post(served, "mixed", json.dumps(bad).encode())
    assert r.status_code == 400 and "input 'ids'" in r.json()["error"]
    # binary: the declared size disagrees with the shape, then with the bytes sent
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 12],
                                   "parameters": {"binary_data_size": 40}}]}).encode()
    r = _post(served, "mlp", head + b"\0" * 40,
              {"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 400 and "input 'x'" in r.json()["error"]
    assert "48 bytes" in r.json()["error"]
    head = head.replace(b"40", b"48")
    r = _post(served, "mlp", head + b"\0" * 20,
              {"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 400 and "input 'x'" in r.json()["error"]
    r = _post(served, "mlp", head + b"\0" * 48, {"Inference-Header-Content-Length": "9999"})
    assert r.status_code == 400 and "Inference-Header-Content-Length" in r.json()["error"]


def test_oversized_body_answers_400(served):
    r = _post(served, "mlp", b" " * ((1 << 20) + 10))
    assert r.status_code == 400 and "max_body_bytes" in r.json()["error"]


def test_onnxruntime_kind_serves_the_same_model(served, client):
    m = client.get_model_metadata("mlp_ort")
    assert m["platform"] == "onnxruntime_onnx"
    assert m["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 12]}]
    x = _x(4, 11)
    i = http.InferInput("x", [4, 12], "FP32")
    i.set_data_from_numpy(x)
    r = client.infer("mlp_ort", [i])
    (name,) = [o["name"] for o in m["outputs"]]
    np.testing.assert_allclose(r.as_numpy(name), mlp_reference(served.weights, x),
                               rtol=1e-5, atol=1e-5)


def test_repository_and_cli_overrides(tmp_path, served):
    """A model repository (each subdirectory a model) with the CLI's flags overriding
    config.json."""
    import argparse

    from sampan.serving import Server
    from sampan.serving.cli import overrides_of, register
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    a = ap.parse_args(["serve", "--repository", "r", "--max-batch-size", "4",
                       "--max-queue-delay-us", "300", "--workers", "1"])
    o = overrides_of(a)
    assert o == {"max_batch_size": 4, "dynamic_batching": {"max_queue_delay_us": 300},
                 "instance_count": 1}
    assert overrides_of(ap.parse_args(["serve", "--no-batching"])) == {
        "dynamic_batching": None}
    repo = os.path.dirname(served.entries["mlp"].model.directory)
    s = Server(repository=repo, overrides=o, warmup=False)
    s._build()
    e = s.entries
    assert {"mlp", "mlp_single", "mlp_ort"} <= set(e)
    assert e["mlp_single"].model.max_batch_size == 4 and e["mlp_single"].batcher.batching
    assert e["mlp"].batcher.delay == 300e-6 and e["mlp"].batcher.instances == 1
