"""The native gRPC front end's own parts (`grpc_native.py`, `grpc_hpack.py`), against
independent references: the ``hpack`` package's encoder and RFC 7541's examples for the
HPACK decoder, grpcio's client (small flow-control windows, gzip, unknown methods,
percent-encoded messages, trailing metadata) and raw sockets for what no client sends."""
import socket
import struct
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
hpack = pytest.importorskip("hpack")

from sampan.serving.grpc_hpack import Decoder, HpackError, literal  # noqa: E402
from sampan.serving.model import ServedModel, TensorSpec  # noqa: E402

SERVICE = "/inference.GRPCInferenceService/"


# ---------------------------------------------------------------- HPACK
def test_rfc7541_c4_requests_with_huffman_decode_in_order():
    d = Decoder()
    assert d.decode(bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff")) == [
        (b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"),
        (b":authority", b"www.example.com")]
    assert d.decode(bytes.fromhex("828684be5886a8eb10649cbf")) == [
        (b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"),
        (b":authority", b"www.example.com"), (b"cache-control", b"no-cache")]
    assert d.decode(bytes.fromhex("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf")) == [
        (b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/index.html"),
        (b":authority", b"www.example.com"), (b"custom-key", b"custom-value")]
    assert d.size == 164            # the table of RFC 7541 C.4.3


@pytest.mark.parametrize("huffman", [True, False])
def test_decoder_follows_hpack_encoder_over_many_blocks(huffman):
    """Blocks from the reference encoder, with indexing, eviction (a small table),
    sensitive (never-indexed) fields and a table size change midway."""
    rng = np.random.default_rng(7)
    enc, d = hpack.Encoder(), Decoder(max_table=4096)
    names = [b"grpc-timeout", b"x-a", b"x-long", b"user-agent", b"content-type"]
    for i in range(300):
        if i == 150:
            enc.header_table_size = 256         # the encoder emits a size update
        fields = [(b":method", b"POST"), (b":path", SERVICE.encode() + b"ModelInfer")]
        for _ in range(int(rng.integers(0, 6))):
            name = names[int(rng.integers(len(names)))]
            value = bytes(rng.integers(32, 127, int(rng.integers(0, 60))).astype(np.uint8))
            fields.append((name, value))
        sensitive = [hpack.NeverIndexedHeaderTuple(*f) if k % 3 == 2 else f
                     for k, f in enumerate(fields)]
        assert d.decode(enc.encode(sensitive, huffman=huffman)) == fields, i
    assert d.max_size == 256 and d.size <= 256


def test_a_repeated_block_follows_the_table_it_indexes():
    """The same bytes (index 62: the newest entry) decode to what the table holds now."""
    d, again = Decoder(), bytes([0x80 | 62])
    add = b"\x40" + bytes([3]) + b"x-a" + bytes([1]) + b"1"     # literal, indexed
    assert d.decode(add) == [(b"x-a", b"1")]
    assert d.decode(again) == [(b"x-a", b"1")] and d.decode(again) == [(b"x-a", b"1")]
    d.decode(add.replace(b"1", b"2"))
    assert d.decode(again) == [(b"x-a", b"2")]
    assert d.decode(b"\x20") == [] and d.size == 0           # a size update to 0 empties it
    with pytest.raises(HpackError):
        d.decode(again)


def test_literal_is_what_hpack_decodes():
    block = literal(b"grpc-status", b"13") + literal(b"grpc-message", b"x" * 300)
    assert hpack.Decoder().decode(block, raw=True) == [(b"grpc-status", b"13"),
                                                        (b"grpc-message", b"x" * 300)]


@pytest.mark.parametrize("block, why", [
    (b"\xff\x80\x80\x80\x80\x80\x01", "integer"),         # 6 continuation bytes
    (b"\xbe", "index 62"),                                # an empty dynamic table
    (b"\x80", "index 0"),
    (b"\x00\x05ab", "past the block"),                    # a 5-byte name, 2 there
    (b"\x3f\xe2\x1f", "table size"),                      # size update to 4097 bytes
    (b"\x40", "ends inside"),
])
def test_malformed_blocks_raise_hpack_error(block, why):
    with pytest.raises(HpackError) as e:
        Decoder(max_table=4096).decode(block)
    assert why.split()[0] in str(e.value)


def test_random_bytes_decode_or_raise_hpack_error_only():
    rng = np.random.default_rng(3)
    d, raised = Decoder(), 0
    for i in range(20000):
        if i % 500 == 0:
            d = Decoder()
        try:
            d.decode(rng.integers(0, 256, int(rng.integers(0, 13))).astype(np.uint8).tobytes())
        except HpackError:
            raised += 1
    assert 0 < raised < 20000


# ---------------------------------------------------------------- the server
class Echo(ServedModel):
    """y = 2x for an FP32 vector of any length (no batching)."""

    def __init__(self):
        super().__init__(name="echo", inputs=[TensorSpec("x", "FP32", (-1,))],
                         outputs=[TensorSpec("y", "FP32", (-1,))], max_batch_size=0)

    def infer(self, inputs):
        return {"y": inputs["x"] * 2}


@pytest.fixture(scope="module")
def fe():
    from sampan.serving import DataPlane
    from sampan.serving.grpc_native import NativeGrpcFrontEnd

    from ._models import Slow
    plane = DataPlane.build({"echo": Echo(), "slow": Slow("slow", 0.3, max_queue_size=1)},
                            instances=1)
    plane.start(warmup=False)
    f = NativeGrpcFrontEnd(plane, "127.0.0.1", 0, max_message_bytes=4 << 20).start()
    yield f
    f.stop(1.0)
    plane.stop()


def _echo_request(x):
    from sampan.serving.proto import inference_pb2 as pb
    req = pb.ModelInferRequest(model_name="echo")
    req.inputs.add(name="x", datatype="FP32", shape=x.shape)
    req.raw_input_contents.append(x.tobytes())
    return req


def _stub(address, **options):
    from sampan.serving.proto import inference_pb2_grpc
    ch = grpc.insecure_channel(address, options=list(options.items()))
    return ch, inference_pb2_grpc.GRPCInferenceServiceStub(ch)


def test_large_messages_both_ways_under_small_client_windows(fe):
    """2 MB in and out while the client opens 16 KiB stream windows (no BDP growth): the
    answer leaves in window-sized pieces as WINDOW_UPDATEs come."""
    x = np.random.default_rng(0).standard_normal(500_000).astype(np.float32)
    ch, stub = _stub(fe.address, **{"grpc.http2.lookahead_bytes": 16384,
                                    "grpc.http2.bdp_probe": 0,
                                    "grpc.max_receive_message_length": 8 << 20})
    try:
        resp = stub.ModelInfer(_echo_request(x), timeout=30)
        np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], "<f4"),
                                      x * 2)
        for _ in range(3):                      # and several at once on one connection
            futs = [stub.ModelInfer.future(_echo_request(x[:100_000]), timeout=30)
                    for _ in range(4)]
            for f in futs:
                assert len(f.result().raw_output_contents[0]) == 400_000
    finally:
        ch.close()


def test_gzip_requests_unknown_methods_and_the_size_limit(fe):
    x = np.arange(1000, dtype=np.float32)
    ch = grpc.insecure_channel(fe.address, compression=grpc.Compression.Gzip)
    from sampan.serving.proto import inference_pb2_grpc
    try:
        resp = inference_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(
            _echo_request(x), timeout=30)
        np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], "<f4"),
                                      2 * x)
        with pytest.raises(grpc.RpcError) as e:     # 4.4 MB of zeros, a few KB gzipped
            inference_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(
                _echo_request(np.zeros(1_100_000, np.float32)), timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "decompresses to more than" in e.value.details()
        for path in (SERVICE + "StreamInfer", "/other.Service/ModelInfer"):
            with pytest.raises(grpc.RpcError) as e:
                ch.unary_unary(path)(b"", timeout=30)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert path in e.value.details()
    finally:
        ch.close()
    ch, stub = _stub(fe.address)
    try:
        with pytest.raises(grpc.RpcError) as e:     # over the server's 4 MiB
            stub.ModelInfer(_echo_request(np.zeros(1_100_000, np.float32)), timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "4194304" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:     # not a ModelInferRequest
            ch.unary_unary(SERVICE + "ModelInfer")(b"\xff\xff\xff", timeout=30)
        assert e.value.code() == grpc.StatusCode.INTERNAL
        assert "ModelInferRequest" in e.value.details()
        r = stub.ModelInfer(_echo_request(x), timeout=30)   # the connection still serves
        assert len(r.raw_output_contents[0]) == 4000
    finally:
        ch.close()


def test_messages_are_percent_encoded_and_retry_after_is_trailing_metadata(fe):
    from sampan.serving.proto import inference_pb2 as pb
    ch, stub = _stub(fe.address)
    try:
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelMetadata(pb.ModelMetadataRequest(name="modèle 100%"), timeout=30)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert "'modèle 100%'" in e.value.details()
        req = pb.ModelInferRequest(model_name="slow")
        req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
        req.raw_input_contents.append(np.ones(4, np.float32).tobytes())
        futs = [stub.ModelInfer.future(req, timeout=30) for _ in range(6)]
        errors = [f.exception() for f in futs if f.exception() is not None]
        assert errors and all(x.code() == grpc.StatusCode.UNAVAILABLE for x in errors)
        assert all("retry-after" in dict(x.trailing_metadata()) for x in errors)
        assert len(errors) < 6                                 # some were answered
    finally:
        ch.close()


def _frame(ftype, flags, sid, payload=b""):
    n = len(payload)
    return struct.pack(">HBBBI", n >> 8, n & 0xFF, ftype, flags, sid) + payload


def _read_frames(sock, until_type, timeout=10.0):
    sock.settimeout(timeout)
    buf, frames = b"", []
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 9:
            n = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + n:
                break
            frames.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big"), buf[9:9 + n]))
            buf = buf[9 + n:]
        if any(f[0] == until_type for f in frames):
            break
    return frames


def test_what_no_grpc_client_sends(fe):
    """An HTTP/1.1 request gets GOAWAY and a closed connection; a PING is answered; a
    GET is answered 405; a client's PUSH_PROMISE is a connection error. The server
    serves on."""
    host, port = fe.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), 10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        frames = _read_frames(s, 7)
        assert frames[0][0] == 4 and frames[-1][0] == 7          # SETTINGS ... GOAWAY
        assert struct.unpack(">II", frames[-1][3][:8])[1] == 1   # PROTOCOL_ERROR
        assert s.recv(100) == b""
    enc = hpack.Encoder()
    with socket.create_connection((host, int(port)), 10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0)
                  + _frame(6, 0, 0, b"12345678")
                  + _frame(1, 0x5, 1, enc.encode([(":method", "GET"), (":scheme", "http"),
                                                   (":path", "/"), (":authority", "x")])))
        frames = _read_frames(s, 1)
        assert (6, 1, 0, b"12345678") in frames                 # PING ACK
        (h,) = [f for f in frames if f[0] == 1]
        assert h[1] & 0x1 and h[2] == 1
        assert hpack.Decoder().decode(h[3], raw=True) == [(b":status", b"405")]
        s.sendall(_frame(1, 0x5, 3, enc.encode([(":method", "POST"), (":scheme", "http"),
                                                 ("content-type", "application/grpc")])))
        frames = _read_frames(s, 1)                              # no :path: UNIMPLEMENTED
        (h,) = [f for f in frames if f[0] == 1 and f[2] == 3]
        assert dict(hpack.Decoder().decode(h[3], raw=True))[b"grpc-status"] == b"12"
        s.sendall(_frame(5, 0x4, 1, b"\0\0\0\x02"))              # PUSH_PROMISE
        frames = _read_frames(s, 7)
        assert struct.unpack(">II", frames[-1][3][:8]) == (3, 1)     # last stream 3
    ch, stub = _stub(fe.address)
    from sampan.serving.proto import inference_pb2 as pb
    try:
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=30).live
    finally:
        ch.close()


def test_a_connection_without_a_preface_is_closed(fe, monkeypatch):
    monkeypatch.setattr(fe, "preface_timeout", 0.2)
    host, port = fe.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), 10) as s:
        t = time.monotonic()
        frames = _read_frames(s, 7)
        assert frames[-1][0] == 7 and b"preface" in frames[-1][3]
        assert s.recv(100) == b"" and time.monotonic() - t < 5


def test_a_client_without_a_header_table_gets_a_size_update_first(fe):
    """SETTINGS_HEADER_TABLE_SIZE 0: the next header block starts with a dynamic table
    size update (RFC 7541 4.2), read by a decoder that allows no table."""
    from sampan.serving.proto import inference_pb2 as pb
    host, port = fe.address.rsplit(":", 1)
    msg = pb.ServerLiveRequest().SerializeToString()
    enc = hpack.Encoder()
    with socket.create_connection((host, int(port)), 10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, struct.pack(">HI", 1, 0))
                  + _frame(1, 0x4, 1, enc.encode([
                      (":method", "POST"), (":scheme", "http"),
                      (":path", SERVICE + "ServerLive"), (":authority", "x"),
                      ("content-type", "application/grpc"), ("te", "trailers")]))
                  + _frame(0, 0x1, 1, b"\0" + len(msg).to_bytes(4, "big") + msg))
        frames = _read_frames(s, 1)
        frames += [] if sum(f[0] == 1 for f in frames) >= 2 else _read_frames(s, 1)
    heads = [f[3] for f in frames if f[0] == 1]
    assert heads[0][:1] == b"\x20"
    d = hpack.Decoder()
    d.max_allowed_table_size = 0
    assert dict(d.decode(heads[0], raw=True))[b":status"] == b"200"
    assert dict(d.decode(heads[1], raw=True))[b"grpc-status"] == b"0"
    (data,) = [f[3] for f in frames if f[0] == 0]
    assert pb.ServerLiveResponse.FromString(data[5:]).live


def test_long_messages_are_cut_between_escapes():
    from sampan.serving.grpc_frames import MESSAGE_MAX, percent_encode
    assert percent_encode("a 100% é") == b"a 100%25 %C3%A9"
    for pad in range(3):
        b = percent_encode("x" * pad + "é" * 5000)
        assert len(b) <= MESSAGE_MAX and b.count(b"%") * 3 == len(b) - pad
        assert bytes.fromhex(b[pad:].replace(b"%", b"").decode()).decode("utf-8", "replace")


def _open_calls(f):
    try:                    # (read from this thread while the server's loop runs)
        return sum(len(c.streams) for c in list(f.conns))
    except RuntimeError:
        return 0


def test_stop_answers_what_runs_then_cancels_past_the_grace():
    """GOAWAY at stop: the calls open on a 0.4 s model are answered within a 5 s grace;
    with a 0.1 s grace the one still queued ends UNAVAILABLE, and the thread ends."""
    from sampan.serving import DataPlane
    from sampan.serving.grpc_native import NativeGrpcFrontEnd
    from sampan.serving.proto import inference_pb2 as pb

    from ._models import Slow
    req = pb.ModelInferRequest(model_name="slow")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(np.ones(4, np.float32).tobytes())
    for grace, want in ((5.0, grpc.StatusCode.OK), (0.1, grpc.StatusCode.UNAVAILABLE)):
        plane = DataPlane.build({"slow": Slow("slow", 0.4)}, instances=1)
        plane.start(warmup=False)
        f = NativeGrpcFrontEnd(plane, "127.0.0.1", 0).start()
        ch, stub = _stub(f.address)
        try:
            futs = [stub.ModelInfer.future(req, timeout=30) for _ in range(2)]
            t_end = time.monotonic() + 20       # both calls at the server, one running
            while _open_calls(f) < 2 and time.monotonic() < t_end:
                time.sleep(0.01)
            time.sleep(0.05)
            f.stop(grace)
            codes = [grpc.StatusCode.OK if x.exception() is None else x.exception().code()
                     for x in futs]
            if want == grpc.StatusCode.OK:
                assert codes == [want, want], codes
            assert want in codes, codes
            assert f._thread is None
        finally:
            ch.close()
            plane.stop()


def test_inflate_reads_gzip_and_deflate_and_names_the_rest():
    import zlib

    from sampan.serving.grpc_frames import CallError, inflate
    msg = bytes(range(256)) * 40
    gz = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    assert inflate(b"gzip", gz.compress(msg) + gz.flush(), len(msg)) == msg
    assert inflate(b"deflate", zlib.compress(msg), len(msg)) == msg
    for enc, data, code in ((b"snappy", b"x", "UNIMPLEMENTED"),
                            (b"gzip", b"not gzip", "INTERNAL"),
                            (b"deflate", zlib.compress(msg), "RESOURCE_EXHAUSTED")):
        with pytest.raises(CallError) as e:
            inflate(enc, data, len(msg) - 1)
        assert e.value.grpc_code == code
