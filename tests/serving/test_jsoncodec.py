"""The JSON codec of request and response bodies (issue 32): orjson when installed, with
the standard library's results on the protocol's test vectors: the same parsed values
(NaN/Infinity literals, huge integers, UTF-16 bodies, nesting), the same decoded arrays
or the same 400 message, and responses that parse to the same values in each output's
datatype (FP32/FP16 written in their own shortest form), non-finite floats written as
the standard library writes them."""
import json
import math

import numpy as np
import pytest

from sampan.serving import RequestError, jsoncodec, protocol, v1
from sampan.serving.model import ServedModel, TensorSpec

pytest.importorskip("orjson")


@pytest.fixture
def both():
    """Run a function under each backend: returns [(orjson result), (json result)]."""
    def run(fn, *a):
        out = []
        for b in ("orjson", "json"):
            prev = jsoncodec.set_backend(b)
            try:
                out.append(_outcome(fn, *a))
            finally:
                jsoncodec.set_backend(prev)
        return out
    return run


def _outcome(fn, *a):
    try:
        return ("ok", fn(*a))
    except RecursionError:
        return ("err", "RecursionError")
    except RequestError as e:
        return ("err", (e.status, str(e)))
    except ValueError as e:
        return ("err", type(e).__name__)


def test_integers_beyond_64_bits_are_read_as_floats_by_orjson_only(both):
    fast, std = both(jsoncodec.loads, b"[123456789012345678901234567890]")
    assert std == ("ok", [123456789012345678901234567890])
    assert fast == ("ok", [float(123456789012345678901234567890)])   # hence decode_checked


def _same(a, b):
    """Equal, NaN equal to NaN, walking lists and dicts."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) ==
                                                    math.copysign(1, b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


TEXTS = [b'{"a": [1, 2.5, -0.0, 5e-324, 1e308]}', b'[NaN, Infinity, -Infinity]',
         b'[18446744073709551615, -9223372036854775808]', b'[1e400, -1e400]',
         b'{"a": 1, "a": 2}', '{"\u00e9": "\\u00e9\\n"}'.encode(), b'"\\ud800"',
         '[1.5]'.encode("utf-16"), b'\xef\xbb\xbf[1]', b'[1] x', b'', b'[', b'{"a" 1}',
         b'[' * 100000 + b']' * 100000, b'[' * 200 + b']' * 200, b'\xff', b'[0.1, 1E-7]',
         b'[true, false, null]', b'  {"x" : [ [1, 2], [3, 4] ] }  ']


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_loads_gives_the_standard_librarys_result(both, text):
    fast, std = both(jsoncodec.loads, text)
    assert fast[0] == std[0]
    assert _same(fast[1], std[1]) if fast[0] == "ok" else fast[1] == std[1]
    if std[0] == "ok":
        assert _same(std[1], json.loads(text))


class Model(ServedModel):
    def __init__(self):
        super().__init__(name="vec", inputs=[
            TensorSpec("f", "FP32", (-1, 2)), TensorSpec("h", "FP16", (-1, 2)),
            TensorSpec("d", "FP64", (-1, 2)), TensorSpec("i", "INT64", (-1, 2)),
            TensorSpec("b", "BOOL", (-1, 2))], outputs=[
            TensorSpec(n, dt, (-1, 2)) for n, dt in (("f", "FP32"), ("h", "FP16"),
                                                     ("d", "FP64"), ("i", "INT64"),
                                                     ("b", "BOOL"), ("u", "UINT8"))],
            max_batch_size=8)


M = Model()


def _req(**over):
    ins = {"f": ("FP32", [[0.1, -2.5]]), "h": ("FP16", [0.1, 65504]),
           "d": ("FP64", [1e-300, 5e-324]), "i": ("INT64", [2 ** 62, -3]),
           "b": ("BOOL", [True, False])}
    ins.update(over)
    return {"id": "v", "inputs": [{"name": n, "datatype": dt, "shape": [1, 2], "data": d}
                                  for n, (dt, d) in ins.items()]}


def _text(req):
    return req if isinstance(req, bytes) else json.dumps(req).encode()


DECODE = [_req(), _req(f=("FP32", [math.nan, math.inf])), _req(h=("FP16", [1e5, 0])),
          _req(f=("FP32", [1e39, 0])), _req(i=("INT64", [2 ** 63, 0])),
          _req(i=("INT64", [2 ** 64, 0])),
          _req(i=("INT64", [10 ** 30, 0])), _req(f=("FP32", [10 ** 30, 10 ** 400])),
          _req(i=("INT64", [1.5, 0])), _req(b=("BOOL", [2, 0])),
          _req(f=("BF16", [1.0, 2.0])), _req(f=("BYTES", ["a", "b"])),
          _req(f=("FP32", [[[0.5], [1.5]]])), _req(f=("FP32", [1, 2, 3])),
          _req(f=("FP32", "nope")), b'{"inputs": [NaN]}', b'{"inputs": ', b'[]',
          _text(_req()).replace(b'0.1,', b'1e999,'),
          _text(_req()).replace(b'"id": "v"', b'"id": 12345678901234567890123')]


def _decoded(body):
    dec = protocol.decode(M, body)
    return {n: (a.dtype.str, a.shape, a.tobytes()) for n, a in dec.inputs.items()}, dec.id


@pytest.mark.parametrize("req", DECODE, ids=range(len(DECODE)))
def test_decode_gives_the_same_arrays_or_the_same_400(both, req):
    fast, std = both(_decoded, _text(req))
    assert fast == std


RESULTS = [{"f": np.array([[0.1, -2.5]], np.float32), "h": np.array([[0.1, 65504]], np.float16),
            "d": np.array([[1e-300, 5e-324]]), "i": np.array([[2 ** 62, -3]], np.int64),
            "b": np.array([[True, False]]), "u": np.array([[0, 255]], np.uint8)},
           {"f": np.array([[np.nan, np.inf]], np.float32),
            "h": np.array([[-np.inf, 1.0]], np.float16), "d": np.array([[np.nan, -0.0]])},
           {"f": np.zeros((0, 2), np.float32), "d": np.arange(4.0).reshape(2, 2)[:, ::-1],
            "i": np.array([[1, 2], [3, 4]], np.int64).T[:1]}]


def _v2_values(body):
    out = json.loads(body)
    return {o["name"]: np.asarray(o["data"], protocol.DATATYPES[o["datatype"]]).reshape(
        o["shape"]) for o in out["outputs"]}, {k: v for k, v in out.items() if k != "outputs"}


@pytest.mark.parametrize("k", range(len(RESULTS)))
def test_encode_parses_to_the_same_values_in_each_datatype(both, k):
    res = RESULTS[k]
    dec = protocol.Decoded("v", {}, {n: False for n in res}, {}, False)
    fast, std = both(protocol.encode, M, dec, res)
    assert fast[0] == std[0] == "ok" and fast[1][1] is None
    (fv, fmeta), (sv, smeta) = _v2_values(fast[1][0]), _v2_values(std[1][0])
    assert fmeta == smeta
    for n, a in res.items():
        assert fv[n].dtype == sv[n].dtype == a.dtype.newbyteorder("=")
        assert fv[n].tobytes() == sv[n].tobytes() == a.astype(fv[n].dtype).tobytes(), n
    # the standard library's bytes are those of the protocol before the codec
    name_of = {v: d for d, v in protocol.DATATYPES.items()}
    old = {"model_name": "vec", "model_version": "1",
           "outputs": [{"name": n, "datatype": name_of[a.dtype], "shape": list(a.shape),
                        "data": a.ravel().tolist()} for n, a in res.items()], "id": "v"}
    assert std[1][0] == json.dumps(old, separators=(",", ":")).encode()
    if any(np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all()
           for a in res.values()):
        assert b"NaN" in fast[1][0] or b"Infinity" in fast[1][0]


def test_v1_answers_parse_the_same(both):
    from ._custom_classes import Pair
    from sampan.serving.custom import CustomModel
    m = CustomModel("pair", Pair, {})
    res = {"s": np.array([np.nan, 1.5]), "d": np.array([[0.1, 2], [3, np.inf]], np.float32)}
    for row in (True, False):
        dec = v1.V1Decoded(None, {}, {}, {}, False)
        dec.row = row
        fast, std = both(v1.encode, m, dec, res)
        f, s = json.loads(fast[1][0]), json.loads(std[1][0])
        key = "predictions" if row else "outputs"
        assert list(f) == list(s) == [key]
        ff = f[key] if not row else {n: [r[n] for r in f[key]] for n in ("s", "d")}
        ss = s[key] if not row else {n: [r[n] for r in s[key]] for n in ("s", "d")}
        for n, a in res.items():
            assert np.asarray(ff[n], a.dtype).tobytes() == np.asarray(ss[n], a.dtype) \
                .tobytes() == a.tobytes()


def test_backend_switch_and_fallback():
    assert jsoncodec.backend() == "orjson"
    with pytest.raises(ValueError, match="'orjson' or 'json'"):
        jsoncodec.set_backend("simdjson")
    assert jsoncodec.dumps({"a": np.float32(0.5), "b": np.arange(2)}) == b'{"a":0.5,"b":[0,1]}'
    assert jsoncodec.dumps({"x": None}) == b'{"x":null}'
    assert jsoncodec.dumps([2 ** 70]) == b"[1180591620717411303424]"
