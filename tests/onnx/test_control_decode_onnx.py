"""Issue 34: the char-GPT decodes (greedy and beam search, each one `while_loop`) exported
to ONNX (a `Loop` node) and run by onnxruntime give sampan's tokens."""
import os
import sys

import numpy as np
import pytest

import sampan

ort = pytest.importorskip("onnxruntime")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import char_gpt  # noqa: E402

V, BLOCK, PROMPT = 13, 8, [1, 2, 3]


def tiny():
    sampan.manual_seed(2)
    m = char_gpt.CharGPT(V, d_model=16, n_head=2, n_layer=1, block=BLOCK)
    for p in m.parameters():
        sampan.nn.init.normal_(p, 0.0, 0.6)
    m.eval()
    return m


def run_ort(path, feeds):
    import onnx
    ops = {n.op_type for n in onnx.load(path).graph.node}
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    return ops, s.run(None, dict(zip(names, feeds)))


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_exported_decode_run_by_onnxruntime_gives_sampans_tokens(tmp_path, kind):
    m = tiny()
    dec = (char_gpt.GreedyDecoder(m, BLOCK, 10, 2) if kind == "greedy"
           else char_gpt.BeamDecoder(m, BLOCK, 6, 2, 3, V))
    window, n = char_gpt.prompt_window(PROMPT, BLOCK)
    with sampan.no_grad():
        want = [t.numpy() for t in sampan.jit(dec, pipeline="inference")(window, n)]
        path = str(tmp_path / f"{kind}.onnx")
        sampan.onnx.export(dec, (window, n), path)
    ops, got = run_ort(path, [window.numpy(), n.numpy()])
    assert "Loop" in ops
    steps = int(want[1])
    assert int(got[1]) == steps
    np.testing.assert_array_equal(got[0][:, :steps], want[0][:, :steps])
    if kind == "greedy":
        assert list(got[0][0, :steps]) == char_gpt.greedy_eager(m, PROMPT, BLOCK, 10, 2)
    else:
        np.testing.assert_allclose(got[2], want[2], rtol=1e-4, atol=1e-4)
