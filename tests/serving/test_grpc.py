"""The gRPC front end (KServe v2 / Triton `inference.GRPCInferenceService`), spoken by the
real client (tritonclient.grpc) and by a raw stub of the shipped generated code, over the
same data plane as HTTP (`served` serves both)."""
import concurrent.futures

import httpx
import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
grpc = pytest.importorskip("grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

from ._models import mlp_reference  # noqa: E402


IMPLS = ("native", "grpcio")


@pytest.fixture(scope="module", params=IMPLS)
def address(request, served):
    """The gRPC address of each implementation over the served data plane: the server's
    own front end, or the other one started on the server's event loop beside it."""
    import asyncio

    from sampan.serving.grpc_server import front_end
    if served.grpc.impl == request.param:
        yield served.grpc_address
        return
    fe = front_end(request.param)(served.plane, "127.0.0.1", 0, 1 << 20)
    asyncio.run_coroutine_threadsafe(fe.start_async(), served.grpc.loop).result(30)
    try:
        yield fe.address
    finally:
        asyncio.run_coroutine_threadsafe(fe.stop_async(1.0), served.grpc.loop).result(30)


@pytest.fixture(scope="module")
def client(address):
    c = grpcclient.InferenceServerClient(address)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(address):
    from sampan.serving.proto import inference_pb2_grpc
    ch = grpc.insecure_channel(address)
    yield inference_pb2_grpc.GRPCInferenceServiceStub(ch)
    ch.close()


def _x(rows, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, 12)).astype(np.float32)


def _input(name, a, datatype):
    i = grpcclient.InferInput(name, list(a.shape), datatype)
    i.set_data_from_numpy(a)
    return i


def _raises(client, model, inputs, **kw):
    with pytest.raises(InferenceServerException) as e:
        client.infer(model, inputs, **kw)
    return e.value


def test_health_and_metadata_match_http(served, client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and client.is_model_ready("mixed", "7")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "sampan" and "binary_tensor_data" in meta["extensions"]
    http_meta = httpx.get(f"{served.url}/v2/models/mixed").json()
    m = client.get_model_metadata("mixed", "7", as_json=True)
    assert m["platform"] == "python" and m["versions"] == ["7"]
    for field in ("inputs", "outputs"):   # protobuf's JSON writes int64 as strings
        assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in m[field]] \
            == [(t["name"], t["datatype"], t["shape"]) for t in http_meta[field]]
    cfg = client.get_model_config("mlp").config
    assert cfg.name == "mlp" and cfg.max_batch_size == 16
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("x", [12])]   # no batch dim
    assert cfg.input[0].data_type == grpcclient.model_config_pb2.TYPE_FP32
    assert list(cfg.dynamic_batching.preferred_batch_size) == [16]
    assert client.get_model_config("mixed").config.max_batch_size == 0


def test_infer_raw_contents_matches_the_reference(served, client):
    x = _x(3)
    r = client.infer("mlp_single", [_input("x", x, "FP32")], request_id="g-1")
    assert r.get_response().id == "g-1" and len(r.get_response().raw_output_contents) == 1
    y = r.as_numpy("output_0")
    assert y.dtype == np.float32 and y.shape == (3, 5)
    np.testing.assert_allclose(y, mlp_reference(served.weights, x), rtol=1e-5, atol=1e-5)
    ids, w = np.array([1, -2, 3], np.int64), np.arange(6, dtype=np.float64).reshape(3, 2)
    r = client.infer("mixed", [_input("ids", ids, "INT64"), _input("w", w, "FP64")],
                     outputs=[grpcclient.InferRequestedOutput("flag")])
    assert [o.name for o in r.get_response().outputs] == ["flag"]
    np.testing.assert_array_equal(r.as_numpy("flag"), ids > 0)


def test_infer_typed_contents_answers_typed(served, stub):
    from sampan.serving.proto import inference_pb2 as pb
    x = _x(2, 5)
    req = pb.ModelInferRequest(model_name="mlp", id="typed")
    t = req.inputs.add(name="x", datatype="FP32", shape=x.shape)
    t.contents.fp32_contents.extend(x.ravel().tolist())
    resp = stub.ModelInfer(req, timeout=30)
    assert resp.id == "typed" and not resp.raw_output_contents
    (o,) = resp.outputs
    assert (o.name, o.datatype, list(o.shape)) == ("output_0", "FP32", [2, 5])
    y = np.array(o.contents.fp32_contents, np.float32).reshape(2, 5)
    np.testing.assert_allclose(y, mlp_reference(served.weights, x), rtol=1e-5, atol=1e-5)
    req = pb.ModelInferRequest(model_name="mixed", model_version="7")
    req.inputs.add(name="ids", datatype="INT64", shape=[3]).contents.int64_contents.extend(
        [0, 2, 5])
    req.inputs.add(name="w", datatype="FP64", shape=[3, 2]).contents.fp64_contents.extend(
        [1, 2, 3, 4, 5, 6])
    resp = stub.ModelInfer(req, timeout=30)
    out = {o.name: o for o in resp.outputs}
    assert list(out["s"].contents.fp64_contents) == [31.0, 38.0]   # ids @ w
    assert list(out["flag"].contents.bool_contents) == [False, True, True]
    req.parameters["raw_output"].bool_param = True       # the client asks for raw
    resp = stub.ModelInfer(req, timeout=30)
    assert len(resp.raw_output_contents) == 2
    assert np.frombuffer(resp.raw_output_contents[0], "<f8").tolist() == [31.0, 38.0]


def test_errors_map_to_grpc_status_codes(served, client, stub):
    from sampan.serving.proto import inference_pb2 as pb
    x = _x(1)
    e = _raises(client, "nosuch", [_input("x", x, "FP32")])
    assert e.status() == "StatusCode.NOT_FOUND" and "unknown model 'nosuch'" in e.message()
    e = _raises(client, "mlp", [_input("x", x, "FP32")], model_version="9")
    assert e.status() == "StatusCode.NOT_FOUND" and "no version '9'" in e.message()
    e = _raises(client, "mlp", [_input("x", np.zeros((1, 13), np.float32), "FP32")])
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and "[-1, 12]" in e.message()
    e = _raises(client, "mlp", [_input("x", x.astype(np.float64), "FP64")])
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and "expects FP32" in e.message()
    e = _raises(client, "mlp", [_input("x", x, "FP32")],
                outputs=[grpcclient.InferRequestedOutput("zz")])
    assert "unknown output 'zz'" in e.message()
    with pytest.raises(InferenceServerException) as ei:
        client.get_model_metadata("nosuch")
    assert ei.value.status() == "StatusCode.NOT_FOUND"
    # raw bytes that do not fit the shape, typed values in the wrong field, range
    req = pb.ModelInferRequest(model_name="mlp")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 12])
    req.raw_input_contents.append(b"\0" * 47)
    with pytest.raises(grpc.RpcError) as ei:
        stub.ModelInfer(req, timeout=30)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "47 bytes" in ei.value.details() and "needs 48" in ei.value.details()
    req = pb.ModelInferRequest(model_name="mlp")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 12]).contents.fp64_contents.extend(
        [0.0] * 12)
    with pytest.raises(grpc.RpcError) as ei:
        stub.ModelInfer(req, timeout=30)
    assert "contents.fp32_contents" in ei.value.details()


def test_admission_and_deadlines_are_the_data_planes(served, client):
    """The slow model (one worker, a queue of 2) refuses the overflow with UNAVAILABLE
    and a retry-after; a call whose deadline is shorter than the queue ends
    DEADLINE_EXCEEDED."""
    x = np.ones((1, 4), np.float32)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futs = [pool.submit(client.infer, "slow", [_input("x", x, "FP32")])
                for _ in range(6)]
        codes = []
        for f in futs:
            try:
                f.result()
                codes.append("OK")
            except InferenceServerException as e:
                codes.append(e.status())
    assert "StatusCode.UNAVAILABLE" in codes and "OK" in codes
    e = _raises(client, "slow", [_input("x", x, "FP32")], client_timeout=0.05)
    assert e.status() == "StatusCode.DEADLINE_EXCEEDED"


def test_grpc_shares_batching_and_metrics_with_http(served, client):
    e = served.entries["mlp"]

    def count():
        text = httpx.get(f"{served.url}/metrics").text
        line = [ln for ln in text.splitlines() if ln.startswith("sampan_requests_total{")
                and 'model="mlp"' in ln and 'status="200"' in ln]
        return float(line[0].split()[-1]) if line else 0.0
    before, batched = count(), e.batcher.batched
    xs = [_x(1, s) for s in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        rs = list(pool.map(lambda x: client.infer("mlp", [_input("x", x, "FP32")]), xs))
    for x, r in zip(xs, rs):
        np.testing.assert_allclose(r.as_numpy("output_0"), mlp_reference(served.weights, x),
                                   rtol=1e-5, atol=1e-5)
    assert count() == before + 16
    assert e.batcher.batched > batched        # some of them ran together


@pytest.mark.parametrize("impl", IMPLS)
def test_a_bare_data_plane_served_over_grpc_alone(impl):
    """A front end on a thread and loop of its own, for a DataPlane without HTTP."""
    from sampan.serving import DataPlane
    from sampan.serving.grpc_server import front_end

    from ._models import Slow
    plane = DataPlane.build({"slow": Slow("slow", 0.0)}, instances=1)
    plane.start(warmup=False)
    fe = front_end(impl)(plane, "127.0.0.1", 0).start()
    try:
        c = grpcclient.InferenceServerClient(fe.address)
        assert c.is_server_live() and c.is_model_ready("slow")
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        np.testing.assert_array_equal(c.infer("slow", [_input("x", x, "FP32")]).as_numpy("y"),
                                      2 * x)
        c.close()
    finally:
        fe.stop(1.0)
        plane.stop()
    assert fe._thread is None


@pytest.mark.parametrize("impl", IMPLS)
def test_a_grpc_port_in_use_fails_the_start_naming_it(impl):
    import socket

    from sampan.serving import Server, ServingError

    from ._models import Slow
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = held.getsockname()[1]
    try:
        with pytest.raises(ServingError) as e:
            Server({"slow": Slow("slow", 0.0)}, grpc_port=port, warmup=False,
                   grpc_impl=impl).start(timeout=30)
        assert str(port) in str(e.value)
    finally:
        held.close()
