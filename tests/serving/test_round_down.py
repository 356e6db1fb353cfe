"""Rounding a batch down to the model's batch sizes (``round_down``, off by default;
batcher.py's module doc): with more requests on their way, 20 queued requests of a model
that pads to [1, 2, 4, 8, 16, 32] run as 16 + 4 real rows instead of 20 padded to 32;
with nothing behind them, or ``round_down`` off (the default), as one batch of 20.
Every answer is checked against the numpy float64 reference of the saved MLP (the
program kind), so a request never gets another's rows."""
import asyncio

import numpy as np
import pytest

from sampan.serving import ServingError
from sampan.serving.batcher import Batcher
from sampan.serving.model import load_model

from ._models import mlp_reference, model_dir, save_mlp


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("round"))
    path, w = save_mlp(folder)
    return folder, path, w


def _served(mlp, name, **db):
    folder, path, _ = mlp
    # "fixed" and a long delay: every request below is queued before the first batch forms
    db = dict({"max_queue_delay_us": 300_000, "delay_policy": "fixed", "round_down": True},
              **db)
    return load_model(name, model_dir(folder, name, path, max_batch_size=32,
                                      pad_step=0, dynamic_batching=db))


def _run(model, x, arriving):
    """Submit one request per row of `x` at once (with `arriving` requests said to be on
    their way meanwhile); (answers, batch sizes per request)."""
    async def go():
        b = Batcher(model, 1)
        b.start(warmup=False)
        try:
            b.arriving += arriving
            loop = asyncio.get_running_loop()
            subs = [b.submit({"x": x[i:i + 1]}, loop) for i in range(len(x))]
            outs = [await f for _, f in subs]
            return outs, [p.batch for p, _ in subs]
        finally:
            b.arriving -= arriving
            b.close(10)
    return asyncio.run(go())


def _check(outs, w, x):
    ref = mlp_reference(w, x)
    for i, out in enumerate(outs):
        y = next(iter(out.values()))
        assert y.shape == (1, 5)
        np.testing.assert_allclose(y[0], ref[i], rtol=1e-4, atol=1e-5)


def test_batch_is_cut_to_a_bucket_while_others_arrive(mlp):
    _, _, w = mlp
    m = _served(mlp, "r")
    assert m.batch_sizes() == [1, 2, 4, 8, 16, 32]
    x = np.random.default_rng(1).standard_normal((20, 12)).astype(np.float32)
    outs, sizes = _run(m, x, arriving=1)
    _check(outs, w, x)
    # the 16 oldest in one batch, the 4 newest in the next (not 20 padded to 32)
    assert sizes == [16] * 16 + [4] * 4


def test_lone_burst_and_switch_off_keep_one_padded_batch(mlp):
    _, _, w = mlp
    x = np.random.default_rng(2).standard_normal((20, 12)).astype(np.float32)
    outs, sizes = _run(_served(mlp, "s"), x, arriving=0)     # nothing behind them
    _check(outs, w, x)
    assert sizes == [20] * 20
    outs, sizes = _run(_served(mlp, "t", round_down=False), x, arriving=1)
    _check(outs, w, x)
    assert sizes == [20] * 20
    folder, path, _ = mlp                                   # the default: off
    m = load_model("v", model_dir(folder, "v", path, max_batch_size=32, pad_step=0,
                                  dynamic_batching={"max_queue_delay_us": 300_000,
                                                    "delay_policy": "fixed"}))
    outs, sizes = _run(m, x, arriving=1)
    _check(outs, w, x)
    assert sizes == [20] * 20


def test_round_down_must_be_a_bool(mlp):
    with pytest.raises(ServingError, match="round_down must be true or false"):
        Batcher(_served(mlp, "u", round_down="yes"), 1)


def test_a_busy_worker_counts_as_requests_on_their_way():
    """Another worker running a batch (its clients send again when answered) is reason
    enough to cut 6 queued rows to 4 and leave 2 for the next batch."""
    from ._models import Slow

    class Sized(Slow):
        def batch_sizes(self):
            return [1, 2, 4, 8]

    async def go():
        m = Sized("z", 0.3, dynamic_batching={"max_queue_delay_us": 100, "round_down": True})
        b = Batcher(m, 2)
        b.start(warmup=False)
        try:
            loop = asyncio.get_running_loop()
            first = b.submit({"x": np.full((1, 4), -1, np.float32)}, loop)
            while b._busy == 0:              # a worker has taken it and is running it
                await asyncio.sleep(0.005)
            subs = [b.submit({"x": np.full((1, 4), i, np.float32)}, loop) for i in range(6)]
            outs = [await f for _, f in subs]
            await first[1]
            return outs, [p.batch for p, _ in subs]
        finally:
            b.close(10)
    outs, sizes = asyncio.run(go())
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out["y"], np.full((1, 4), 2 * i, np.float32))
    assert sizes == [4] * 4 + [2] * 2
