"""Custom Python models (issue 32): a user class named as ``pkg.module:Class`` or a
``model.py`` in a repository folder, with load(config)/infer(inputs); declared metadata;
batched by the batcher when the class has a batch dim; a raising request answers 500
alone (the others of its batch get their answers) and is logged; code outside the
repository is never run."""
import asyncio
import json
import logging
import os

import httpx
import numpy as np
import pytest

from sampan.serving import DataPlane, RequestError, Server, ServingError, protocol
from sampan.serving.custom import CustomModel, from_class_ref, is_class_ref

from . import _custom_classes as cc

REF = "tests.serving._custom_classes:Scale"


def _body(name, dt, x):
    return json.dumps({"inputs": [{"name": name, "datatype": dt, "shape": list(x.shape),
                                   "data": x.ravel().tolist()}]}).encode()


def _outputs(out):
    body, _ = out
    return {o["name"]: np.asarray(o["data"]).reshape(o["shape"])
            for o in json.loads(body)["outputs"]}


@pytest.fixture
def plane():
    cc.Scale.calls.clear()
    p = DataPlane.build({"scale": from_class_ref("scale", REF, {"scale": 3.0}),
                         "plain": from_class_ref("plain", "tests.serving._custom_classes:"
                                                          "Unbatched")}, instances=1)
    p.start(warmup=False)
    try:
        yield p
    finally:
        p.stop()


def test_class_ref_syntax():
    assert is_class_ref("a.b_c:D") and is_class_ref("mod:Cls")
    assert not is_class_ref("models/mlp") and not is_class_ref("a:b:c")
    assert not is_class_ref("C:\\models") and not is_class_ref("a.:B")


def test_declared_metadata_and_config(plane):
    md = plane.model_metadata("scale")
    assert md["platform"] == "python"
    assert md["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert md["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4]},
                             {"name": "n", "datatype": "INT64", "shape": [-1]}]
    assert plane.model_config("scale")["dynamic_batching_on"] is True
    md = plane.model_metadata("plain")
    assert md["inputs"][0] == {"name": "a", "datatype": "INT32", "shape": [2, 3]}
    assert plane.model_config("plain")["dynamic_batching_on"] is False


def test_batched_requests_run_as_one_batch(plane):
    xs = [np.arange(4 * r, dtype=np.float32).reshape(r, 4) + i for i, r in
          enumerate((1, 2))]

    async def go():
        return await asyncio.gather(*(plane.infer("scale", None, _body("x", "FP32", x))
                                      for x in xs))
    outs = asyncio.run(go())
    assert cc.Scale.calls == [3]                     # one batch of 1 + 2 rows
    for x, out in zip(xs, outs):
        got = _outputs(out)
        np.testing.assert_array_equal(got["y"], (x * 3.0).astype(np.float32))
        np.testing.assert_array_equal(got["n"], [3] * len(x))   # the batch's rows


def test_unbatched_model(plane):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    body = json.dumps({"inputs": [
        {"name": "a", "datatype": "INT32", "shape": [2, 3], "data": a.tolist()},
        {"name": "b", "datatype": "FP64", "shape": [], "data": [0.5]}]}).encode()
    assert _outputs(asyncio.run(plane.infer("plain", None, body)))["s"].tolist() == [15.5]


def test_a_raising_request_fails_alone_and_is_logged(plane):
    got = []
    h = logging.Handler()
    h.emit = got.append
    log = logging.getLogger("sampan.serving")
    log.addHandler(h)
    xs = [np.ones((1, 4), np.float32), -np.ones((1, 4), np.float32),
          np.full((1, 4), 2, np.float32)]

    async def go():
        return await asyncio.gather(*(plane.infer("scale", None, _body("x", "FP32", x))
                                      for x in xs), return_exceptions=True)
    try:
        outs = asyncio.run(go())
    finally:
        log.removeHandler(h)
    assert cc.Scale.calls == [3, 1, 1, 1]            # the batch, then one by one
    assert _outputs(outs[0])["y"].tolist() == [[3.0] * 4]
    assert _outputs(outs[2])["y"].tolist() == [[6.0] * 4]
    err = outs[1]
    assert isinstance(err, RequestError) and err.status == 500
    assert "ValueError: negative input" in str(err) and "'scale'" in str(err)
    raised = [r for r in got if "infer raised" in r.getMessage()]
    assert raised and all(r.exc_info and r.exc_info[0] is ValueError for r in raised)


def test_bad_classes_are_clear_errors():
    with pytest.raises(ServingError, match="no infer"):
        CustomModel("m", cc.NoInfer, {})
    with pytest.raises(ServingError, match="no outputs declared"):
        CustomModel("m", type("C", (), {"inputs": cc.NoInfer.inputs, "infer": len}), {})
    with pytest.raises(ServingError, match="cannot import module 'no_such_mod_xyz'"):
        from_class_ref("m", "no_such_mod_xyz:C")
    with pytest.raises(ServingError, match="has no class 'Nope'"):
        from_class_ref("m", "tests.serving._custom_classes:Nope")
    with pytest.raises(ServingError, match="must start with -1"):
        CustomModel("m", cc.Unbatched, {"max_batch_size": 4})
    with pytest.raises(ServingError, match="datatype 'FP8'"):
        CustomModel("m", cc.Scale, {"inputs": [{"name": "x", "datatype": "FP8",
                                                "dims": [4]}]})


MODEL_PY = '''
import numpy as np

class Model:
    inputs = [{"name": "x", "datatype": "FP32", "dims": [2]}]
    outputs = [{"name": "y", "datatype": "FP32", "dims": [2]}]
    max_batch_size = 8

    def load(self, config):
        self.k = config["k"]

    def infer(self, inputs):
        return {"y": inputs["x"] + self.k}
'''


def _folder(root, name, source=MODEL_PY, **config):
    d = os.path.join(root, name)
    os.makedirs(d)
    with open(os.path.join(d, "model.py"), "w") as f:
        f.write(source)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    return d


def test_repository_model_py_over_http_and_class_ref(tmp_path):
    repo = tmp_path / "repo"
    _folder(str(repo), "addk", k=10, dynamic_batching={})
    models = {"scale": REF}
    with Server(models, repository=str(repo), overrides={"dynamic_batching": None}) as s:
        x = np.array([[1.0, 2.0]], np.float32)
        r = httpx.post(f"{s.url}/v2/models/addk/infer", content=_body("x", "FP32", x))
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [11.0, 12.0]
        assert s.plane.model_config("addk")["dynamic_batching_on"] is False  # the flag
        assert s.plane.model_config("scale")["dynamic_batching_on"] is False
        r = httpx.post(f"{s.url}/v2/models/scale/infer",
                       content=_body("x", "FP32", -np.ones((1, 4), np.float32)))
        assert r.status_code == 500 and "negative input" in r.json()["error"]
        assert httpx.get(f"{s.url}/v2/models/addk").json()["platform"] == "python"


def test_model_py_runs_only_from_inside_the_repository(tmp_path):
    marker = tmp_path / "ran"
    src = f"open({str(marker)!r}, 'w').close()\n" + MODEL_PY
    outside = _folder(str(tmp_path), "outside", src, k=1)
    with pytest.raises(ServingError, match="run only from a folder of --repository"):
        Server({"m": outside})._build()
    repo = tmp_path / "repo"
    repo.mkdir()
    os.symlink(os.path.join(outside, "model.py"), repo / "link.py")
    d = repo / "sneaky"
    d.mkdir()
    os.symlink(repo / "link.py", d / "model.py")
    (d / "config.json").write_text('{"k": 1, "_code_root": "/"}')
    with pytest.raises(ServingError, match="not inside the model repository"):
        Server(repository=str(repo))._build()
    assert not marker.exists()                       # no line of it ran


@pytest.mark.slow          # a server process of its own: ~3-6 s to import and start
def test_sampan_serve_command_line_with_a_class_and_a_repository(tmp_path):
    import signal
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    repo = tmp_path / "repo"
    _folder(str(repo), "addk", k=0.5)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = open(tmp_path / "stderr", "w")
    p = subprocess.Popen([sys.executable, "-m", "sampan.cli", "serve", "--model",
                          f"scale={REF}", "--repository", str(repo), "--port", "0",
                          "--log-level", "warning", "--max-queue-delay-us", "1000"],
                         cwd=root, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        line = p.stdout.readline()
        assert line, (tmp_path / "stderr").read_text()
        rec = json.loads(line)
        assert rec["models"] == ["addk", "scale"]
        url = rec["url"]
        r = httpx.post(f"{url}/v1/models/scale:predict", json={"instances": [[1, 2, 3, 4]]})
        assert r.status_code == 200 and r.json()["predictions"][0]["y"] == [2, 4, 6, 8]
        r = httpx.post(f"{url}/v1/models/addk:predict", json={"inputs": [[1, 2]]})
        assert r.json() == {"outputs": [[1.5, 2.5]]}
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        p.stdout.close()
        log.close()
