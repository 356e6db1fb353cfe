"""Issue 34: the char-GPT decode of examples/char_gpt.py under `sampan.jit` with one
`while_loop` node (greedy and beam search, fixed-size buffers, early stop at end-of-text)
gives the tokens of a plain Python-loop decode of the same model; saved, it gives them again
in a fresh process, through the Predictor and behind `sampan serve`."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import sampan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import char_gpt  # noqa: E402

V, BLOCK, PROMPT = 13, 8, [1, 2, 3]


def tiny():
    """A 1-block CharGPT whose greedy decode from PROMPT is 7 4 4 2 11 ... (varied tokens:
    weights N(0, 0.6), seed 2)."""
    sampan.manual_seed(2)
    m = char_gpt.CharGPT(V, d_model=16, n_head=2, n_layer=1, block=BLOCK)
    for p in m.parameters():
        sampan.nn.init.normal_(p, 0.0, 0.6)
    m.eval()
    return m


def ops_of(g):
    return [n.op for n in g.nodes]


def run_greedy(f, max_new):
    with sampan.no_grad():
        out, i = f(*char_gpt.prompt_window(PROMPT, BLOCK))
    return [int(t) for t in out.numpy()[0, :int(i.numpy())]]


@pytest.mark.parametrize("eot,max_new", [(2, 12), (-1, 14)])
def test_jitted_greedy_decode_is_one_while_loop_and_equals_the_python_loop(eot, max_new):
    """eot=2: the loop stops after 4 tokens (the step counter says so); eot=-1 never comes:
    all 14 steps run and the context window (8) slides."""
    m = tiny()
    ref = char_gpt.greedy_eager(m, PROMPT, BLOCK, max_new, eot)
    assert len(ref) == (4 if eot == 2 else max_new)
    dec = char_gpt.GreedyDecoder(m, BLOCK, max_new, eot)
    assert run_greedy(dec, max_new) == ref                # eager: Python runs the loop
    j = sampan.jit(dec, pipeline="inference")
    assert run_greedy(j, max_new) == ref
    ops = ops_of(j.graph)
    assert ops.count("while_loop") == 1 and "matmul" not in ops   # not unrolled


def test_jitted_beam_search_equals_a_python_beam_search():
    m = tiny()
    k, max_new, eot = 3, 6, 2
    ref = char_gpt.beam_eager(m, PROMPT, BLOCK, max_new, eot, k)
    dec = sampan.jit(char_gpt.BeamDecoder(m, BLOCK, max_new, eot, k, V), pipeline="inference")
    with sampan.no_grad():
        out, i, scores = dec(*char_gpt.prompt_window(PROMPT, BLOCK))
    assert ops_of(dec.graph).count("while_loop") == 1
    got = [list(map(int, row[:int(i.numpy())])) for row in out.numpy()]
    assert got == [toks for toks, _ in ref]
    np.testing.assert_allclose(scores.numpy(), [s for _, s in ref], rtol=1e-4, atol=1e-4)


_CHILD = """
import json, sys
import numpy as np
import sampan
prog = sampan.jit.load(sys.argv[1])
w = np.zeros((1, {block}), np.int64); w[0, :{n}] = {prompt}
out, i = prog(sampan.tensor(w), sampan.tensor(np.int64({n})))
print(json.dumps([int(t) for t in out.numpy()[0, :int(i.numpy())]]))
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The greedy decoder (early stop after 4 tokens) saved, with its reference tokens."""
    m = tiny()
    path = str(tmp_path_factory.mktemp("decode") / "greedy.sampan")
    with sampan.no_grad():
        sampan.jit.save(char_gpt.GreedyDecoder(m, BLOCK, 12, 2), path,
                        char_gpt.prompt_window(PROMPT, BLOCK))
    return path, char_gpt.greedy_eager(m, PROMPT, BLOCK, 12, 2)


def test_saved_decode_runs_in_a_fresh_process(saved):
    path, ref = saved
    assert "while_loop" in open(os.path.join(path, "graph.ir")).read()
    code = _CHILD.format(block=BLOCK, n=len(PROMPT), prompt=PROMPT)
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == ref


def feed():
    w, n = char_gpt.prompt_window(PROMPT, BLOCK)
    return [w.numpy(), n.numpy()]


@pytest.mark.parametrize("runtime", ["numba", "numpy", "onnxruntime"])
def test_predictor_runs_the_saved_decode(saved, runtime):
    from sampan import inference
    if runtime == "onnxruntime":
        pytest.importorskip("onnxruntime")
    path, ref = saved
    cfg = inference.Config(path)
    cfg.set_runtime(runtime)          # each runtime's pass list, on a program with blocks
    p = inference.create_predictor(cfg)
    assert "while_loop" in ops_of(p.graph)
    out, i = p.run(feed())
    assert list(out[0, :int(i)]) == ref


def test_sampan_serve_answers_with_the_same_tokens(saved, tmp_path):
    import httpx

    from sampan.serving import Server
    path, ref = saved
    d = tmp_path / "decode"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"path": os.path.relpath(path, d),
                                               "instance_count": 1}))
    s = Server({"decode": str(d)}).start()
    try:
        meta = httpx.get(f"{s.url}/v2/models/decode", timeout=30).json()
        names = [t["name"] for t in meta["inputs"]]
        w, n = feed()
        body = {"inputs": [
            {"name": names[0], "datatype": "INT64", "shape": list(w.shape),
             "data": w.ravel().tolist()},
            {"name": names[1], "datatype": "INT64", "shape": [], "data": [int(n)]}]}
        r = httpx.post(f"{s.url}/v2/models/decode/infer", json=body, timeout=60)
        assert r.status_code == 200, r.text
        outs = {o["name"]: o for o in r.json()["outputs"]}
    finally:
        s.stop()
    tokens, steps = (outs[t["name"]] for t in meta["outputs"])
    assert tokens["data"][:steps["data"][0]] == ref
