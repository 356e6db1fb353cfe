"""v1 REST predict (TF Serving / KServe v1, issue 32): ``instances`` (row format) and
``inputs`` (columnar), named and single inputs, one and several outputs, checked against
a hand-written reference of the TF Serving REST rules; errors as ``{"error": ...}``."""
import asyncio
import json
import math

import httpx
import numpy as np
import pytest

from sampan.serving import DataPlane, RequestError, Server, v1
from sampan.serving.custom import from_class_ref

from ._custom_classes import Affine, Pair

MOD = "tests.serving._custom_classes:"


def _affine(x):
    return {"y": np.asarray(x, np.float32) * 2 + 1}


def _pair(a, k):
    a, k = np.asarray(a, np.float32), np.asarray(k, np.int64)
    return {"s": a.astype(np.float64).sum(-1) * k, "d": a - k[..., None]}


def reference(fn, in_names, out_names, req):
    """TF Serving's REST rules written out independently of v1.py: a row-format request
    runs each instance alone and lists per-row predictions (a bare value for one output,
    an object for several); a columnar one runs the whole inputs and answers them as
    'outputs' (bare for one output, an object for several). A single input may be given
    bare instead of named."""
    def named(v):
        return v if isinstance(v, dict) else {in_names[0]: v}
    if "instances" in req:
        preds = []
        for inst in req["instances"]:
            args = named(inst)
            out = fn(*[np.asarray(args[n])[None] for n in in_names])
            row = {n: out[n][0].tolist() for n in out_names}
            preds.append(row[out_names[0]] if len(out_names) == 1 else row)
        return {"predictions": preds}
    args = named(req["inputs"])
    out = fn(*[args[n] for n in in_names])
    cols = {n: np.asarray(out[n]).tolist() for n in out_names}
    return {"outputs": cols[out_names[0]] if len(out_names) == 1 else cols}


@pytest.fixture(scope="module")
def plane():
    p = DataPlane.build({"affine": from_class_ref("affine", MOD + "Affine"),
                         "pair": from_class_ref("pair", MOD + "Pair"),
                         "plain": from_class_ref("plain", MOD + "Unbatched")}, instances=1)
    p.start(warmup=False)
    try:
        yield p
    finally:
        p.stop()


def _predict(plane, model, req):
    body = req if isinstance(req, bytes) else json.dumps(req).encode()
    out, hlen = asyncio.run(plane.infer(model, None, body, None, v1))
    assert hlen is None
    return json.loads(out)


def _close(got, want):
    """Equal up to float32 rounding, walking lists and objects."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want)
        for k in want:
            _close(got[k], want[k])
    else:
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                                   rtol=1e-6)
        assert np.shape(got) == np.shape(want)


X = [[0.5, -1.0, 2.0], [3.0, 4.25, -0.125]]
CASES = [
    ("affine", {"instances": X}),                                 # rows, bare values
    ("affine", {"instances": [{"x": r} for r in X]}),             # rows, named
    ("affine", {"inputs": X}),                                    # columnar, bare
    ("affine", {"inputs": {"x": X}, "signature_name": "serving_default"}),
    ("affine", {"instances": [[1, 2, 3]]}),                       # ints for FP32
    ("pair", {"instances": [{"a": [1.0, 2.0], "k": 3}, {"a": [0.5, -1], "k": -2}]}),
    ("pair", {"inputs": {"a": [[1.0, 2.0], [0.5, -1]], "k": [3, -2]}}),
]


@pytest.mark.parametrize("model,req", CASES)
def test_predict_matches_the_tf_serving_rules(plane, model, req):
    fn, ins, outs = {"affine": (_affine, ["x"], ["y"]),
                     "pair": (_pair, ["a", "k"], ["s", "d"])}[model]
    want = reference(fn, ins, outs, req)
    got = _predict(plane, model, req)
    assert set(got) == set(want)
    key = next(iter(want))
    if key == "predictions":
        assert len(got[key]) == len(want[key])
        for g, w in zip(got[key], want[key]):
            _close(g, w)
    else:
        _close(got[key], want[key])


def test_nan_and_infinity_pass_through_as_tf_serving_writes_them(plane):
    got = _predict(plane, "affine", b'{"instances": [[NaN, Infinity, -Infinity]]}')
    y = got["predictions"][0]
    assert math.isnan(y[0]) and y[1] == math.inf and y[2] == -math.inf


def test_unbatched_model_takes_columnar_inputs_only(plane):
    req = {"inputs": {"a": [[1, 2, 3], [4, 5, 6]], "b": 0.5}}
    assert _predict(plane, "plain", req) == {"outputs": [21.5]}
    with pytest.raises(RequestError, match="no batch dimension.*columnar"):
        _predict(plane, "plain", {"instances": [{"a": [[1, 2, 3]] * 2, "b": 1.0}]})


@pytest.mark.parametrize("model,req,match", [
    ("affine", {"instances": X, "inputs": X}, "exactly one of 'instances'"),
    ("affine", {"signature_name": "x"}, "exactly one of 'instances'"),
    ("affine", [1, 2], "must be a JSON object"),
    ("affine", {"instances": []}, "non-empty list"),
    ("affine", {"instances": [[1, 2]]}, r"shape \[1, 2\] does not fit"),
    ("affine", {"instances": [[1, 2, 3], [1, 2]]}, "ragged|regular"),
    ("affine", {"instances": [["a", "b", "c"]]}, "needs numbers of datatype FP32"),
    ("affine", {"inputs": {"z": X}}, r"unknown input\(s\) \['z'\]"),
    ("affine", {"instances": [[1e39, 0, 0]]}, "too large for datatype FP32"),
    ("pair", {"instances": [{"a": [1, 2]}]}, r"instance 0: missing input\(s\) \['k'\]"),
    ("pair", {"instances": [[1, 2]]}, "must be an object"),
    ("pair", {"instances": [{"a": [1, 2], "k": 1.5}]}, "INT64 needs integers"),
    ("pair", {"inputs": {"a": [[1, 2]], "k": [1, 2]}}, "share their first"),
    ("pair", {"inputs": {"a": [[1, 2]], "k": [2 ** 63]}}, "holds values in"),
])
def test_bad_requests_are_400_naming_what_is_wrong(plane, model, req, match):
    with pytest.raises(RequestError, match=match) as e:
        _predict(plane, model, req)
    assert e.value.status == 400 and f"model {model!r}" in str(e.value)


def test_over_http(tmp_path):
    with Server({"affine": MOD + "Affine"}) as s:
        r = httpx.post(f"{s.url}/v1/models/affine:predict", json={"instances": X})
        assert r.status_code == 200, r.text
        _close(r.json()["predictions"], reference(_affine, ["x"], ["y"],
                                                  {"instances": X})["predictions"])
        r = httpx.post(f"{s.url}/v1/models/affine/versions/1:predict", json={"inputs": X})
        assert r.status_code == 200 and len(r.json()["outputs"]) == 2
        r = httpx.post(f"{s.url}/v1/models/affine:predict", json={"instances": [[1]]})
        assert r.status_code == 400 and "does not fit" in r.json()["error"]
        r = httpx.post(f"{s.url}/v1/models/nope:predict", json={"instances": X})
        assert r.status_code == 404 and "unknown model 'nope'" in r.json()["error"]
        assert httpx.get(f"{s.url}/v1/models/affine").json() == {"name": "affine",
                                                                  "ready": True}
        assert httpx.get(f"{s.url}/v1/models").json() == {"models": ["affine"]}
        assert httpx.get(f"{s.url}/v1/models/nope").status_code == 404


def test_predict_path():
    assert v1.predict_path("/v1/models/m:predict") == ("m", None)
    assert v1.predict_path("/v1/models/m/versions/3:predict") == ("m", "3")
    assert v1.predict_path("/v1/models/:predict") is None
    assert v1.predict_path("/v1/models/m/x:predict") is None
    assert Affine.max_batch_size and Pair.max_batch_size
