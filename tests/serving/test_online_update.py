"""Online embedding updates of a served DLRM: every answer equals the model at one
consistent snapshot while deltas are applied, and bad deltas are refused while serving
continues (the scenario is in rec_scenario.py)."""
import threading

import pytest

from sampan.serving.model import load_model
from tests.serving.rec_scenario import ROWS, D, F, Scenario, run


def test_direct_infer_from_threads_sees_one_snapshot(tmp_path):
    """The model itself, called from threads the way the server's workers call it."""
    sc = Scenario(str(tmp_path))
    model = load_model("ctr", sc.dir)
    local = threading.local()
    model.start()
    try:
        def send(r):
            if not hasattr(local, "clone"):
                local.clone = model.clone()
            out = local.clone.infer({"dense_features": sc.req_dense[r],
                                     "sparse_ids": sc.req_ids[r]})
            return out["probability"].reshape(ROWS)
        got = run(sc, send, model.metadata)
    finally:
        model.stop()
    print(got)
    assert model.watcher._thread is None


def test_served_over_http_answers_from_one_snapshot_while_deltas_apply(tmp_path):
    """The real client against the server: requests stream from 4 client threads (one
    tritonclient each) through dynamic batching while training exports deltas."""
    http = pytest.importorskip("tritonclient.http")
    from sampan.serving import Server

    sc = Scenario(str(tmp_path))
    server = Server({"ctr": sc.dir}).start()
    local, clients = threading.local(), []
    try:
        meta = http.InferenceServerClient(server.url[len("http://"):])
        clients.append(meta)

        def send(r):
            c = getattr(local, "c", None)
            if c is None:
                c = local.c = http.InferenceServerClient(server.url[len("http://"):])
                clients.append(c)
            ins = [http.InferInput("dense_features", [ROWS, D], "FP32"),
                   http.InferInput("sparse_ids", [ROWS, F], "INT64")]
            ins[0].set_data_from_numpy(sc.req_dense[r], binary_data=r % 2 == 0)
            ins[1].set_data_from_numpy(sc.req_ids[r], binary_data=r % 3 != 0)
            return c.infer("ctr", ins).as_numpy("probability").reshape(ROWS)

        got = run(sc, send, lambda: meta.get_model_metadata("ctr"))
        m = meta.get_model_metadata("ctr")
        assert m["platform"] == "sampan_dlrm" and m["snapshot_lineage"] == sc.table.lineage
        assert m["inputs"] == [{"name": "dense_features", "datatype": "FP32", "shape": [-1, D]},
                               {"name": "sparse_ids", "datatype": "INT64", "shape": [-1, F]}]
    finally:
        server.stop()
        for c in clients:
            c.close()
    print(got)
    assert not [t for t in threading.enumerate() if t.name.endswith("-snapshots")]
