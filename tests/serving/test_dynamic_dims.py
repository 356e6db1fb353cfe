"""A saved program with a dynamic dim besides the batch (a sequence length) serves with
batching on: its warm-up, which cannot know the traffic's lengths, is skipped instead of
failing the start (zeros of size -1), and requests of one length batch together."""
import asyncio
import json
import os

import numpy as np

from sampan.serving import DataPlane
from sampan.serving.model import load_model


def test_program_with_a_dynamic_sequence_dim_starts_and_batches(tmp_path):
    import sampan
    from sampan import nn
    sampan.manual_seed(0)
    net = nn.Linear(4, 2)
    net.eval()
    prog = sampan.jit.save(net, str(tmp_path / "seq.sampan"),
                           (sampan.tensor(np.zeros((2, 3, 4), np.float32)),),
                           dynamic={"x": {0: "batch", 1: "seq"}})
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "path": os.path.relpath(prog, d), "max_batch_size": 4, "instance_count": 1,
        "dynamic_batching": {"max_queue_delay_us": 1_000_000, "delay_policy": "fixed"}}))
    m = load_model("m", str(d))
    assert [tuple(s.shape) for s in m.inputs] == [(-1, -1, 4)]
    plane = DataPlane.build({"m": m})
    plane.start(warmup=True)                    # the warm-up used to raise here
    w, b = net.weight.numpy().astype(np.float64), net.bias.numpy().astype(np.float64)
    xs = [np.random.default_rng(i).standard_normal((r, 5, 4)).astype(np.float32)
          for i, r in enumerate((1, 3))]
    body = [json.dumps({"inputs": [{"name": m.inputs[0].name, "datatype": "FP32",
                                    "shape": list(x.shape), "data": x.ravel().tolist()}]})
            .encode() for x in xs]
    try:
        async def go():
            return await asyncio.gather(*(plane.infer("m", None, bb) for bb in body))
        outs = asyncio.run(go())
    finally:
        plane.stop()
    assert plane.entries["m"].batcher.batched == 1          # one batch of 1 + 3 rows
    for x, (out, _) in zip(xs, outs):
        o = json.loads(out)["outputs"][0]
        got = np.asarray(o["data"]).reshape(o["shape"])
        np.testing.assert_allclose(got, x.astype(np.float64) @ w + b, rtol=1e-5,
                                   atol=1e-5)
