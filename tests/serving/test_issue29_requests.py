"""Issue 29, item 4: every malformed infer request is answered with a 4xx JSON error and
counted in /metrics; nothing a client sends makes the decoder raise anything else.

The fuzz test drives `protocol.decode` (and the request's timeout parameters) directly
with seeded random JSON shapes, header values and binary lengths; a few of the requests
that used to escape as bare 500s go through a real server on 127.0.0.1."""
import json
import math
import random
import time

import httpx
import numpy as np
import pytest

from sampan.serving import protocol
from sampan.serving.batcher import RequestError
from sampan.serving.model import ServedModel, TensorSpec


class Two(ServedModel):
    """x FP32[-1, 3], ids INT64[-1, 2] (batched); y = x.sum(1) + ids.sum(1)."""

    def __init__(self, name="two"):
        super().__init__(name=name,
                         inputs=[TensorSpec("x", "FP32", (-1, 3)),
                                 TensorSpec("ids", "INT64", (-1, 2))],
                         outputs=[TensorSpec("y", "FP64", (-1,))], max_batch_size=8,
                         config={"dynamic_batching": {"max_queue_delay_us": 100}})

    def infer(self, inputs):
        return {"y": inputs["x"].sum(1).astype(np.float64) + inputs["ids"].sum(1)}


class Flags(ServedModel):
    """No batch dim: f BOOL[4], u UINT8[2] -> n INT64[1] (how many flags are set)."""

    def __init__(self, name="flags"):
        super().__init__(name=name, inputs=[TensorSpec("f", "BOOL", (4,)),
                                            TensorSpec("u", "UINT8", (2,))],
                         outputs=[TensorSpec("n", "INT64", (1,))], max_batch_size=0)

    def infer(self, inputs):
        return {"n": np.array([int(inputs["f"].sum())])}


# ------------------------------------------------------------------ the fuzzer
_ATOMS = [None, True, False, 0, 1, -1, 2, 3, 7, 2**63, -2**70, 1.5, -0.0, 1e308,
          float("nan"), float("inf"), float("-inf"), "", "x", "ids", "f", "u", "y", "n",
          "FP32", "INT64", "BOOL", "UINT8", "FP16", "²", "\u0663", "\x00", "binary_data_size"]
_KEYS = ["name", "datatype", "shape", "data", "parameters", "inputs", "outputs", "id",
         "binary_data_size", "binary_data", "binary_data_output", "timeout", "timeout_ms",
         "x", "ids", "f", "u", "", "\u0663"]


def _value(r, depth=0):
    k = r.random()
    if depth > 4 or k < 0.45:
        return r.choice(_ATOMS)
    if k < 0.7:
        return [_value(r, depth + 1) for _ in range(r.randrange(5))]
    return {r.choice(_KEYS): _value(r, depth + 1) for _ in range(r.randrange(5))}


def _spec_input(r, spec, rows, clean):
    """A plausible input entry for `spec`, mutated unless `clean`: the fuzzer mostly
    reaches the checks after JSON parsing this way."""
    shape = [rows if d == -1 else d for d in spec.shape]
    if not clean and r.random() < 0.2:
        shape = _value(r, 2)
    n = math.prod(shape) if isinstance(shape, list) and all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 50 for d in shape) else 3
    j = {"name": spec.name, "datatype": spec.datatype, "shape": shape}
    size = n * {"FP32": 4, "INT64": 8, "BOOL": 1, "UINT8": 1}[spec.datatype]
    if clean:
        j["data"] = [r.choice([0, 1]) for _ in range(n)]
        return j, 0
    if r.random() < 0.5:
        j["data"] = [r.choice([0, 1, 2.5, -3, True, 300, -129, 2**40]) for _ in range(n)]
        if r.random() < 0.3:
            j["data"] = _value(r, 1)
        size = 0
    else:
        size = r.choice([size, size, size + 1, -1, 0, 2**64, "8", 1.0, None])
        j["parameters"] = {"binary_data_size": size}
        size = size if isinstance(size, int) and 0 <= size < 1000 else 0
    for _ in range(r.choice([0, 0, 0, 1, 2])):
        key = r.choice(_KEYS)
        j[key] = _value(r, 2)
    return j, size


def _request(r, model):
    """(body bytes, Inference-Header-Content-Length header or None)."""
    clean = r.random() < 0.3
    nblob = 0
    if not clean and r.random() < 0.1:
        head = json.dumps(_value(r)).encode()
    else:
        rows = r.choice([0, 1, 2, 3, 4])
        req = {"inputs": []}
        for s in model.inputs:
            if clean or r.random() < 0.9:
                j, size = _spec_input(r, s, rows if clean or r.random() < 0.9 else 2,
                                      clean)
                req["inputs"].append(j)
                nblob += size
        if clean:
            return json.dumps(req).encode(), None
        if r.random() < 0.3:
            req["outputs"] = [r.choice([{"name": "y"}, {"name": "n"}, {"name": ["y"]},
                                        {"name": {"a": 1}}, "y", 3, {"name": "y",
                                        "parameters": _value(r, 3)}])]
        if r.random() < 0.4:
            req["parameters"] = r.choice([
                {"timeout": r.choice(_ATOMS)}, {"timeout_ms": r.choice(_ATOMS)},
                {"binary_data_output": r.choice(_ATOMS)}, _value(r, 3)])
        if r.random() < 0.2:
            req["id"] = _value(r, 3)
        head = json.dumps(req, allow_nan=True).encode()
    if r.random() < 0.1:                       # a corrupted header
        i = r.randrange(len(head) + 1)
        head = head[:i] + bytes([r.randrange(256)]) + head[i + 1:]
    nblob = nblob if r.random() < 0.7 else r.choice([0, 1, 3, 8, 24, 40])
    blob = bytes(r.choice([0, 1, r.randrange(256)]) for _ in range(nblob))
    body = head + blob
    hl = None
    if blob or r.random() < 0.3:
        hl = r.choice([str(len(head)), str(len(head)), str(len(head) - 1), "0", "-1", "²",
                       "\u0663", " 5", "+3", "1e3", "", "99999999999999999999",
                       str(len(body) + 1), "0x10"])
    return body, hl


def _decode_and_check(model, body, hl, plans):
    """What the server does with a body: decode, read its timeout, encode an answer."""
    dec = protocol.decode(model, body, hl, plans)
    protocol.timeout_s(model, dec.params)
    if model.max_batch_size > 0:
        rows = next(iter(dec.inputs.values())).shape[0]
        fake = {"y": np.zeros(rows)}
    else:
        fake = {"n": np.zeros(1, np.int64)}
    protocol.encode(model, dec, fake)
    return dec


def test_fuzzed_requests_raise_only_4xx_request_errors():
    r = random.Random(29)
    models = [Two(), Flags()]
    plans = [{}, {}]
    counts = {"ok": 0, "4xx": 0}
    t_end = time.monotonic() + 4.0
    n = 0
    while n < 20000 and time.monotonic() < t_end:
        k = r.randrange(2)
        body, hl = _request(r, models[k])
        try:
            _decode_and_check(models[k], body, hl, plans[k])
            counts["ok"] += 1
        except RequestError as e:
            assert 400 <= e.status < 500, (body, hl, e)
            assert str(e)
            counts["4xx"] += 1
        except Exception as e:  # noqa: BLE001 -- the failure names the request
            pytest.fail(f"decode raised {type(e).__name__}: {e} for body {body[:300]!r} "
                        f"and header length {hl!r}")
        n += 1
    assert n >= 300 and counts["ok"] > 10 and counts["4xx"] > 100, counts


@pytest.mark.parametrize("body,hl,match", [
    (b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]},'
     b'{"name":"ids","datatype":"INT64","shape":[1,2],"data":[1,2]}],'
     b'"parameters":{"timeout":NaN}}', None, "timeout"),
    (b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]},'
     b'{"name":"ids","datatype":"INT64","shape":[1,2],"data":[1,2]}],'
     b'"parameters":{"timeout_ms":Infinity}}', None, "timeout_ms"),
    (b"[" * 100_000 + b"]" * 100_000, None, "nested too deeply"),
    (b'{"inputs":[]}', "\u00b2", "Inference-Header-Content-Length"),
    (b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]},'
     b'{"name":"ids","datatype":"INT64","shape":[1,2],"data":[1,2]}],'
     b'"outputs":[{"name":["y"]}]}', None, "unknown output"),
    (b'{"inputs":[{"name":"ids","datatype":"INT64","shape":[1,2],"data":[1,2]},'
     b'{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}],'
     b'"parameters":{"timeout":1e300}}', None, None),
])
def test_known_bad_requests_are_400(body, hl, match):
    m = Two()
    for plans in (None, {}):
        if match is None:
            dec = _decode_and_check(m, body, hl, plans)   # a huge timeout is clamped
            assert protocol.timeout_s(m, dec.params) == 1e6
            continue
        with pytest.raises(RequestError, match=match) as e:
            _decode_and_check(m, body, hl, plans)
        assert e.value.status == 400


def test_out_of_range_and_non_boolean_values_are_refused():
    m = Flags()
    ok = {"name": "f", "datatype": "BOOL", "shape": [4], "data": [True, False, True, True]}
    for u, match in [([300, 1], r"\[0, 255\]"), ([-1, 1], r"\[0, 255\]"),
                     ([2**64, 1], "uint64|object|integers")]:
        body = json.dumps({"inputs": [ok, {"name": "u", "datatype": "UINT8", "shape": [2],
                                           "data": u}]}).encode()
        with pytest.raises(RequestError, match=match):
            protocol.decode(m, body)
    head = json.dumps({"inputs": [
        {"name": "f", "datatype": "BOOL", "shape": [4], "parameters": {"binary_data_size": 4}},
        {"name": "u", "datatype": "UINT8", "shape": [2], "data": [1, 2]}]}).encode()
    with pytest.raises(RequestError, match="0 or 1"):
        protocol.decode(m, head + b"\x00\x01\x07\x01", str(len(head)))
    dec = protocol.decode(m, head + b"\x00\x01\x01\x01", str(len(head)))
    assert dec.inputs["f"].tolist() == [False, True, True, True]


# ------------------------------------------------------------------ through a real server
@pytest.fixture(scope="module")
def server():
    from sampan.serving import Server
    s = Server({"two": Two(), "flags": Flags()}, max_body_bytes=4 << 20).start()
    try:
        yield s
    finally:
        s.stop()


def _failures(url):
    """{(model, status): count} of sampan_request_failures_total."""
    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("sampan_request_failures_total{"):
            labels, v = line[len("sampan_request_failures_total{"):].split("} ")
            d = dict(kv.split("=") for kv in labels.split(","))
            out[(d["model"].strip('"'), int(d["status"].strip('"')))] = float(v)
    return out


def test_malformed_requests_through_the_server_are_counted_4xx(server):
    url = server.url + "/v2/models/two/infer"
    good = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]},
                       {"name": "ids", "datatype": "INT64", "shape": [1, 2], "data": [4, 5]}]}
    bad = [
        (json.dumps(dict(good, parameters={"timeout": float("nan")})).encode(), {}),
        (b"[" * 100_000 + b"]" * 100_000, {}),
        (json.dumps(good).encode(), {"Inference-Header-Content-Length": "\u00b2".encode()}),
        (json.dumps(dict(good, outputs=[{"name": ["y"]}])).encode(), {}),
    ]
    before = _failures(server.url).get(("two", 400), 0)
    with httpx.Client(timeout=30) as c:
        for body, headers in bad:
            h = {"Content-Type": "application/json", **headers}
            resp = c.post(url, content=body, headers=h)
            assert resp.status_code == 400, (body[:80], resp.status_code, resp.text[:200])
            assert resp.headers["content-type"] == "application/json"
            assert resp.json()["error"]
        r = c.post(url, json=good)                 # the server still answers a good one
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [15.0]
    assert _failures(server.url).get(("two", 400), 0) - before == len(bad)
    assert not any(s >= 500 for (_m, s) in _failures(server.url))


def test_fuzzed_body_headers_and_chunks_raise_only_4xx_request_errors():
    """The body reader under random Content-Length / Content-Encoding values and chunk
    sequences (gzip and deflate bodies, truncated or not, past the limit or not)."""
    import asyncio
    import gzip
    import zlib

    from sampan.serving.app import _read_body

    r = random.Random(7)
    payload = json.dumps({"inputs": [{"name": "x", "data": list(range(50))}]}).encode()
    encoded = {None: payload, "identity": payload, "gzip": gzip.compress(payload),
               "deflate": zlib.compress(payload), "br": payload, "GZIP": payload,
               "\u00b2": payload}

    async def one(length, enc, chunks, limit):
        it = iter(chunks)

        async def receive():
            c = next(it, None)
            if c is None:
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": c[0], "more_body": c[1]}
        return await _read_body(receive, length, enc, limit, timeout=5)

    async def main():
        seen = {"ok": 0, "4xx": 0, "gone": 0}
        for _ in range(400):
            enc = r.choice(list(encoded))
            data = encoded[enc]
            if r.random() < 0.3:
                data = data[:r.randrange(len(data) + 1)]
            if r.random() < 0.2:
                data = bytes(r.randrange(256) for _ in range(r.randrange(40)))
            cuts = sorted(r.randrange(len(data) + 1) for _ in range(r.randrange(4)))
            parts = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
            chunks = [(p, True) for p in parts[:-1]] + [(parts[-1], r.random() < 0.1)]
            length = r.choice([None, str(len(data)), "²", "-1", "1" * 30, "12abc", ""])
            limit = r.choice([10, 1 << 20, 1 << 20])
            try:
                out = await one(length, enc, chunks, limit)
                assert isinstance(out, bytes) and len(out) <= limit
                seen["ok"] += 1
            except RequestError as e:
                assert 400 <= e.status < 500, e
                seen["4xx"] += 1
            except Exception as e:  # noqa: BLE001
                if type(e).__name__ == "_Disconnected":
                    seen["gone"] += 1
                    continue
                pytest.fail(f"_read_body raised {type(e).__name__}: {e} for "
                            f"{(length, enc, limit, chunks)!r:.300}")
        return seen

    seen = asyncio.run(main())
    assert seen["ok"] > 20 and seen["4xx"] > 20, seen
