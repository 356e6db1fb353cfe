"""Issue 34: under `sampan.profiler`, a control-flow node of a compiled program is one
span for the whole construct, not one per op per iteration: a `while_loop` or `scan`
kernel event says how many iterations ran (and their FLOPs), a `cond` event which branch
was taken; the blocks' own ops make no events of their own."""
import os
import sys

import numpy as np

import sampan
from sampan.inference import Config, create_predictor
from sampan.profiler import profile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def kernels(prof):
    return [e for e in prof.events if e.cat == "kernel"]


def test_predictor_decode_is_one_while_loop_span_with_its_iterations(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import char_gpt
    sampan.manual_seed(2)
    m = char_gpt.CharGPT(13, d_model=16, n_head=2, n_layer=1, block=8)
    for p in m.parameters():
        sampan.nn.init.normal_(p, 0.0, 0.6)
    m.eval()
    window, n = char_gpt.prompt_window([1, 2, 3], 8)
    with sampan.no_grad():          # eot 2: greedy stops after 4 tokens
        prog = sampan.jit.save(char_gpt.GreedyDecoder(m, 8, 12, 2), str(tmp_path / "g"),
                               (window, n))
    p = create_predictor(Config(prog))
    feed = [window.numpy(), n.numpy()]
    plain = p.run(feed)
    with profile() as prof:
        for _ in range(2):
            got = p.run(feed)
    for a, b in zip(got, plain):
        np.testing.assert_array_equal(a, b)
    loops = [e for e in kernels(prof) if e.name == "while_loop"]
    assert len(loops) == 2 and all(e.args["iterations"] == int(plain[1]) == 4 for e in loops)
    assert all(e.args["flops"] > 0 for e in loops)
    # the model's matmuls run inside the loop body: no event each, per iteration
    assert not [e for e in kernels(prof) if "matmul" in e.args.get("ir", "")
                and e.name != "while_loop"]


def test_jitted_scan_and_cond_spans():
    w = sampan.tensor(np.eye(3, dtype=np.float32) * 0.5)

    def f(x, h0, xs):
        y = sampan.cond(x.sum() > 0, lambda a: a * 2.0, lambda a: -a, x)
        h, hs = sampan.scan(lambda h, xt: (sampan.tanh(h @ w + xt),) * 2, h0, xs)
        return y, hs
    j = sampan.jit(f)
    args = [sampan.tensor(np.ones((2, 3), np.float32)), sampan.zeros(3),
            sampan.tensor(np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32))]
    with sampan.no_grad():
        ref = j(*args)
        with profile() as prof:
            got = j(*args)
            neg = j(-args[0], args[1], args[2])
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(neg[0].numpy(), args[0].numpy())
    ev = kernels(prof)
    scans = [e for e in ev if e.name == "scan"]
    assert [e.args["iterations"] for e in scans] == [6, 6]
    assert [e.args["branch"] for e in ev if e.name == "cond"] == ["then", "else"]
    assert not [e for e in ev if e.name in ("tanh", "matmul")]
