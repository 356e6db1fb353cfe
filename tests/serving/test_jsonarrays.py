"""The JSON number lists of an infer request parsed by sampan.serving.jsonarrays (the data
plane's fast path: `protocol.decode(..., defer=True)`, values parsed by the batch's worker)
against the reference: numpy's array of the standard library's `json.loads` of the same
text (float32 bit for bit, integers exactly). Whatever the fast path declines (values
near a float32 tie, NaN, strings, nested lists, a wrong count, decoy "data" keys) must
come out as the slow path gives it: the same values or the same 400."""
import asyncio
import json

import numpy as np
import pytest

from sampan.serving import DataPlane, RequestError, jsonarrays, protocol
from sampan.serving.model import ServedModel, TensorSpec

pytestmark = pytest.mark.skipif(not jsonarrays.available(), reason="needs numba")


class Echo(ServedModel):
    """x (FP32 [-1, n]) and ids (INT64 [-1, n]) back as y and k; batching on."""

    def __init__(self, n=100, xtype="FP32", itype="INT64"):
        super().__init__(name="echo", inputs=[TensorSpec("x", xtype, (-1, n)),
                                              TensorSpec("ids", itype, (-1, n))],
                         outputs=[TensorSpec("y", xtype, (-1, n)),
                                  TensorSpec("k", itype, (-1, n))],
                         max_batch_size=16, config={"dynamic_batching": {
                             "max_queue_delay_us": 20000}})

    def infer(self, inputs):
        return {"y": inputs["x"].copy(), "k": inputs["ids"].copy()}


def _text(values):
    return "[" + ", ".join(values) + "]"


def _body(xtext, idtext, n, rows=1, **extra):
    return (('{"inputs": [{"name": "x", "datatype": "FP32", "shape": [%d, %d], "data": %s},'
             ' {"name": "ids", "datatype": "INT64", "shape": [%d, %d], "data": %s}]%s}')
            % (rows, n, xtext, rows, n, idtext,
               "".join(f", {json.dumps(k)}: {json.dumps(v)}" for k, v in extra.items()))
            ).encode()


def _both(model, body):
    """(fast inputs resolved | RequestError, slow inputs | RequestError)."""
    out = []
    for defer in (True, False):
        try:
            dec = protocol.decode(model, body, None, {}, defer=defer)
            out.append(jsonarrays.resolve(dec.inputs))
        except RequestError as e:
            out.append(e)
    return out


def _same(a, b):
    if isinstance(a, RequestError) or isinstance(b, RequestError):
        assert isinstance(a, RequestError) and isinstance(b, RequestError), (a, b)
        assert (a.status, str(a)) == (b.status, str(b))
        return
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        assert a[k].tobytes() == b[k].tobytes(), k


def _decimals(rng, n):
    """Decimal texts of many forms: float32 and float64 reprs, short decimals,
    exponents, integers, zeros of both signs, float32 ties and their neighbours."""
    f32 = rng.standard_normal(n).astype(np.float32) * 10.0 ** rng.integers(-8, 8, n)
    out = [repr(float(v)) for v in f32]
    out += [repr(float(v)) for v in rng.standard_normal(n) * 1e3]
    out += [f"{v:.{d}f}" for v, d in zip(rng.uniform(-50, 50, n), rng.integers(0, 12, n))]
    out += [f"{v:.{d}e}" for v, d in zip(rng.uniform(-9, 9, n), rng.integers(0, 17, n))]
    out += [f"{m}E{e:+d}" for m, e in zip(rng.integers(-10**6, 10**6, n),
                                          rng.integers(-50, 31, n))]
    out += [str(int(v)) for v in rng.integers(-2**40, 2**40, n)]
    out += ["0", "-0", "0.0", "-0.0", "-0e0", "16777217", "16777216.5", "1e-40", "3.4e38",
            "9007199254740993", "0.000000000000000000000000000000000000001", "1.5e-45"]
    # halfway between float32 neighbours (a float64 tie of float32), and just off it
    for v in rng.standard_normal(20).astype(np.float32):
        lo, hi = float(v), float(np.nextafter(v, np.float32(np.inf)))
        mid = (lo + hi) / 2
        out += [repr(mid), repr(float(np.nextafter(mid, np.inf))),
                repr(float(np.nextafter(mid, -np.inf)))]
    return out


def test_float32_values_bit_for_bit_against_json_loads():
    rng = np.random.default_rng(0)
    texts = _decimals(rng, 150)
    ref = np.array(json.loads(_text(texts)), dtype=np.float32)
    vals = np.empty(len(texts))
    ints = np.empty(len(texts), np.int64)
    end, cnt, flags = jsonarrays._parse(np.frombuffer(_text(texts).encode(), np.uint8),
                                        vals, ints)
    assert cnt == len(texts) and end == len(_text(texts))
    assert not flags & jsonarrays.F32_OK      # the ties (and others) are declined ...
    # ... one by one: every value the parser keeps is the reference's, bit for bit
    kept = 0
    for i, t in enumerate(texts):
        e, c, f = jsonarrays._parse(np.frombuffer(f"[{t}]".encode(), np.uint8), vals, ints)
        assert (e, c) == (len(t) + 2, 1), t
        if f & jsonarrays.F32_OK:
            kept += 1
            assert np.float32(vals[0]).view(np.uint32) == ref[i].view(np.uint32), t
    assert kept > 0.9 * len(texts)
    # through the server's codec, ties included: the same arrays as the slow path
    n = len(texts)
    model = Echo(n)
    ids = rng.integers(-2**62, 2**62, n)
    fast, slow = _both(model, _body(_text(texts), _text(map(str, ids)), n))
    _same(fast, slow)
    assert fast["x"].tobytes() == ref.reshape(1, n).tobytes()
    assert fast["ids"].tolist() == [ids.tolist()]


def test_w5_request_is_deferred_and_planned():
    """The body the benchmark sends (784 floats from tolist()): the loop gets a Deferred,
    the second body of the same skeleton comes from the plan, each with its own values."""
    rng = np.random.default_rng(1)
    model = Echo(784)
    plans = {}
    xs = [rng.standard_normal((2, 784)).astype(np.float32) for _ in range(3)]
    ids = rng.integers(0, 30000, (2, 784))
    for x in xs:
        body = json.dumps({"inputs": [
            {"name": "x", "datatype": "FP32", "shape": [2, 784], "data": x.ravel().tolist()},
            {"name": "ids", "datatype": "INT64", "shape": [2, 784],
             "data": ids.ravel().tolist()}]}).encode()
        dec = protocol.decode(model, body, None, plans, defer=True)
        assert type(dec.inputs["x"]) is jsonarrays.Deferred
        assert dec.inputs["x"].shape == (2, 784) and dec.inputs["x"].dtype == np.float32
        got = jsonarrays.resolve(dec.inputs)
        np.testing.assert_array_equal(got["x"], x)
        np.testing.assert_array_equal(got["ids"], ids)
    assert len(plans) == 1


def test_a_batch_parsed_in_one_call():
    """`resolve_all` over many requests (past NOGIL_BYTES: the GIL released), one of
    them declined by the parser and refused by the slow path: its entry is its error,
    the others' values are their own."""
    rng = np.random.default_rng(2)
    model = Echo(784)
    xs = [rng.standard_normal((1, 784)).astype(np.float32) for _ in range(8)]
    ids = [_text(map(str, rng.integers(-5, 5, 784))) for _ in xs]
    bodies = [_body(_text(repr(float(v)) for v in x.ravel()), i, 784) for x, i in zip(xs, ids)]
    bodies[5] = bodies[5].replace(b'"data": [', b'"data": ["x", ', 1)   # a string first
    assert sum(len(b) for b in bodies) > jsonarrays.NOGIL_BYTES
    decs = [protocol.decode(model, b, None, {}, defer=True) for b in bodies]
    got = jsonarrays.resolve_all([d.inputs for d in decs])
    slow = _both(model, bodies[5])[1]
    assert isinstance(got[5], RequestError) and str(got[5]) == str(slow)
    for k, x in enumerate(xs):
        if k != 5:
            assert got[k]["x"].tobytes() == x.tobytes()
            assert got[k]["ids"].tolist() == [json.loads(ids[k])]


@pytest.mark.parametrize("xtext,why", [
    (_text(["1.5"] * 99 + ["NaN"]), "NaN (the standard library reads it)"),
    (_text(["1.5"] * 99 + ['"a"']), "a string in the list"),
    (_text(["1.5"] * 99 + ['"]"']), "a string holding the closing bracket"),
    ("[" + _text(["1.5"] * 50) + ", " + _text(["1.5"] * 50) + "]", "nested lists"),
    (_text(["1.5"] * 99), "one value short"),
    (_text(["1.5"] * 101), "one value too many"),
    (_text(["1.5"] * 99 + ["01"]), "a number JSON does not allow"),
    (_text(["1.5"] * 99 + ["1."]), "a number JSON does not allow"),
    (_text(["1.5"] * 99 + ["1e39"]), "too large for float32"),
    (_text(["1.5"] * 99 + ["1" * 30]), "a 30-digit integer"),
    (_text(["1.5"] * 99 + ["0.1234567890123456789012"]), "22 significant digits"),
    (_text(["1.5"] * 98 + ["1.5,", "2"]), "two commas"),
    (_text(["1.5"] * 100)[:-1] + ",]", "a trailing comma"),
])
def test_declined_lists_come_out_as_the_slow_path_gives_them(xtext, why):
    model = Echo(100)
    body = _body(xtext, _text(["7"] * 100), 100)
    fast, slow = _both(model, body)
    _same(fast, slow)


@pytest.mark.parametrize("idtext", [
    _text(["1"] * 99 + ["1.5"]),            # a float for INT64: the slow path's 400
    _text(["1"] * 99 + ["9223372036854775808"]),
    _text(["1"] * 99 + ["-9223372036854775808"]),
    _text(["1"] * 99 + ["true"]),
])
def test_integer_lists(idtext):
    _same(*_both(Echo(100), _body(_text(["0.5"] * 100), idtext, 100)))


@pytest.mark.parametrize("itype,top", [("INT32", 2**31), ("INT8", 127), ("UINT8", 256)])
def test_narrow_integer_ranges(itype, top):
    model = Echo(100, itype=itype)
    for last in (top - 1, top, -1):
        body = _body(_text(["0.5"] * 100), _text(["1"] * 99 + [str(last)]), 100).replace(
            b'"INT64"', b'"%s"' % itype.encode())
        _same(*_both(model, body))


def test_decoy_data_keys():
    """"data" inside a string, as a parameter, or as an unknown key: never mistaken for
    an input's values (the skeleton is invalid JSON, or a placeholder no input takes)."""
    model = Echo(100)
    nums = _text(["2.25"] * 100)
    ids = _text(["3"] * 100)
    bodies = [
        _body(nums, ids, 100, id='x"data": ' + nums),
        _body(nums, ids, 100, parameters={"data": [1.5] * 100}),
        _body(nums, ids, 100).replace(b'"ids", ', b'"ids", "data": %s, ' % nums.encode()),
        _body(nums, ids, 100, id="\u0000" + "0"),
        _body(nums, ids, 100).replace(b'"datatype": "FP32", ',
                                      b'"datatype": "FP32", "x\\"data": %s, ' % nums.encode()),
    ]
    for body in bodies:
        fast, slow = _both(model, body)
        _same(fast, slow)


def test_a_bad_request_in_a_batch_fails_alone():
    """Requests batched by the data plane: one whose list the parser refuses gets the
    slow path's 400, the others their own values."""
    model = Echo(100)
    plane = DataPlane.build({"echo": model}, instances=1)
    plane.start(warmup=False)
    rng = np.random.default_rng(3)
    good = [rng.standard_normal(100).astype(np.float32) for _ in range(5)]
    bodies = [_body(_text(repr(float(v)) for v in g), _text(["4"] * 100), 100) for g in good]
    bad = _body(_text(["1.5"] * 99 + ['"oops"']), _text(["4"] * 100), 100)
    slow_err = _both(model, bad)[1]
    assert isinstance(slow_err, RequestError) and slow_err.status == 400

    async def run():
        return await asyncio.gather(*(plane.infer("echo", None, b)
                                      for b in bodies[:2] + [bad] + bodies[2:]),
                                    return_exceptions=True)
    try:
        res = asyncio.run(run())
    finally:
        plane.stop()
    err = res.pop(2)
    assert isinstance(err, RequestError) and (err.status, str(err)) == (400, str(slow_err))
    for g, (out, hlen) in zip(good, res):
        assert hlen is None
        y = json.loads(out)["outputs"][0]
        np.testing.assert_array_equal(np.array(y["data"], np.float32), g)
    assert plane.entries["echo"].batcher.batched >= 1


class Checked(Echo):
    """Echo whose `check` reads the values (refuses a negative id): the loop parses a
    request's lists before it, so the check sees arrays."""
    seen = []

    def check(self, inputs):
        from sampan.serving import ServingError
        self.seen.append(type(inputs["ids"]))
        if inputs["ids"].min() < 0:
            raise ServingError("model 'echo': input 'ids' holds a negative id")


def test_a_model_whose_check_reads_values_gets_arrays():
    model = Checked(100)
    assert model.checks_values() and not Echo(100).checks_values()
    plane = DataPlane.build({"echo": model}, instances=1)
    plane.start(warmup=False)
    good = _body(_text(["0.5"] * 100), _text(["3"] * 100), 100)
    bad = _body(_text(["0.5"] * 100), _text(["3"] * 99 + ["-1"]), 100)
    try:
        out, _ = asyncio.run(plane.infer("echo", None, good))
        assert json.loads(out)["outputs"][1]["data"] == [3] * 100
        with pytest.raises(RequestError, match="negative id") as e:
            asyncio.run(plane.infer("echo", None, bad))
        assert e.value.status == 400
    finally:
        plane.stop()
    assert Checked.seen == [np.ndarray, np.ndarray]
