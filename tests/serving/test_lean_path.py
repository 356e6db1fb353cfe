"""The infer route's lean path: the raw ASGI route beside starlette's, decode plans for
repeated headers, chunked bodies, and one write per answer."""
import asyncio
import json

import httpx
import numpy as np
import pytest

from sampan.serving import protocol
from sampan.serving.app import infer_path
from sampan.serving.batcher import RequestError
from sampan.serving.wire import OneWrite

from ._models import mlp_reference


def _binary(x, **extra):
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": "output_0",
                                    "parameters": {"binary_data": True}}], **extra}).encode()
    return head, head + x.tobytes()


def _answer(r):
    hl = int(r.headers["inference-header-content-length"])
    return np.frombuffer(r.content[hl:], np.float32).reshape(-1, 5)


def test_a_repeated_header_decodes_each_body_and_still_checks_its_length(served):
    model = served.entries["mlp_single"].model
    rng = np.random.default_rng(3)
    plans = {}
    x1, x2 = (rng.standard_normal((2, 12)).astype(np.float32) for _ in range(2))
    head, body = _binary(x1, id="same")
    d1 = protocol.decode(model, body, str(len(head)), plans)
    d2 = protocol.decode(model, _binary(x2, id="same")[1], str(len(head)), plans)
    assert len(plans) == 1 and d2.id == "same" and d2.outputs == {"output_0": True}
    np.testing.assert_array_equal(d1.inputs["x"], x1)
    np.testing.assert_array_equal(d2.inputs["x"], x2)
    with pytest.raises(RequestError, match="input 'x'.*runs past the end"):
        protocol.decode(model, body[:-4], str(len(head)), plans)
    with pytest.raises(RequestError, match="binary bytes after the inputs"):
        protocol.decode(model, body + b"\0" * 4, str(len(head)), plans)
    # JSON data is never planned (the values are in the header)
    j = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 12],
                                "data": [0.5] * 12}]}).encode()
    protocol.decode(model, j, None, plans)
    assert len(plans) == 1
    # over HTTP: the same header with other data answers for that data
    for x in (x1, x2, x1[:1]):
        head, body = _binary(x)
        r = httpx.post(served.url + "/v2/models/mlp_single/infer", content=body,
                       headers={"Inference-Header-Content-Length": str(len(head))})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(_answer(r), mlp_reference(served.weights, x),
                                   rtol=1e-5, atol=1e-5)


def test_routes_versions_methods_and_chunked_bodies(served):
    assert infer_path("/v2/models/m/infer") == ("m", None)
    assert infer_path("/v2/models/m/versions/3/infer") == ("m", "3")
    assert infer_path("/v2/models/a/b/infer") is None and infer_path("/v2/models//infer") is None
    x = np.random.default_rng(4).standard_normal((1, 12)).astype(np.float32)
    head, body = _binary(x)
    h = {"Inference-Header-Content-Length": str(len(head))}
    with httpx.Client(base_url=served.url) as c:
        r = c.post("/v2/models/mlp/versions/1/infer", content=body, headers=h)
        assert r.status_code == 200
        np.testing.assert_allclose(_answer(r), mlp_reference(served.weights, x),
                                   rtol=1e-5, atol=1e-5)
        r = c.post("/v2/models/mlp/versions/2/infer", content=body, headers=h)
        assert r.status_code == 404 and "no version '2'" in r.json()["error"]
        r = c.post("/v2/models/nosuch/infer", content=body, headers=h)
        assert r.status_code == 404 and "unknown model 'nosuch'" in r.json()["error"]
        assert c.get("/v2/models/mlp/infer").status_code == 405
        assert c.post("/v2/models/a/b/infer", content=body).status_code == 404
        # a chunked body arrives in several ASGI messages
        r = c.post("/v2/models/mlp_single/infer", headers=h,
                   content=iter([body[:7], body[7:100], body[100:]]))
        assert r.status_code == 200
        np.testing.assert_allclose(_answer(r), mlp_reference(served.weights, x),
                                   rtol=1e-5, atol=1e-5)
        assert r.headers["content-type"] == "application/octet-stream"
        assert "server" not in r.headers


class _Transport:
    def __init__(self):
        self.writes, self.closed = [], False

    def write(self, data):
        assert not self.closed
        self.writes.append(bytes(data))

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    def get_extra_info(self, name):
        return name


def test_one_write_joins_a_response_head_to_its_body_and_never_holds_past_the_turn():
    async def run():
        loop = asyncio.get_running_loop()
        t = _Transport()
        w = OneWrite(t, loop)
        head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
        w.write(head)
        assert t.writes == []
        w.write(b"ok")
        assert t.writes == [head + b"ok"]
        w.write(b"plain")                    # not a response head: written at once
        assert t.writes[-1] == b"plain"
        w.write(b"HTTP/1.1 100 Continue\r\n\r\n")   # nothing follows it this turn
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert t.writes[-1] == b"HTTP/1.1 100 Continue\r\n\r\n"
        w.write(head)
        w.close()                            # a held head goes out before the close
        assert t.writes[-1] == head and t.closed
        assert w.get_extra_info("peername") == "peername"
        w2 = OneWrite(_Transport(), loop)
        w2.write(head)
        w2._tr.closed = True                 # the connection was lost meanwhile
        w2.flush()
        assert w2._tr.writes == []
    asyncio.run(run())
