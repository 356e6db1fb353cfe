"""Dynamic batching, overload, timeouts and /metrics, on the module's one server."""
import threading
import time

import httpx
import numpy as np
import pytest

http = pytest.importorskip("tritonclient.http")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from ._models import mlp_reference  # noqa: E402


def _metrics(served):
    text = httpx.get(served.url + "/metrics").text
    return {f.name: f for f in text_string_to_metric_families(text)}


def _sample(fams, family, suffix, **labels):
    for s in fams[family].samples:
        if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return 0.0


def _infer(url, model, x, binary=True, **kw):
    c = http.InferenceServerClient(url[len("http://"):])
    try:
        i = http.InferInput("x", list(x.shape), "FP32")
        i.set_data_from_numpy(x, binary_data=binary)
        return c.infer(model, [i], **kw)
    finally:
        c.close()


def _concurrently(fns):
    out = [None] * len(fns)
    go = threading.Barrier(len(fns))

    def run(k):
        go.wait()
        try:
            out[k] = fns[k]()
        except Exception as e:     # noqa: BLE001 -- the test looks at it
            out[k] = e
    ts = [threading.Thread(target=run, args=(k,)) for k in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return out


def test_concurrent_batched_answers_equal_unbatched_runs(served):
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((1 + k % 3, 12)).astype(np.float32) for k in range(24)]
    before = _metrics(served)
    got = _concurrently([lambda x=x, k=k: _infer(served.url, "mlp", x, binary=k % 2 == 0)
                         .as_numpy("output_0") for k, x in enumerate(xs)])
    for x, y in zip(xs, got):
        assert not isinstance(y, Exception), y
        alone = _infer(served.url, "mlp_single", x).as_numpy("output_0")
        np.testing.assert_allclose(y, alone, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(y, mlp_reference(served.weights, x), rtol=1e-5,
                                   atol=1e-5)
    after = _metrics(served)
    # batches of more than one request really formed: fewer batches than requests
    n = (_sample(after, "sampan_batch_requests", "_count", model="mlp")
         - _sample(before, "sampan_batch_requests", "_count", model="mlp"))
    s = (_sample(after, "sampan_batch_requests", "_sum", model="mlp")
         - _sample(before, "sampan_batch_requests", "_sum", model="mlp"))
    assert s == len(xs) and n < len(xs), (n, s)
    assert served.entries["mlp"].batcher.batched >= 1
    # batching off: every request ran alone
    single = _sample(after, "sampan_batch_requests", "_sum", model="mlp_single")
    assert single == _sample(after, "sampan_batch_requests", "_count", model="mlp_single")


def test_full_queue_answers_503_with_retry_after(served):
    x = np.ones((1, 4), np.float32)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                        "data": x.ravel().tolist()}]}
    url = served.url + "/v2/models/slow/infer"
    # counted from here: tests of other files on this worker (gRPC's admission test) may
    # have filled slow's queue on the shared server before
    before = _sample(_metrics(served), "sampan_request_failures", "_total", model="slow",
                     status="503")
    got = _concurrently([lambda: httpx.post(url, json=body, timeout=30)] * 7)
    codes = sorted(r.status_code for r in got)
    assert set(codes) <= {200, 503} and codes.count(200) >= 1 and 503 in codes, codes
    for r in got:
        if r.status_code == 503:
            assert r.headers["retry-after"] and "queue is full" in r.json()["error"]
        else:
            assert r.json()["outputs"][0]["data"] == [2.0] * 4
    # the same refusal reaches tritonclient as an InferenceServerException with status 503
    fams = _metrics(served)
    assert _sample(fams, "sampan_request_failures", "_total", model="slow",
                   status="503") - before == codes.count(503)


def test_request_past_its_timeout_answers_504_and_is_not_run(served):
    slow = served.entries["slow"].model
    x = np.ones((1, 4), np.float32)
    busy = threading.Thread(target=_infer, args=(served.url, "slow", x))
    busy.start()
    time.sleep(0.05)                # the one worker is now busy for 0.25 s
    rows = slow.rows_run
    t = time.perf_counter()
    with pytest.raises(Exception) as ei:
        _infer(served.url, "slow", x * 3, parameters={"timeout_ms": 60})
    assert time.perf_counter() - t < 0.2
    assert "504" in str(ei.value.status()) and "timed out" in ei.value.message()
    busy.join()
    time.sleep(0.3)
    assert slow.rows_run == rows + 1      # the busy request's row only; the late one never ran


def test_metrics_page_parses(served):
    fams = _metrics(served)
    for name in ("sampan_requests", "sampan_request_failures", "sampan_queue_depth",
                 "sampan_batch_size", "sampan_queue_seconds", "sampan_compute_seconds",
                 "sampan_request_seconds"):
        assert name in fams, name
    assert _sample(fams, "sampan_requests", "_total", model="mlp", status="200") >= 1
    assert fams["sampan_batch_size"].type == "histogram"
    assert _sample(fams, "sampan_request_seconds", "_count", model="mlp") >= 1
    assert _sample(fams, "sampan_queue_depth", "", model="mlp") == 0


def test_delay_policy_arriving_dispatches_a_lone_request_at_once():
    """With nothing on its way a worker does not sit out max_queue_delay_us (1 s here);
    with "fixed" it does."""
    import asyncio

    from sampan.serving.batcher import Batcher

    from ._models import Slow

    async def one(policy):
        m = Slow("s", 0.0, dynamic_batching={"max_queue_delay_us": 1_000_000,
                                             "delay_policy": policy})
        b = Batcher(m, 1)
        b.start()
        try:
            t = time.perf_counter()
            p, fut = b.submit({"x": np.ones((1, 4), np.float32)}, asyncio.get_running_loop())
            out = await fut
            return time.perf_counter() - t, out["y"], p.batch
        finally:
            b.close()
    dt, y, n = asyncio.run(one("arriving"))
    assert dt < 0.5 and n == 1 and (y == 2).all()
    dt, _, _ = asyncio.run(one("fixed"))
    assert dt >= 0.9


def test_request_logs_are_one_json_object_a_line():
    import io
    import json
    import logging

    from sampan.serving.ops import LOG, flush_logging, log_request, setup_logging
    buf = io.StringIO()
    logs = [logging.getLogger(n) for n in ("sampan.serving", "uvicorn", "uvicorn.error")]
    saved = [(lg.handlers[:], lg.level, lg.propagate) for lg in logs]
    try:
        setup_logging("info", buf)
        log_request("r-1", "mlp", 200, 3, 0.0012, 0.0004, 0.002)
        log_request("r-2", "mlp", 503, 0, None, None, 0.0001, error="the queue is full")
        flush_logging()
    finally:
        for lg, (h, lvl, prop) in zip(logs, saved):
            lg.handlers[:], lg.level, lg.propagate = h, lvl, prop
    a, b = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert a["request_id"] == "r-1" and a["model"] == "mlp" and a["status"] == 200
    assert a["batch_size"] == 3 and a["queue_ms"] == 1.2 and a["compute_ms"] == 0.4
    assert a["total_ms"] == 2.0 and a["level"] == "info"
    assert b["level"] == "warning" and b["error"] == "the queue is full"
    assert logging.getLogger("sampan.serving") is LOG
