"""Issue 34: `sampan deploy` (numpy target) writes control flow as real Python: a `cond`
node as if/else, `while_loop` as while, `scan` as for, around its blocks' kernels; the
standalone module gives the Predictor's outputs (the char-GPT greedy decode included)."""
import importlib.util
import os
import sys

import numpy as np
import pytest

import sampan
from sampan.deploy import generate
from sampan.inference import Config, create_predictor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def deployed_and_predictor(prog, out, feeds):
    gen = generate(prog, str(out))
    src = open(gen.module).read()
    m = module(gen.module, "gen_" + os.path.basename(str(out))).load()
    p = create_predictor(Config(prog))
    for f in feeds:
        got = m(*f)
        got = got if isinstance(got, tuple) else (got,)
        want = p.run(list(f))
        assert len(got) == len(want)
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), b, rtol=1e-6, atol=1e-6)
    return src


def test_cond_scan_and_while_deploy_as_if_for_and_while(tmp_path):
    rng = np.random.default_rng(0)
    w = sampan.tensor(rng.standard_normal((3, 3)).astype(np.float32) * 0.5)

    def f(x, h0, xs, i0):
        y = sampan.cond(x.sum() > 0, lambda a: a * 2.0, lambda a: -(a @ w), x)
        h, hs = sampan.scan(lambda h, xt: (sampan.tanh(h @ w + xt),) * 2, h0, xs)
        _, hr = sampan.scan(lambda h, xt: (sampan.tanh(h * 0.5 + xt),) * 2, h0, xs,
                            reverse=True)
        i, s = sampan.while_loop(lambda i, s: i < 5, lambda i, s: (i + 1, s * 1.5 + h),
                                 (i0, h0), max_iterations=3)
        return y, hs, hr, i, s
    x = rng.standard_normal((2, 3)).astype(np.float32)
    h0, xs = np.zeros(3, np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    i0 = np.array(0, np.int64)
    with sampan.no_grad():
        prog = sampan.jit.save(f, str(tmp_path / "cf.sampan"),
                               tuple(map(sampan.tensor, (x, h0, xs, i0))))
    src = deployed_and_predictor(prog, tmp_path / "out", [
        (x, h0, xs, i0), (-np.abs(x), h0 + 1, xs, np.array(4, np.int64))])
    for construct in ("    if ", "    else:", "    for ", "    while "):
        assert construct in src


def test_deployed_greedy_decode_equals_the_predictor(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import char_gpt
    sampan.manual_seed(2)
    m = char_gpt.CharGPT(13, d_model=16, n_head=2, n_layer=1, block=8, activation="relu")
    for p in m.parameters():
        sampan.nn.init.normal_(p, 0.0, 0.6)
    m.eval()
    window, n = char_gpt.prompt_window([1, 2, 3], 8)
    with sampan.no_grad():
        prog = sampan.jit.save(char_gpt.GreedyDecoder(m, 8, 12, -1), str(tmp_path / "g"),
                               (window, n))
    feeds = [(window.numpy(), n.numpy()),
             char_gpt.prompt_window([5, 1, 7, 7, 2], 8)]
    feeds[1] = tuple(t.numpy() for t in feeds[1])
    src = deployed_and_predictor(prog, tmp_path / "out", feeds)
    assert "    while " in src
    out, steps = module(os.path.join(tmp_path, "out", "model.py"), "gen_again").load()(
        *feeds[0])
    assert list(out[0, :int(steps)]) == char_gpt.greedy_eager(m, [1, 2, 3], 8, 12, -1)


@pytest.mark.parametrize("bad", [{"n_carry": -1}, {"max_iterations": "3"}])
def test_a_control_node_with_a_bad_count_is_refused(tmp_path, bad):
    """A program folder is anyone's text: a loop count that is no int >= 0 is a
    DeployError naming the node, never pasted into the module."""
    from sampan.deploy import DeployError

    def f(i0):
        return sampan.while_loop(lambda i: i < 3, lambda i: i + 1, i0)
    with sampan.no_grad():
        prog = sampan.jit.save(f, str(tmp_path / "w"), (sampan.tensor(np.int64(0)),))
    from sampan.jit.program import SavedProgram
    real = SavedProgram.read

    def tampered(path):
        sp = real(path)
        node = next(nd for nd in sp.graph.nodes if nd.op == "while_loop")
        node.attrs.update(bad)
        return sp
    SavedProgram.read = staticmethod(tampered)
    try:
        with pytest.raises(DeployError, match="while_loop"):
            generate(prog, str(tmp_path / "out"))
    finally:
        SavedProgram.read = classmethod(real.__func__)
