"""sampan.rec.features: each transform against a plain-Python reference (seeded random
inputs with empty rows, unicode strings, NaN), the hash's fixed values, bad input, the
spec's JSON, and the reader applying a spec."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sampan.errors import DTypeError, SampanValueError
from sampan.rec import _feature_kernels as K
from sampan.rec.features import FeatureSpec, hash64, load_spec

# ------------------------------------------------------------ the plain-Python reference
M = 1 << 64


def mix(z):
    z ^= z >> 30
    z = z * 0xBF58476D1CE4E5B9 % M
    z ^= z >> 27
    z = z * 0x94D049BB133111EB % M
    return z ^ (z >> 31)


def key(seed):
    return mix((seed + 0x9E3779B97F4A7C15) % M)


def content(v):
    if isinstance(v, str):
        b, h = v.encode(), 0x9E3779B97F4A7C15
        for i in range(0, len(b), 8):
            h = mix(h ^ int.from_bytes(b[i:i + 8].ljust(8, b"\0"), "little"))
        return mix(h ^ len(b))
    return v % M


def h_value(v, seed):
    return mix(content(v) ^ key(seed))


def bucket(h, buckets):
    if buckets:
        return h % buckets
    return h - M if h >= 1 << 63 else h


ALPHABET = ["a", "é", "東", "😀", " ", "z", "\u0000"]


def rand_strings(rng, n):
    return ["".join(rng.choice(ALPHABET, size=rng.integers(0, 20))) for _ in range(n)]


def rand_lists(rng, n, make):
    return [make(rng, int(rng.integers(0, 4))) for _ in range(n)]


def flat(offs, vals):
    return [vals[offs[i]:offs[i + 1]].tolist() for i in range(len(offs) - 1)]


# ------------------------------------------------------------------------- the tests
def test_hash_fixed_values_are_stable():
    """Known values: identical in every process and on every platform (pure integer math)."""
    assert hash64([0, 1, -1, 2**63 - 1]).tolist() == [
        5197578548964807871, -7061257010553836809, -954060565643939712, 4136705488814653760]
    assert hash64(["a", "hello, world", "Zürich 東京"], seed=42).tolist() == [
        -5691256926821739116, -4254718917445545823, 1539357552585303422]
    assert hash64(["a", "b"]).tolist() == [7575620316248879481, 8312974182328929532]
    assert hash64(["a", "b"], buckets=1000).tolist() == [481, 532]


@pytest.mark.parametrize("seed", [0, 7, 2**64 - 1])
def test_hash_ints_and_strings_match_reference(seed):
    rng = np.random.default_rng(seed % 1000)
    ints = rng.integers(-2**63, 2**63 - 1, size=200, dtype=np.int64).tolist() + [0, -1]
    strs = rand_strings(rng, 200) + ["", "x" * 8, "x" * 9]
    for buckets in (None, 1, 97, 1 << 20):
        assert hash64(ints, seed, buckets).tolist() == [bucket(h_value(v, seed), buckets)
                                                        for v in ints]
        assert hash64(strs, seed, buckets).tolist() == [bucket(h_value(v, seed), buckets)
                                                        for v in strs]
    # a sliced Arrow array (nonzero offset) and large_string hash the same
    arr = pa.array(["pad"] + strs, pa.large_string()).slice(1)
    assert hash64(arr, seed).tolist() == hash64(strs, seed).tolist()


def test_hash_lists_with_nulls_and_empty_rows():
    rng = np.random.default_rng(1)
    tags = rand_lists(rng, 50, lambda r, k: rand_strings(r, k))
    city = [s if i % 5 else None for i, s in enumerate(rand_strings(rng, 50))]
    spec = FeatureSpec({"tags": "list<string>", "city": "string"}, [
        {"name": "t", "op": "hash", "input": "tags", "buckets": 1000, "seed": 3},
        {"name": "c", "op": "hash", "input": "city", "seed": 3}])
    out = spec.apply({"tags": pa.array(tags), "city": pa.array(city)})
    assert flat(*out.sparse["t"]) == [[bucket(h_value(v, 3), 1000) for v in row]
                                     for row in tags]
    # a null value is a missing one: its row is empty
    assert flat(*out.sparse["c"]) == [[] if v is None else [bucket(h_value(v, 3), None)]
                                     for v in city]


def test_bucketize_matches_reference_with_nan():
    rng = np.random.default_rng(2)
    b = [-1.0, 0.0, 0.5, 3.0]
    x = rng.normal(size=300) * 2
    x[::7] = np.nan
    x[1::11] = 0.5  # on a boundary: the bucket above it
    lists = rand_lists(rng, 40, lambda r, k: [float(v) for v in r.normal(size=k)])
    spec = FeatureSpec({"x": "float", "l": "list<float>"}, [
        {"name": "xb", "op": "bucketize", "input": "x", "boundaries": b},
        {"name": "lb", "op": "bucketize", "input": "l", "boundaries": b}])
    xs = list(x[:40])
    out = spec.apply({"x": xs, "l": lists})

    def ref(v):
        return len(b) + 1 if math.isnan(v) else sum(1 for t in b if t <= v)

    assert out.sparse["xb"][1].tolist() == [ref(v) for v in xs]
    assert flat(*out.sparse["lb"]) == [[ref(v) for v in row] for row in lists]
    full = FeatureSpec({"x": "float"}, [{"name": "xb", "op": "bucketize", "input": "x",
                                         "boundaries": b}]).apply({"x": x})
    assert full.sparse["xb"][1].tolist() == [ref(v) for v in x]


@pytest.mark.parametrize("buckets", [None, 50, 64])
def test_cross_is_the_hashed_cartesian_product(buckets):
    rng = np.random.default_rng(3)
    n = 60
    a = rand_lists(rng, n, lambda r, k: [int(v) for v in r.integers(-5, 5, size=k)])
    s = rand_lists(rng, n, lambda r, k: rand_strings(r, k))
    c = [int(v) for v in rng.integers(0, 10**12, size=n)]
    spec = FeatureSpec({"a": "list<int>", "s": "list<string>", "c": "int"}, [
        {"name": "x", "op": "cross", "inputs": ["a", "s", "c"], "buckets": buckets,
         "seed": 11}])
    out = spec.apply({"a": a, "s": s, "c": c})
    want = []
    for i in range(n):
        row = []
        for combo in itertools.product(a[i], s[i], [c[i]]):
            h = key(11)
            for v in combo:
                h = mix(h ^ content(v))
            row.append(bucket(h, buckets))
        want.append(row)
    assert flat(*out.sparse["x"]) == want
    assert any(not r for r in want) and any(len(r) > 1 for r in want)


@pytest.mark.parametrize("keep", ["first", "last"])
def test_sequence_truncates_and_pads(keep):
    rng = np.random.default_rng(4)
    ids = rand_lists(rng, 30, lambda r, k: [int(v) for v in r.integers(0, 99, size=2 * k)])
    vals = rand_lists(rng, 30, lambda r, k: [float(v) for v in r.normal(size=2 * k)])
    spec = FeatureSpec({"i": "list<int>", "v": "list<float>"}, [
        {"name": "si", "op": "sequence", "input": "i", "length": 3, "keep": keep, "pad": -1},
        {"name": "sv", "op": "sequence", "input": "v", "length": 4, "keep": keep,
         "pad": 0.5}])
    out = spec.apply({"i": ids, "v": vals})

    def ref(row, n, pad):
        kept = row[:n] if keep == "first" else row[max(0, len(row) - n):]
        return kept + [pad] * (n - len(kept))

    assert out.ids_matrix().tolist() == [ref(r, 3, -1) for r in ids]
    np.testing.assert_array_equal(out.dense["sv"],
                                  np.array([ref(r, 4, 0.5) for r in vals], np.float32))
    assert spec.sparse_names == ["si"] and spec.dense_names == ["sv"]


def test_chained_features_and_outputs():
    spec = FeatureSpec({"x": "float", "u": "int"}, [
        {"name": "xb", "op": "bucketize", "input": "x", "boundaries": [0], "output": False},
        {"name": "xu", "op": "cross", "inputs": ["xb", "u"], "buckets": 100},
        {"name": "xd", "op": "dense", "input": "x", "fill": -9}])
    out = spec.apply({"x": [1.0, float("nan"), -1.0], "u": [3, 4, 5]})
    assert list(out.sparse) == ["xu"] and out.dense["xd"].ravel().tolist() == [1, -9, -1]
    assert out.ids_matrix().shape == (3, 1)


def test_bad_inputs_name_the_feature():
    with pytest.raises(SampanValueError, match=r"feature 'f'.*decreasing at row 1"):
        K.check_csr("f", np.array([0, 2, 1, 3]), 3)
    with pytest.raises(SampanValueError, match=r"feature 'f'.*ending at 5 with 3 values"):
        K.check_csr("f", np.array([0, 2, 5]), 3)
    with pytest.raises(SampanValueError, match=r"feature 'f'.*starting at 1"):
        K.check_csr("f", np.array([1, 2]), 3)
    with pytest.raises(DTypeError, match=r"feature 'f'.*offsets float64"):
        K.check_csr("f", np.array([0.0, 1.0]), 3)
    with pytest.raises(SampanValueError, match=r"feature 'f'.*4 offsets for 2 rows"):
        K.check_csr("f", np.array([0, 1, 2, 3]), 3, 2)
    with pytest.raises(SampanValueError, match=r"feature 's'.*spans outside"):
        K.check_spans("s", np.zeros(4, np.uint8), np.array([0, 2]), np.array([2, 5]))
    spec = FeatureSpec({"u": "int"}, [{"name": "h", "op": "hash", "input": "u"}])
    with pytest.raises(DTypeError, match=r"feature input 'u'.*string.*expected integers"):
        spec.apply({"u": ["a", "b"]})
    with pytest.raises(SampanValueError, match=r"expected also \['u'\]"):
        spec.apply({"v": [1]})
    two = FeatureSpec({"u": "int", "w": "int"}, [{"name": "h", "op": "hash", "input": "u"}])
    with pytest.raises(SampanValueError, match=r"input 'w'.*got 1 rows; expected 2"):
        two.apply({"u": [1, 2], "w": [1]})
    lists = FeatureSpec({"l": "list<int>"}, [{"name": "h", "op": "hash", "input": "l"}])
    with pytest.raises(SampanValueError, match=r"input 'l'.*null lists"):
        lists.apply({"l": [[1], None]})
    d = FeatureSpec({"l": "list<float>"}, [{"name": "d", "op": "dense", "input": "l"}])
    with pytest.raises(SampanValueError, match=r"feature 'd'.*2 values in row 0"):
        d.apply({"l": [[1.0, 2.0]]})


@pytest.mark.parametrize("rec, match", [
    ({"name": "h", "op": "eval", "input": "u"}, r"op 'eval'.*expected one of"),
    ({"name": "h", "op": "hash", "input": "nope"}, r"input 'nope'"),
    ({"name": "u", "op": "hash", "input": "u"}, r"feature name 'u'"),
    ({"name": "h", "op": "hash", "input": "u", "buckets": 0}, r"buckets=0"),
    ({"name": "h", "op": "hash", "input": "u", "code": "x"}, r"unknown key\(s\) \['code'\]"),
    ({"name": "h", "op": "bucketize", "input": "u", "boundaries": [2, 1]}, r"increasing"),
    ({"name": "h", "op": "bucketize", "input": "s", "boundaries": [1]}, r"kind string"),
    ({"name": "h", "op": "cross", "inputs": ["u"]}, r"at least 2"),
    ({"name": "h", "op": "sequence", "input": "u"}, r"length=.*missing"),
])
def test_spec_refuses_bad_records(rec, match):
    with pytest.raises(SampanValueError, match=match):
        FeatureSpec({"u": "int", "s": "string"}, [rec])


def test_spec_json_round_trip_and_versions(tmp_path):
    spec = FeatureSpec({"s": "list<string>", "x": "float"}, [
        {"name": "h", "op": "hash", "input": "s", "buckets": 10, "seed": 2**64 - 1},
        {"name": "b", "op": "bucketize", "input": "x", "boundaries": [0.25, 1e9]},
        {"name": "q", "op": "sequence", "input": "h", "length": 2, "keep": "last"}])
    again = FeatureSpec.from_json(spec.to_json())
    assert again == spec and again.to_json() == spec.to_json()
    cols = {"s": [["é", "b"], []], "x": [0.3, float("nan")]}
    a, b = spec.apply(cols), again.apply(cols)
    assert {k: flat(*v) for k, v in a.sparse.items()} == {k: flat(*v) for k, v in
                                                           b.sparse.items()}
    d = spec.to_dict()
    for bad, match in [(dict(d, version=2), r"version 2"), (dict(d, format="x"), "format"),
                       (dict(d, extra=1), "unknown key")]:
        with pytest.raises(SampanValueError, match=match):
            FeatureSpec.from_dict(bad)
    with pytest.raises(SampanValueError, match="not JSON"):
        FeatureSpec.from_json("{nope")
    path = str(tmp_path / "features.json")
    spec.save(path)
    assert load_spec(path) == spec
    doc = json.loads(open(path).read())
    doc["spec"]["features"][0]["buckets"] = 11  # edited without its checksum
    open(path, "w").write(json.dumps(doc))
    with pytest.raises(SampanValueError, match="checksum"):
        load_spec(path)


def test_reader_applies_the_spec_on_its_thread(tmp_path):
    from sampan.rec.data import ParquetCTRReader

    rng = np.random.default_rng(5)
    n = 300
    table = pa.table({"label": (rng.random(n) < 0.5).astype(np.float32),
                      "rid": np.arange(n, dtype=np.float64),
                      "city": rand_strings(rng, n),
                      "hist": rand_lists(rng, n, lambda r, k: [int(v) for v in
                                                               r.integers(0, 9, size=k)])})
    path = str(tmp_path / "d.parquet")
    pq.write_table(table, path)
    spec = FeatureSpec({"rid": "float", "city": "string", "hist": "list<int>"}, [
        {"name": "c", "op": "hash", "input": "city", "buckets": 1000},
        {"name": "h", "op": "hash", "input": "hist"},
        {"name": "rid_d", "op": "dense", "input": "rid"}])
    want = spec.apply(table)
    rows = {}
    for b in ParquetCTRReader(path, batch_size=64, shuffle_buffer=64, read_rows=50,
                              features=spec):
        assert b.n_fields == 2
        for i in range(len(b)):
            s = slice(b.indptr[i], b.indptr[i + 1])
            rows[int(b.dense[i, 0])] = (b.indices[s].tolist(), b.fields[s].tolist(),
                                        float(b.labels[i]))
    assert sorted(rows) == list(range(n))
    wc, wh = flat(*want.sparse["c"]), flat(*want.sparse["h"])
    for r, (ids, fields, y) in rows.items():
        assert ids == wc[r] + wh[r] and fields == [0] * len(wc[r]) + [1] * len(wh[r])
        assert y == table.column("label")[r].as_py()
    with pytest.raises(SampanValueError, match=r"without columns \['zip'\]"):
        ParquetCTRReader(path, features=FeatureSpec({"zip": "int"}, [
            {"name": "z", "op": "hash", "input": "zip"}]))
    bad = FeatureSpec({"city": "int"}, [{"name": "z", "op": "hash", "input": "city"}])
    with pytest.raises(DTypeError, match=r"d.parquet.*feature input 'city'"):
        list(ParquetCTRReader(path, features=bad))
