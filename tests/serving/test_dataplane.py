"""The serving data plane driven directly, with no HTTP: the contract a second front end
(gRPC) meets. Model lookup, readiness and metadata; infer through the REST codec and
through a toy codec (as a gRPC front end would bring: already-parsed messages in and
out); admission (a full queue is a 503), deadlines (504), a cancelled request (503,
closing its connection), errors counted and logged; and dataplane.py imports no HTTP
library."""
import ast
import asyncio
import json
import os
import re

import numpy as np
import pytest

from sampan.serving import DataPlane, RequestError, protocol
from sampan.serving.errors import ModelNotFound

from ._models import Mixed, Slow

X = np.arange(8, dtype=np.float32).reshape(2, 4) - 3.5


def _body(x, **extra):
    req = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                       "data": x.ravel().tolist()}], **extra}
    return json.dumps(req).encode()


def _count(plane, model, status):
    text = plane.metrics_text()[0].decode()
    m = re.search(r'^sampan_requests_total\{model="%s",status="%d"\} (\S+)$'
                  % (model, status), text, re.M)
    return 0 if m is None else float(m.group(1))


@pytest.fixture
def plane():
    p = DataPlane.build({"slow": Slow("slow", 0.0, dynamic_batching={}), "mixed": Mixed(),
                         "sleepy": Slow("sleepy", 1.0)}, instances=1)
    p.start(warmup=False)
    try:
        yield p
    finally:
        p.stop()


def test_lookup_readiness_and_metadata(plane):
    assert plane.live() and plane.ready()
    assert plane.model_ready("slow") and plane.model_ready("slow", "1")
    assert plane.server_metadata()["extensions"] == ["binary_tensor_data"]
    meta = plane.model_metadata("slow")
    assert meta == {"name": "slow", "versions": ["1"], "platform": "sampan",
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]}
    cfg = plane.model_config("slow")
    assert cfg["max_batch_size"] == 8 and cfg["instance_count"] == 1
    assert cfg["dynamic_batching_on"] is True
    assert plane.entry("mixed").model.name == "mixed"
    for name, version in (("nope", None), ("slow", "7")):
        with pytest.raises(ModelNotFound) as e:
            plane.model_metadata(name, version)
        assert e.value.status == 404 and e.value.grpc_code == "NOT_FOUND"
        with pytest.raises(ModelNotFound):
            asyncio.run(plane.infer(name, version, _body(X)))


def test_infer_through_the_rest_codec(plane):
    async def go():
        out, hlen = await plane.infer("slow", None, _body(X, id="r1"))
        assert hlen is None
        resp = json.loads(out)
        assert resp["id"] == "r1" and resp["model_name"] == "slow"
        (o,) = resp["outputs"]
        np.testing.assert_array_equal(np.array(o["data"], np.float32).reshape(o["shape"]),
                                      2 * X)

        async def read():                 # a front end's body reader: awaited once found
            return _body(X, parameters={"binary_data_output": True})
        out, hlen = await plane.infer("slow", "1", read)
        head = json.loads(out[:hlen])
        (o,) = head["outputs"]
        got = np.frombuffer(out[hlen:], "<f4").reshape(o["shape"])
        np.testing.assert_array_equal(got, 2 * X)

        bad = json.dumps({"inputs": [{"name": "x", "datatype": "INT64", "shape": [1, 4],
                                      "data": [1, 2, 3, 4]}]}).encode()
        with pytest.raises(RequestError) as e:
            await plane.infer("slow", None, bad)
        assert e.value.status == 400 and "datatype" in str(e.value)
        assert e.value.grpc_code == "INVALID_ARGUMENT"
    asyncio.run(go())
    assert _count(plane, "slow", 200) == 2 and _count(plane, "slow", 400) == 1
    assert _count(plane, "nope", 404) == 0


class ToyCodec:
    """A second front end's codec: its messages are already parsed (a dict of arrays in,
    the result arrays out), as protobuf messages would be for gRPC."""

    @staticmethod
    def decode(model, msg, header, plans):
        names = {s.name for s in model.inputs}
        if set(msg["inputs"]) != names:
            raise RequestError(f"model {model.name!r}: inputs {sorted(msg['inputs'])}; "
                               f"expected {sorted(names)}", 400)
        return protocol.Decoded(msg.get("id"), dict(msg["inputs"]), {},
                                msg.get("parameters", {}), False)

    @staticmethod
    def encode(model, dec, results):
        return {"id": dec.id, "outputs": results}


def test_infer_through_another_codec_admission_deadline_and_cancel(plane):
    async def go():
        out = await plane.infer("mixed", None, {"id": "g1", "inputs": {
            "ids": np.array([1, 0, 2], np.int64), "w": np.ones((3, 2))}}, codec=ToyCodec)
        assert out["id"] == "g1"
        np.testing.assert_array_equal(out["outputs"]["s"], [3.0, 3.0])
        np.testing.assert_array_equal(out["outputs"]["flag"], [True, False, True])

        # its own timeout, in the protocol's parameters: answered 504 while it runs
        with pytest.raises(RequestError) as e:
            await plane.infer("sleepy", None, {"inputs": {"x": X}, "parameters": {
                "timeout_ms": 20}}, codec=ToyCodec)
        assert e.value.status == 504 and e.value.grpc_code == "DEADLINE_EXCEEDED"

        # a request cancelled by the server (shutdown out of time): a 503 closing its
        # connection, not a bare CancelledError
        t = asyncio.create_task(plane.infer("sleepy", None, {"inputs": {"x": X}},
                                            codec=ToyCodec))
        await asyncio.sleep(0.05)
        t.cancel()
        with pytest.raises(RequestError) as e:
            await t
        assert e.value.status == 503 and e.value.headers == {"Connection": "close"}
    asyncio.run(go())
    assert _count(plane, "mixed", 200) == 1
    assert _count(plane, "sleepy", 504) == 1 and _count(plane, "sleepy", 503) == 1


def test_a_full_queue_is_refused_and_a_draining_plane_is_not_ready():
    plane = DataPlane.build({"q": Slow("q", 0.3, max_queue_size=1)}, instances=1)
    plane.start(warmup=False)
    try:
        async def go():
            return await asyncio.gather(*[plane.infer("q", None, _body(X))
                                          for _ in range(3)], return_exceptions=True)
        got = asyncio.run(go())
        refused = [r for r in got if isinstance(r, RequestError)]
        assert refused and all(r.status == 503 and r.headers == {"Retry-After": "1"}
                               and "queue is full" in str(r) for r in refused)
        assert len(refused) < 3
        assert _count(plane, "q", 503) == len(refused)
        assert _count(plane, "q", 200) == 3 - len(refused)
    finally:
        plane.stop()
    assert not plane.ready() and plane.live()
    with pytest.raises(RequestError) as e:
        asyncio.run(plane.infer("q", None, _body(X)))
    assert e.value.status == 503 and "shutting down" in str(e.value)


def test_the_data_plane_imports_no_http_library():
    import sampan.serving.dataplane as dp
    tree = ast.parse(open(dp.__file__, encoding="utf-8").read())
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            mods.add(node.module.split(".")[0])
    assert not mods & {"starlette", "uvicorn", "httptools", "h11", "httpx", "fastapi"}, mods
    app = open(os.path.join(os.path.dirname(dp.__file__), "app.py"), encoding="utf-8").read()
    for gone in ("submit(", "log_request", "metrics.answered", "timeout_s("):
        assert gone not in app, gone
