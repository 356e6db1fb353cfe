"""A DLRM trained through a feature spec (read by the Parquet reader) and served with the
spec: raw request fields, in process and over HTTP, score as the trained model does."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sampan
from sampan.rec.data import ParquetCTRReader
from sampan.rec.features import FeatureSpec
from sampan.rec.models import DLRM, predict, train_step
from sampan.serving.model import ServingError, load_model

SPEC = FeatureSpec({"user": "int", "item": "int", "age": "float", "price": "float"}, [
    {"name": "user_id", "op": "hash", "input": "user", "seed": 1},
    {"name": "item_id", "op": "hash", "input": "item", "seed": 2},
    {"name": "age_b", "op": "bucketize", "input": "age", "boundaries": [18, 30, 50],
     "output": False},
    {"name": "age_id", "op": "hash", "input": "age_b", "seed": 3},
    {"name": "user_x_item", "op": "cross", "inputs": ["user", "item"], "seed": 4},
    {"name": "age_d", "op": "dense", "input": "age"},
    {"name": "price_d", "op": "dense", "input": "price", "fill": -1.0}])


def raw(rng, n):
    price = rng.normal(size=n) * 3
    price[::5] = np.nan
    return {"user": rng.integers(0, 50, size=n), "item": rng.integers(0, 20, size=n),
            "age": rng.uniform(10, 70, size=n).astype(np.float32),
            "price": price.astype(np.float32)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from sampan.serving.rec import export_dlrm

    root = tmp_path_factory.mktemp("dlrm_features")
    rng = np.random.default_rng(0)
    cols = raw(rng, 512)
    cols["label"] = (rng.random(512) < 0.3).astype(np.float32)
    path = str(root / "train.parquet")
    pq.write_table(pa.table(cols), path)
    sampan.manual_seed(0)
    model = DLRM(n_fields=4, n_dense=2, dim=4, bottom=(8, 4), top=(8,), lr=0.2)
    opt = sampan.optim.Adagrad(model.parameters(), lr=0.05)
    for b in ParquetCTRReader(path, batch_size=128, features=SPEC):
        train_step(model, opt, b.ids_matrix(), b.dense, b.labels)
    export_dlrm(model, str(root / "ctr"), snapshot_dir=None, max_batch_size=64,
                features=SPEC)
    return model, str(root / "ctr")


def expected(model, req):
    out = SPEC.apply(req)
    return predict(model, out.ids_matrix(), out.dense_matrix())


def test_served_scores_equal_in_process_ones(trained):
    model, directory = trained
    req = raw(np.random.default_rng(9), 10)
    served = load_model("ctr", directory)
    assert sorted((s.name, s.datatype) for s in served.inputs) == sorted([
        ("user", "INT64"), ("item", "INT64"), ("age", "FP32"), ("price", "FP32")])
    got = served.infer(req)["probability"].ravel()
    np.testing.assert_allclose(got, expected(model, req), rtol=1e-5, atol=1e-6)
    with pytest.raises(ServingError, match=r"unknown input\(s\) \['sparse_ids'\]"):
        served.infer(dict(req, sparse_ids=np.zeros((10, 4), np.int64)))
    with pytest.raises(ServingError, match=r"input 'user'.*expected integers"):
        served.infer(dict(req, user=req["age"]))


def test_served_over_http_from_raw_fields(trained):
    http = pytest.importorskip("tritonclient.http")
    from sampan.serving import Server

    model, directory = trained
    req = raw(np.random.default_rng(10), 6)
    server = Server({"ctr": directory}).start()
    client = http.InferenceServerClient(server.url[len("http://"):])
    try:
        ins = []
        for name, a in req.items():
            dt = "INT64" if a.dtype.kind == "i" else "FP32"
            i = http.InferInput(name, [len(a)], dt)
            i.set_data_from_numpy(a.astype(np.int64 if dt == "INT64" else np.float32))
            ins.append(i)
        got = client.infer("ctr", ins).as_numpy("probability").ravel()
    finally:
        client.close()
        server.stop()
    np.testing.assert_allclose(got, expected(model, req), rtol=1e-5, atol=1e-6)


def test_a_spec_that_does_not_fit_the_model_is_refused(trained, tmp_path):
    import json
    import shutil

    _, directory = trained
    d = str(tmp_path / "ctr")
    shutil.copytree(directory, d)
    FeatureSpec({"user": "int"}, [{"name": "u", "op": "hash", "input": "user"}]).save(
        f"{d}/features.json")
    with pytest.raises(ServingError, match=r"gives 1 ids and 0 dense.*takes 4 and 2"):
        load_model("ctr", d)
    FeatureSpec({"user": "string"}, [{"name": "u", "op": "hash", "input": "user"}]).save(
        f"{d}/features.json")
    with pytest.raises(ServingError, match=r"string field\(s\) \['user'\].*no BYTES"):
        load_model("ctr", d)
    cfg = json.load(open(f"{d}/config.json"))
    open(f"{d}/features.json", "w").write('{"sha256": "0", "spec": {}}')
    with pytest.raises(ServingError, match=r"cannot load the feature spec.*checksum"):
        load_model("ctr", d, cfg)
