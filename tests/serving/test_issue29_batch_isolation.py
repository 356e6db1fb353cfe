"""Issue 29, item 5: one client's bad values fail only its own request and never reach
another client's answer. A saved program with an embedding table of 10 rows is batched
with an id of 99 among five good requests: the five get their numbers (numpy reference
from the program's own weights) and no trace of 99, the bad one gets a 400 naming its id
and the table's range. A model whose failure no check predicts is retried request by
request when a batch fails."""
import asyncio
import json
import threading

import httpx
import numpy as np
import pytest

from sampan.serving.batcher import Batcher, RequestError
from sampan.serving.model import ServedModel, TensorSpec

BAD_ID = 99


@pytest.fixture(scope="module")
def emb_program(tmp_path_factory):
    import sampan
    from sampan import nn

    class Bag(nn.Layer):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)

        def forward(self, ids):
            return self.emb(ids).sum(1)

    sampan.manual_seed(5)
    net = Bag()
    net.eval()
    folder = tmp_path_factory.mktemp("emb")
    path = sampan.jit.save(net, str(folder / "bag.sampan"),
                           (sampan.tensor(np.zeros((2, 3), np.int64)),),
                           dynamic={"ids": {0: "batch"}})
    return path, net.emb.weight.numpy().astype(np.float64)


def _ids(i):
    return np.array([[i % 10, (i + 3) % 10, (2 * i) % 10]], np.int64)


def _run_queued(batcher, requests):
    """Queue every request before the workers start (so they form one batch), then
    collect (ok, value) per request."""
    loop = asyncio.new_event_loop()
    try:
        futs = [batcher.submit(x, loop)[1] for x in requests]
        batcher.start(warmup=False)

        async def gather():
            return await asyncio.gather(*futs, return_exceptions=True)
        return loop.run_until_complete(gather())
    finally:
        batcher.close(10)
        loop.close()


def test_bad_ids_are_refused_before_they_join_a_batch(emb_program):
    from sampan.serving.program import ProgramModel
    path, w = emb_program
    m = ProgramModel("bag", path, {"max_batch_size": 8,
                                   "dynamic_batching": {"max_queue_delay_us": 1000}})
    b = Batcher(m, instances=1)
    good = [{"ids": _ids(i)} for i in range(5)]
    with pytest.raises(RequestError) as e:
        b.submit({"ids": np.array([[1, BAD_ID, 2]], np.int64)}, asyncio.new_event_loop())
    assert e.value.status == 400
    msg = str(e.value)
    assert "'ids'" in msg and str(BAD_ID) in msg and "[0, 10)" in msg, msg
    with pytest.raises(RequestError, match=r"-1"):
        b.submit({"ids": np.array([[1, -1, 2]], np.int64)}, asyncio.new_event_loop())
    got = _run_queued(b, good)
    for x, r in zip(good, got):
        assert not isinstance(r, Exception), r
        np.testing.assert_allclose(r["output_0"], w[x["ids"]].sum(1), rtol=1e-6, atol=1e-6)
    assert b.batches == 1 and b.batched == 1


class Picky(ServedModel):
    """y = 2x, but a batch holding a negative value fails with a message quoting it
    (as a kernel's error would); no `check` predicts it."""

    def __init__(self):
        super().__init__(name="picky", inputs=[TensorSpec("x", "FP32", (-1, 2))],
                         outputs=[TensorSpec("y", "FP32", (-1, 2))], max_batch_size=8,
                         config={"dynamic_batching": {"max_queue_delay_us": 1000}})
        self.calls = []

    def infer(self, inputs):
        x = inputs["x"]
        self.calls.append(len(x))
        if (x < 0).any():
            raise ValueError(f"cannot take {x[x < 0].tolist()} (batch {x.tolist()})")
        return {"y": x * 2}


def test_a_failed_batch_is_retried_one_request_at_a_time():
    m = Picky()
    b = Batcher(m, instances=1)
    reqs = [{"x": np.array([[i, i + 0.5]], np.float32)} for i in range(1, 6)]
    reqs.insert(2, {"x": np.array([[-7.25, 1.0]], np.float32)})
    got = _run_queued(b, reqs)
    assert m.calls[0] == 6                       # they did form one batch
    for i, (x, r) in enumerate(zip(reqs, got)):
        if i == 2:
            assert isinstance(r, RequestError) and "-7.25" in str(r)
            assert "1.5" not in str(r) and "5.5" not in str(r)   # nobody else's values
        else:
            assert not isinstance(r, Exception), r
            np.testing.assert_array_equal(r["y"], x["x"] * 2)


def test_one_bad_id_over_http_fails_only_its_request(emb_program, tmp_path):
    from sampan.serving import Server
    path, w = emb_program
    d = tmp_path / "bag"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "path": path, "max_batch_size": 8, "instance_count": 1,
        "dynamic_batching": {"max_queue_delay_us": 300000, "delay_policy": "fixed",
                             "preferred_batch_sizes": [6]}}))
    bodies = [_ids(i) for i in range(5)] + [np.array([[4, BAD_ID, 1]], np.int64)]
    got = [None] * len(bodies)
    with Server({"bag": str(d)}) as s:
        url = s.url + "/v2/models/bag/infer"

        def send(k):
            got[k] = httpx.post(url, timeout=30, json={"inputs": [
                {"name": "ids", "datatype": "INT64", "shape": [1, 3],
                 "data": bodies[k].ravel().tolist()}]})
        ts = [threading.Thread(target=send, args=(k,)) for k in range(len(bodies))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
    for k, r in enumerate(got[:5]):
        assert r.status_code == 200, r.text
        assert "error" not in r.json() and f"value {BAD_ID}" not in r.text
        np.testing.assert_allclose(r.json()["outputs"][0]["data"],
                                   w[bodies[k]].sum(1).ravel(), rtol=1e-5, atol=1e-6)
    assert got[5].status_code == 400 and str(BAD_ID) in got[5].json()["error"]
