"""The model repository (`--model-repository DIR`): index, load, unload over HTTP and
gRPC; names confined to DIR; a model that fails to load is reported and does not stop the
others; load/unload refused without --allow-model-control; unload waits for the model's
in-flight requests."""
import concurrent.futures
import json
import os
import shutil
import threading
import time

import httpx
import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

from ._models import mlp_reference, save_mlp  # noqa: E402  (registers kind test_sleepy)


def _write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """DIR: mlp (a saved program), mlp_onnx (an ONNX file, nothing else), sleepy (a slow
    Python model), broken (config.json and no program), escape (a symlink to a model
    folder outside DIR)."""
    base = tmp_path_factory.mktemp("repo")
    src = base / "src"
    src.mkdir()
    prog, w = save_mlp(str(src))
    root = base / "models"
    root.mkdir()
    shutil.copytree(prog, root / "mlp")
    (root / "mlp_onnx").mkdir()
    shutil.copy(src / "mlp_ort" / "mlp.onnx", root / "mlp_onnx" / "mlp.onnx")
    (root / "sleepy").mkdir()
    _write(root / "sleepy" / "config.json", {"kind": "test_sleepy", "delay": 0.3,
                                             "instance_count": 1})
    (root / "broken").mkdir()
    _write(root / "broken" / "config.json", {"kind": "program", "path": "missing.sampan"})
    os.symlink(src / "mlp_ort", root / "escape")
    return root, w


@pytest.fixture(scope="module")
def server(repo):
    from sampan.serving import Server
    s = Server(model_repository=str(repo[0]), allow_model_control=True, grpc_port=0,
               warmup=False).start()
    yield s
    s.stop()


def _index(server):
    r = httpx.post(f"{server.url}/v2/repository/index")
    assert r.status_code == 200
    return {m["name"]: m for m in r.json()}


def _x(rows=2):
    return np.random.default_rng(rows).standard_normal((rows, 12)).astype(np.float32)


def _infer_http(server, model, x):
    c = httpclient.InferenceServerClient(server.url[len("http://"):])
    i = httpclient.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    r = c.infer(model, [i])
    return r.as_numpy(r.get_response()["outputs"][0]["name"])


def test_index_lists_every_folder_and_a_failure_stops_no_other(server, repo):
    idx = _index(server)
    assert set(idx) == {"mlp", "mlp_onnx", "sleepy", "broken", "escape"}
    for name in ("mlp", "mlp_onnx", "sleepy"):
        assert (idx[name]["state"], idx[name]["version"]) == ("READY", "1")
    assert idx["broken"]["state"] == "UNAVAILABLE"
    assert "missing.sampan" in idx["broken"]["reason"]
    assert idx["escape"]["state"] == "UNAVAILABLE" and "outside" in idx["escape"]["reason"]
    # the ONNX folder without config.json is served by onnxruntime, the program as is
    x = _x()
    for name in ("mlp", "mlp_onnx"):
        np.testing.assert_allclose(_infer_http(server, name, x), mlp_reference(repo[1], x),
                                   rtol=1e-4, atol=1e-4)
    g = grpcclient.InferenceServerClient(server.grpc_address)
    gidx = {m.name: m for m in g.get_model_repository_index().models}
    assert {n: (m.state, m.reason) for n, m in gidx.items()} == {
        n: (m["state"], m["reason"]) for n, m in idx.items()}
    ready = httpx.post(f"{server.url}/v2/repository/index", json={"ready": True}).json()
    assert {m["name"] for m in ready} == {"mlp", "mlp_onnx", "sleepy"}
    assert "model_repository" in httpx.get(f"{server.url}/v2").json()["extensions"]


def test_unload_then_load_over_http_and_grpc(server, repo):
    http = httpclient.InferenceServerClient(server.url[len("http://"):])
    g = grpcclient.InferenceServerClient(server.grpc_address)
    http.unload_model("mlp_onnx")
    assert _index(server)["mlp_onnx"]["state"] == "UNAVAILABLE"
    assert _index(server)["mlp_onnx"]["reason"] == "unloaded"
    with pytest.raises(InferenceServerException) as e:
        _infer_http(server, "mlp_onnx", _x())
    assert e.value.status() == "404"
    g.load_model("mlp_onnx")
    assert g.is_model_ready("mlp_onnx") and _index(server)["mlp_onnx"]["state"] == "READY"
    x = _x(3)
    np.testing.assert_allclose(_infer_http(server, "mlp_onnx", x), mlp_reference(repo[1], x),
                               rtol=1e-4, atol=1e-4)
    g.unload_model("mlp_onnx")
    assert not http.is_model_ready("mlp_onnx") and not g.is_model_ready("mlp_onnx")
    with pytest.raises(InferenceServerException):          # not in the repository at all
        g.is_model_ready("nosuch")
    http.load_model("mlp_onnx")
    assert http.is_model_ready("mlp_onnx")


def test_names_that_leave_the_repository_are_refused(server):
    for name in ("..", "a..b/../..", "/etc", "../src/mlp_ort", ".hidden"):
        with pytest.raises(InferenceServerException) as e:
            grpcclient.InferenceServerClient(server.grpc_address).load_model(name)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT", name
    r = httpx.post(f"{server.url}/v2/repository/models/../load")
    assert r.status_code in (400, 404)        # a client may fold the '..' itself
    r = httpx.post(f"{server.url}/v2/repository/models/%2E%2E/load")
    assert r.status_code in (400, 404) and "escape" not in r.text
    r = httpx.post(f"{server.url}/v2/repository/models/escape/load")
    assert r.status_code == 400 and "outside the repository" in r.json()["error"]
    r = httpx.post(f"{server.url}/v2/repository/models/nosuch/load")
    assert r.status_code == 404 and "no model folder 'nosuch'" in r.json()["error"]


def test_a_failed_load_is_reported_and_keeps_what_serves(server):
    g = grpcclient.InferenceServerClient(server.grpc_address)
    with pytest.raises(InferenceServerException) as e:
        g.load_model("broken")
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "failed to load model 'broken'" in e.value.message()
    assert _index(server)["broken"]["state"] == "UNAVAILABLE"
    # a reload that fails leaves the served model in place
    with pytest.raises(InferenceServerException) as e:
        g.load_model("mlp", config=json.dumps({"kind": "no_such_kind"}))
    assert "no_such_kind" in e.value.message()
    assert _index(server)["mlp"]["state"] == "READY" and g.is_model_ready("mlp")
    r = httpx.post(f"{server.url}/v2/repository/models/mlp/load",
                   json={"parameters": {"files": "x"}})
    assert r.status_code == 400 and "unknown parameter 'files'" in r.json()["error"]


def test_unload_waits_for_in_flight_requests(server):
    """Requests queued and running on the slow model when its unload arrives are all
    answered 200; the unload returns after them; requests after it get 404."""
    e = server.entries["sleepy"]

    def call():
        r = httpx.post(f"{server.url}/v2/models/sleepy/infer", timeout=30, json={
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]})
        return r.status_code
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(call) for _ in range(3)]
        t_end = time.monotonic() + 10
        while e.batcher.depth() < 2 and time.monotonic() < t_end:
            time.sleep(0.005)         # one running (one worker), two queued
        assert e.batcher.depth() == 2 and e.model.rows_run == 0
        done = {}

        def unload():
            t0 = time.monotonic()
            grpcclient.InferenceServerClient(server.grpc_address).unload_model("sleepy")
            done["waited"], done["rows"] = time.monotonic() - t0, e.model.rows_run
        t = threading.Thread(target=unload)
        t.start()
        late = []
        while t.is_alive():           # load during the unload: never a hang or a 500
            try:
                late.append(httpx.post(f"{server.url}/v2/models/sleepy/infer", timeout=30,
                                       json={"inputs": [{"name": "x", "datatype": "FP32",
                                                         "shape": [1, 4],
                                                         "data": [1] * 4}]}).status_code)
            except httpx.HTTPError:
                late.append("error")
            time.sleep(0.02)
        t.join()
        answers = [f.result() for f in futs]
    assert answers == [200, 200, 200]
    # it returned once the model had run all three: two of 0.3 s each after it was called
    assert done["rows"] == 3 and done["waited"] >= 0.5
    assert set(late) <= {200, 404, 503}, late
    assert _index(server)["sleepy"]["state"] == "UNAVAILABLE"
    assert "sleepy" not in server.entries
    grpcclient.InferenceServerClient(server.grpc_address).load_model("sleepy")


def test_control_is_refused_without_the_flag(tmp_path):
    from sampan.serving import Server
    (tmp_path / "sleepy").mkdir()
    _write(tmp_path / "sleepy" / "config.json", {"kind": "test_sleepy", "delay": 0.01})
    with Server(model_repository=str(tmp_path), grpc_port=0, warmup=False) as s:
        assert [m["state"] for m in _index(s).values()] == ["READY"]
        r = httpx.post(f"{s.url}/v2/repository/models/sleepy/unload")
        assert r.status_code == 403 and "--allow-model-control" in r.json()["error"]
        with pytest.raises(InferenceServerException) as e:
            grpcclient.InferenceServerClient(s.grpc_address).load_model("sleepy")
        assert e.value.status() == "StatusCode.PERMISSION_DENIED"
        assert "sleepy" in s.entries


@pytest.mark.slow   # trains the demo DLRM (~2 s on a loaded machine)
def test_a_dlrm_snapshot_folder_is_served_from_the_repository(tmp_path):
    from sampan.serving import Server
    from sampan.serving.rec import demo_inputs, export_demo_dlrm
    export_demo_dlrm(str(tmp_path / "ctr"))
    with Server(model_repository=str(tmp_path), grpc_port=0, warmup=False) as s:
        assert [(m["name"], m["state"]) for m in _index(s).values()] == [("ctr", "READY")]
        c = grpcclient.InferenceServerClient(s.grpc_address)
        ins = []
        for k, v in demo_inputs(3).items():
            i = grpcclient.InferInput(k, list(v.shape), "INT64" if v.dtype.kind == "i"
                                      else "FP32")
            i.set_data_from_numpy(v)
            ins.append(i)
        p = c.infer("ctr", ins).as_numpy("probability")
        assert p.shape == (3, 1) and ((p > 0) & (p < 1)).all()
