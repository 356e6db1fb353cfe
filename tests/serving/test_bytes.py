"""The BYTES datatype (issue 32): HTTP JSON strings, the binary extension's 4-byte
length-prefixed elements, gRPC raw and ``bytes_contents``; custom models get numpy
object arrays of bytes. Spoken by tritonclient (http and grpc), whose own serializer is
the reference for the binary form."""
import json

import httpx
import numpy as np
import pytest

from sampan.serving import Server, bytes_tensor
from sampan.serving.custom import from_class_ref

from . import _bytes_models as bm

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import (InferenceServerException,  # noqa: E402
                                deserialize_bytes_tensor, serialize_byte_tensor)

WORDS = [b"hello", "caf\u00e9 \u00fc".encode(), b"", b"a\x00b"]


@pytest.fixture(scope="module")
def served():
    import importlib.util
    grpc = 0 if importlib.util.find_spec("grpc") is not None else None
    mods = bm.__name__
    s = Server({"upper": from_class_ref("upper", f"{mods}:Upper"),
                "echo": from_class_ref("echo", f"{mods}:Echo"),
                "raw": from_class_ref("raw", f"{mods}:Raw")}, grpc_port=grpc).start()
    try:
        yield s
    finally:
        s.stop()


def _text(words):
    a = np.empty((len(words), 1), object)
    a[:, 0] = words
    return a


def test_binary_form_matches_tritonclient():
    a = np.array(WORDS + [b"\xff\xfe"], dtype=object)
    ours = bytes_tensor.serialize(a)
    assert ours == serialize_byte_tensor(a).item()
    back = bytes_tensor.deserialize(ours, (5,))
    assert back.dtype == object and back.tolist() == a.tolist()
    assert deserialize_bytes_tensor(ours).tolist() == a.tolist()
    with pytest.raises(bytes_tensor.BytesError, match="only 2 are left"):
        bytes_tensor.deserialize(b"\x05\x00\x00\x00ab", (1,))
    with pytest.raises(bytes_tensor.BytesError, match="bytes follow"):
        bytes_tensor.deserialize(ours + b"x", (5,))
    with pytest.raises(bytes_tensor.BytesError, match="needs 2 elements"):
        bytes_tensor.deserialize(b"\x00\x00\x00\x00", (2,))


def test_http_binary_and_json_with_tritonclient(served):
    bm.Upper.seen.clear()
    c = httpclient.InferenceServerClient(served.url[len("http://"):])
    try:
        meta = c.get_model_metadata("upper")
        assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}]
        x = _text(WORDS)
        for binary in (True, False):
            words = WORDS if binary else WORDS[:3]       # JSON: text only (UTF-8)
            i = httpclient.InferInput("text", [len(words), 1], "BYTES")
            i.set_data_from_numpy(_text(words), binary_data=binary)
            outs = [httpclient.InferRequestedOutput("upper", binary_data=binary),
                    httpclient.InferRequestedOutput("length", binary_data=binary)]
            r = c.infer("upper", [i], outputs=outs)
            up = r.as_numpy("upper")
            got = [v if isinstance(v, bytes) else v.encode() for v in up.ravel().tolist()]
            assert up.shape == (len(words), 1)
            assert got == [w.upper() for w in words]
            assert r.as_numpy("length").ravel().tolist() == [len(w) for w in words]
        # the model saw object arrays of bytes
        assert all(dt == object and kinds <= {bytes} for dt, kinds, _ in bm.Upper.seen)
        assert x.shape == (4, 1)
    finally:
        c.close()


def test_batched_requests_keep_their_strings(served):
    import concurrent.futures
    bm.Upper.seen.clear()

    def one(k):
        c = httpclient.InferenceServerClient(served.url[len("http://"):])
        try:
            i = httpclient.InferInput("text", [1, 1], "BYTES")
            i.set_data_from_numpy(_text([f"req-{k}".encode()]))
            return c.infer("upper", [i]).as_numpy("upper").ravel()[0]
        finally:
            c.close()
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        got = list(ex.map(one, range(4)))
    assert got == [f"REQ-{k}".encode() for k in range(4)]
    assert max(n for _, _, n in bm.Upper.seen) > 1          # they ran as one batch


def test_json_strings_in_and_out_and_errors(served):
    body = {"inputs": [{"name": "s", "datatype": "BYTES", "shape": [2],
                        "data": ["\u00e9t\u00e9", "x"]}]}
    r = httpx.post(f"{served.url}/v2/models/echo/infer", json=body)
    assert r.status_code == 200
    o = r.json()["outputs"][0]
    assert o["datatype"] == "BYTES" and o["data"] == ["\u00e9t\u00e9", "x"]
    bad = {"inputs": [{"name": "s", "datatype": "BYTES", "shape": [2], "data": ["a", 1]}]}
    r = httpx.post(f"{served.url}/v2/models/echo/infer", json=bad)
    assert r.status_code == 400 and "'s'" in r.json()["error"] and "int" in r.json()["error"]
    short = dict(bad, inputs=[dict(bad["inputs"][0], data=["a"])])
    r = httpx.post(f"{served.url}/v2/models/echo/infer", json=short)
    assert r.status_code == 400 and "needs 2 elements" in r.json()["error"]
    # a binary part whose element runs past its binary_data_size
    head = json.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": 6}}]}).encode()
    r = httpx.post(f"{served.url}/v2/models/raw/infer", content=head + b"\x09\0\0\0ab",
                   headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 400 and "BYTES" in r.json()["error"]
    # bytes that are not UTF-8 go out in binary form only
    raw = bytes_tensor.serialize(np.array([b"\xff"], object))
    head = json.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": len(raw)}}]}).encode()
    r = httpx.post(f"{served.url}/v2/models/raw/infer", content=head + raw,
                   headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 500 and "not UTF-8" in r.json()["error"]


def test_grpc_raw_and_typed_contents(served):
    c = grpcclient.InferenceServerClient(served.grpc_address)
    try:
        i = grpcclient.InferInput("text", [len(WORDS), 1], "BYTES")
        i.set_data_from_numpy(_text(WORDS))           # raw_input_contents
        r = c.infer("upper", [i])
        assert r.as_numpy("upper").ravel().tolist() == [w.upper() for w in WORDS]
        cfg = c.get_model_config("upper").config
        assert [t.data_type for t in cfg.input] == [cfg.input[0].data_type]
        assert cfg.input[0].data_type == 13             # TYPE_STRING
        r = c.infer("raw", [_grpc_input("s", np.array([b"\xff", b"ok"], object))])
        assert r.as_numpy("s").tolist() == [b"\xff", b"ok"]
        bad = grpcclient.InferInput("s", [2], "BYTES")
        bad._raw_content = b"\x05\0\0\0ab"              # a malformed raw tensor
        with pytest.raises(InferenceServerException, match="BYTES"):
            c.infer("raw", [bad])
    finally:
        c.close()
    # typed contents (bytes_contents) through the generated stub: a typed answer
    import grpc

    from sampan.serving.proto import inference_pb2 as pb
    from sampan.serving.proto import inference_pb2_grpc
    with grpc.insecure_channel(served.grpc_address) as ch:
        stub = inference_pb2_grpc.GRPCInferenceServiceStub(ch)
        req = pb.ModelInferRequest(model_name="echo")
        t = req.inputs.add(name="s", datatype="BYTES", shape=[2])
        t.contents.bytes_contents.extend([b"ab", "\u00fc".encode()])
        out = stub.ModelInfer(req)
        assert out.outputs[0].datatype == "BYTES"
        assert list(out.outputs[0].contents.bytes_contents) == [b"ab", "\u00fc".encode()]


def _grpc_input(name, a):
    i = grpcclient.InferInput(name, list(a.shape), "BYTES")
    i.set_data_from_numpy(a)
    return i


def test_v1_predict_strings(served):
    r = httpx.post(f"{served.url}/v1/models/upper:predict",
                   json={"instances": [["ab"], ["c\u00e9"]]})
    assert r.status_code == 200, r.text
    assert r.json()["predictions"] == [{"upper": ["AB"], "length": [2]},
                                       {"upper": ["C\u00e9"], "length": [3]}]
