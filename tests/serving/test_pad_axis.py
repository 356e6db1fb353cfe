"""Batches across sequence lengths (issue 32): with ``dynamic_batching.pad_axis`` requests
whose inputs differ along that axis share one batch, padded with zeros (the mask too)
to the longest, and each named output is cut back to its request's own length; the
answers equal each request run alone, computed here in float64 numpy."""
import asyncio

import numpy as np
import pytest

from sampan.serving import RequestError, ServingError
from sampan.serving.batcher import Batcher
from sampan.serving.model import ServedModel, TensorSpec


class Masked(ServedModel):
    """tok = x * w masked (per token), pooled = the mask-weighted mean of x over axis 1:
    padding with mask 0 changes neither for the real tokens. Records batch shapes."""

    def __init__(self, pad_axis=None, **db):
        if pad_axis is not None:
            db["pad_axis"] = pad_axis
        super().__init__(name="masked", inputs=[
            TensorSpec("x", "FP32", (-1, -1, 3)), TensorSpec("mask", "INT64", (-1, -1)),
            TensorSpec("scale", "FP32", (-1, 1))],
            outputs=[TensorSpec("tok", "FP32", (-1, -1, 3)),
                     TensorSpec("pooled", "FP32", (-1, 3))],
            max_batch_size=16, config={"dynamic_batching": dict(
                {"max_queue_delay_us": 300_000, "delay_policy": "fixed"}, **db)})
        self.shapes = []

    def infer(self, inputs):
        x, m, s = inputs["x"], inputs["mask"].astype(np.float32), inputs["scale"]
        self.shapes.append(x.shape)
        tok = x * s[:, :, None] * m[:, :, None]
        pooled = (x * m[:, :, None]).sum(1) / np.maximum(m.sum(1, keepdims=True), 1)
        return {"tok": tok, "pooled": pooled}


def _request(rng, rows, n, real):
    x = rng.standard_normal((rows, n, 3)).astype(np.float32)
    mask = np.zeros((rows, n), np.int64)
    mask[:, :real] = 1
    return {"x": x, "mask": mask, "scale": rng.standard_normal((rows, 1)).astype(np.float32)}


def _reference(r):
    x, m, s = (r[k].astype(np.float64) for k in ("x", "mask", "scale"))
    return {"tok": x * s[:, :, None] * m[:, :, None],
            "pooled": (x * m[:, :, None]).sum(1) / np.maximum(m.sum(1, keepdims=True), 1)}


def _serve(model, reqs):
    async def go():
        b = Batcher(model, 1)
        b.start(warmup=False)
        try:
            loop = asyncio.get_running_loop()
            subs = [b.submit(r, loop) for r in reqs]
            outs = await asyncio.gather(*(f for _, f in subs), return_exceptions=True)
            return outs, [p.batch for p, _ in subs]
        finally:
            b.close()
    return asyncio.run(go())


def test_requests_of_different_lengths_share_a_batch_and_match_running_alone():
    rng = np.random.default_rng(0)
    spec = [(1, 5, 5), (2, 9, 7), (1, 3, 2), (3, 9, 9), (1, 1, 1)]   # rows, length, real
    reqs = [_request(rng, *s) for s in spec]
    m = Masked({"axis": 1, "inputs": ["x", "mask"], "outputs": ["tok"]})
    outs, batch = _serve(m, reqs)
    assert batch == [5] * 5 and m.shapes == [(8, 9, 3)]     # one batch, padded to 9
    for r, o, (rows, n, _) in zip(reqs, outs, spec):
        ref = _reference(r)
        assert o["tok"].shape == (rows, n, 3) and o["pooled"].shape == (rows, 3)
        np.testing.assert_allclose(o["tok"], ref["tok"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(o["pooled"], ref["pooled"], rtol=1e-5, atol=1e-6)


def test_default_inputs_are_those_with_the_axis_and_off_keeps_lengths_apart():
    rng = np.random.default_rng(1)
    reqs = [_request(rng, 1, 4, 4), _request(rng, 1, 6, 3), _request(rng, 1, 4, 2)]
    m = Masked({"outputs": ["tok"]})             # axis 1; inputs x, mask (scale has none)
    outs, batch = _serve(m, reqs)
    assert batch == [3, 3, 3] and m.shapes == [(3, 6, 3)]
    for r, o in zip(reqs, outs):
        np.testing.assert_allclose(o["tok"], _reference(r)["tok"], rtol=1e-6, atol=1e-6)
    stepped = Masked({"outputs": ["tok"], "step": 4})     # 6 -> 8 columns
    outs, _ = _serve(stepped, reqs)
    assert stepped.shapes == [(3, 8, 3)]
    for r, o in zip(reqs, outs):
        assert o["tok"].shape == r["x"].shape
        np.testing.assert_allclose(o["tok"], _reference(r)["tok"], rtol=1e-6, atol=1e-6)
    grouped = Masked({"outputs": ["tok"], "step": 4, "group": True})  # 4, 4 | 6
    outs, batch = _serve(grouped, reqs)
    assert sorted(grouped.shapes) == [(1, 8, 3), (2, 4, 3)] and batch == [2, 1, 2]
    for r, o in zip(reqs, outs):
        np.testing.assert_allclose(o["tok"], _reference(r)["tok"], rtol=1e-6, atol=1e-6)
    off = Masked()                               # default: only equal lengths batch
    outs, batch = _serve(off, reqs)
    assert sorted(off.shapes) == [(1, 6, 3), (2, 4, 3)] and batch == [2, 1, 2]
    for r, o in zip(reqs, outs):
        np.testing.assert_allclose(o["tok"], _reference(r)["tok"], rtol=1e-6, atol=1e-6)


def test_a_request_whose_padded_inputs_disagree_is_refused_alone():
    rng = np.random.default_rng(2)
    bad = _request(rng, 1, 4, 4)
    bad["mask"] = np.ones((1, 5), np.int64)
    good = _request(rng, 1, 3, 3)
    m = Masked({"outputs": ["tok"]})

    async def go():
        b = Batcher(m, 1)
        b.start(warmup=False)
        try:
            loop = asyncio.get_running_loop()
            with pytest.raises(RequestError, match="'mask' and 'x'|'x' and 'mask'") as e:
                b.submit(bad, loop)
            assert e.value.status == 400 and "axis 1" in str(e.value)
            return await b.submit(good, loop)[1]
        finally:
            b.close()
    out = asyncio.run(go())
    np.testing.assert_allclose(out["tok"], _reference(good)["tok"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cfg, match", [
    ("yes", "must be an object"), ({"axis": 0}, "axis must be an int >= 1"),
    ({"inputs": ["nope"]}, r"\['nope'\] are not inputs"),
    ({"outputs": ["nope"]}, r"\['nope'\] are not outputs"),
    ({"axis": 3}, "no input has axis 3"), ({"pad": 1}, "unknown keys"),
    ({"step": 0}, "step must be an int >= 1"), ({"group": 1}, "group must be true")])
def test_a_malformed_pad_axis_is_a_clear_error(cfg, match):
    with pytest.raises(ServingError, match=match):
        Batcher(Masked(cfg), 1)
