"""Issue 34: the Predictor's pass list holds `licm`, so a saved program whose loop bodies
still compute invariants (saved without it, or imported) computes them once, before the
loop, when served; the numbers stay the eager ones."""
import numpy as np

import sampan
from sampan.inference import Config, create_predictor
from sampan.passes import pipeline


def _body_ops(g, op):
    (n,) = [n for n in g.nodes if n.op == op]
    return [m.op for b in n.blocks for m in b.nodes]


def test_predictor_hoists_loop_invariants_of_a_saved_program(tmp_path):
    rng = np.random.default_rng(0)
    w = sampan.tensor(rng.standard_normal((3, 3)).astype(np.float32))

    def f(h0, xs, w):
        # w.T and w.exp() (of an input: nothing to fold) are the same at every step
        return sampan.scan(lambda h, x: ((h @ w.transpose(0, 1) + x * w.exp().sum()).tanh(),)
                           * 2, h0, xs)[1]
    args = (sampan.zeros(3), sampan.tensor(rng.standard_normal((5, 3)).astype(np.float32)), w)
    path = sampan.jit.save(f, str(tmp_path / "s.sampan"), args, passes="none")
    cfg = Config(path)
    assert cfg.pass_builder().all_passes() == pipeline("predictor")
    assert "licm" in pipeline("predictor")
    p = create_predictor(cfg)
    assert "licm" in p.passes_run
    body = _body_ops(p.graph, "scan")
    assert "exp" not in body and "transpose" not in body, body
    assert "exp" in [n.op for n in p.graph.nodes]
    with sampan.no_grad():
        want = f(*args).numpy()
    np.testing.assert_allclose(p.run([a.numpy() for a in args])[0], want, rtol=1e-5,
                               atol=1e-6)
    cfg = Config(path)
    cfg.pass_builder().delete_pass("licm")       # the list a user edits is what runs
    body = _body_ops(create_predictor(cfg).graph, "scan")
    assert "exp" in body, body
