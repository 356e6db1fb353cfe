"""Online embedding updates of a served DLRM: every answer equals the model at one
consistent snapshot while deltas are applied, and bad deltas are refused while serving
continues (the scenario is in rec_scenario.py)."""
import threading

from sampan.serving.model import load_model
from tests.serving.rec_scenario import ROWS, Scenario, run


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
