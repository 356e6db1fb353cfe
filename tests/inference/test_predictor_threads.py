"""clone(): a second predictor over the same weight arrays (identity, not copies) with its
own handles and planned buffers, so four clones run concurrently in four threads and each
gets its own answers."""
import sys
import threading

import numpy as np

from sampan.inference import Config, create_predictor

from ._models import eager, rand


def test_clone_shares_the_weights_and_not_the_handles(saved):
    models, paths = saved
    p = create_predictor(Config(paths["cnn"]))
    p.run([rand(2, 1, 8, 8)])
    c = p.clone()
    w, wc = p.weights(), c.weights()
    assert w and sorted(w) == sorted(wc)
    assert all(wc[k] is w[k] for k in w)
    consts = [v.const for v in c.graph.consts]
    assert all(a is b for a, b in zip(consts, [v.const for v in p.graph.consts]))
    assert c.compiled_sizes() == p.compiled_sizes()          # warmed for the parent's sizes
    assert c._fn is not p._fn or c._cache is not p._cache
    x1, x2 = rand(2, 1, 8, 8, seed=1), rand(2, 1, 8, 8, seed=2)
    p.get_input_handle("x").copy_from_cpu(x1)
    c.get_input_handle("x").copy_from_cpu(x2)
    p.run()
    c.run()
    np.testing.assert_allclose(p.get_output_handle("output_0").copy_to_cpu(),
                               eager(models["cnn"], x1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c.get_output_handle("output_0").copy_to_cpu(),
                               eager(models["cnn"], x2), rtol=1e-4, atol=1e-5)


def test_clones_in_four_threads(saved):
    models, paths = saved
    p = create_predictor(Config(paths["mlp"]))
    batches = (1, 3, 5)
    for b in batches:
        p.run([rand(b, 8)])
    clones = [p.clone() for _ in range(4)]
    work = [[rand(batches[i % 3], 8, seed=100 * t + i) for i in range(60)] for t in range(4)]
    want = [[eager(models["mlp"], x) for x in w] for w in work]
    got = [[None] * 60 for _ in range(4)]
    errors = []
    start = threading.Barrier(4)

    def serve(t):
        try:
            c = clones[t]
            h, o = c.get_input_handle("x"), c.get_output_handle("output_0")
            start.wait()
            for i, x in enumerate(work[t]):
                h.share_external_data(x)
                c.run()
                got[t][i] = o.copy_to_cpu()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=serve, args=(t,)) for t in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)     # switch threads often: a shared buffer would show
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    for t in range(4):
        for i in range(60):
            np.testing.assert_allclose(got[t][i], want[t][i], rtol=1e-5, atol=1e-6)
    assert all(len(c.compiled_sizes()) == 3 for c in clones)   # no compile in the threads
