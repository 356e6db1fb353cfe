"""The pass list a user edits is the list the Predictor runs (issue 30): its steps
(unfuse, amp, quantize, fuse_quant, onnxruntime_offload) are registered passes in
`Config.pass_builder()`, options are set on the builder and reach the pass, the dump
hook (`switch_ir_debug`) sees exactly the list run, and every precision mode still
computes what it did (against eager and a numpy int8 reference)."""
import os

import numpy as np
import pytest

import sampan
from sampan.inference import Config, InferenceError, create_predictor
from sampan.passes import pipeline, register_pass, unregister_pass

from ._models import eager, rand


def _dumped(folder):
    """The step names the dump hook wrote, in order (after "loaded")."""
    ir = sorted(f for f in os.listdir(folder) if f.endswith(".ir"))
    assert ir[0] == "00_loaded.ir"
    return [f[:-3].split("_", 1)[1] for f in ir[1:]]


@pytest.fixture
def recorder():
    """A registered pass that records, per run, the option it was given."""
    seen = []

    def record(g, tag):
        seen.append(tag)
        return g
    register_pass("test_record", record, options={"tag": "default"})
    yield seen
    unregister_pass("test_record")


def test_edited_list_is_exactly_what_the_dump_hook_saw(saved, tmp_path, recorder):
    models, paths = saved
    cfg = Config(paths["cnn"])
    cfg.switch_ir_debug(str(tmp_path))
    b = cfg.pass_builder()
    b.delete_pass("cse")                                   # delete one
    b.insert_pass(2, "test_record")                        # insert one
    names = b.all_passes()
    i, j = names.index("fold_batch_norm"), names.index("simplify")
    b.delete_pass(i)                                       # reorder: fold_batch_norm first
    b.insert_pass(0, "fold_batch_norm")
    b.set_option("test_record", tag="set on the builder")
    want = b.all_passes()
    assert want[0] == "fold_batch_norm" and "cse" not in want and want[3] == "test_record"
    assert j != 0
    p = create_predictor(cfg)
    assert p.passes_run == want == b.enabled_passes()
    assert _dumped(tmp_path) == want
    assert recorder == ["set on the builder"]
    x = rand(2, 1, 8, 8)
    np.testing.assert_allclose(p.run([x])[0], eager(models["cnn"], x), rtol=1e-4, atol=1e-5)
    b.set_option("test_record", tag="again")
    b.turn_off("fold_constants")
    create_predictor(cfg)
    assert _dumped(tmp_path) == [n for n in want if n != "fold_constants"]
    assert recorder[-1] == "again"


def test_builder_options_are_checked_and_kept_by_copies(saved):
    _, paths = saved
    b = Config(paths["mlp"]).pass_builder()
    with pytest.raises(InferenceError, match=r"set_option: pass 'amp' has no option 'dtyp'; "
                                             r"its options: dtype='bfloat16'"):
        b.set_option("amp", dtyp="float16")
    with pytest.raises(InferenceError, match="set_option: unknown pass 'nope'"):
        b.set_option("nope", x=1)
    assert b.get_option("amp", "dtype") == "bfloat16"
    b.set_option("amp", dtype="float16")
    assert b.get_option("amp", "dtype") == "float16"
    assert b.copy().options() == {"amp": {"dtype": "float16"}}
    with pytest.raises(InferenceError, match="get_option: pass 'amp' has no option 'k'"):
        b.get_option("amp", "k")


def test_settings_put_their_steps_in_the_list_and_take_them_out_again(saved):
    _, paths = saved
    cfg = Config(paths["mlp"])
    base = pipeline("predictor")
    cfg.set_precision("bf16")
    assert cfg.pass_builder().all_passes() == ["unfuse", "amp"] + base
    cfg.set_precision("int8", weight_only=True)
    assert cfg.pass_builder().all_passes() == ["quantize", "fuse_quant"] + base
    assert cfg.pass_builder().get_option("quantize", "weight_only") is True
    cfg.set_precision("fp32")
    assert cfg.pass_builder().all_passes() == base
    cfg.set_runtime("numpy")
    no_fusion = [n for n in base if n != "fuse_elementwise"]
    assert cfg.pass_builder().all_passes() == ["unfuse"] + no_fusion
    cfg.set_runtime("onnxruntime")
    assert cfg.pass_builder().all_passes() == (["unfuse"] + no_fusion[:-3]
                                               + ["onnxruntime_offload", "partition",
                                                  "fuse_layers", "plan_memory"])
    assert cfg.pass_builder().get_option("onnxruntime_offload", "min_subgraph_size") == 1
    cfg.set_runtime("numba")
    assert cfg.pass_builder().all_passes() == base
    cfg.enable_onnxruntime_offload(2)
    at = base.index("fuse_elementwise")
    assert cfg.pass_builder().all_passes() == (["unfuse"] + base[:at]
                                               + ["onnxruntime_offload"] + base[at:])
    assert cfg.pass_builder().get_option("onnxruntime_offload", "min_subgraph_size") == 2


@pytest.mark.parametrize("mode", ["fp32", "bf16", "int8", "int8_weight_only",
                                  "onnxruntime", "offload"])
def test_each_mode_runs_its_list_and_computes_what_it_did(saved, tmp_path, mode):
    models, paths = saved
    cfg = Config(paths["mlp"])
    cal = [rand(16, 8, seed=s) for s in range(3)]
    if mode == "bf16":
        cfg.set_precision("bf16")
    elif mode == "int8":
        cfg.set_precision("int8", calibration_data=cal)
    elif mode == "int8_weight_only":
        cfg.set_precision("int8", weight_only=True)
    elif mode == "onnxruntime":
        cfg.set_runtime("onnxruntime")
    elif mode == "offload":
        cfg.enable_onnxruntime_offload(2)
    cfg.switch_ir_debug(str(tmp_path))
    p = create_predictor(cfg)
    assert p.passes_run == cfg.pass_builder().enabled_passes() == _dumped(tmp_path)
    x = rand(5, 8, seed=9)
    got, want = p.run([x])[0], eager(models["mlp"], x)
    scale = np.abs(want).max()
    if mode in ("fp32", "onnxruntime", "offload"):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        if mode != "fp32":
            assert any(n.op == "engine" for n in p.graph.nodes)
    elif mode == "bf16":
        assert any(n.outputs[0].dtype == sampan.bfloat16 for n in p.graph.nodes)
        np.testing.assert_allclose(got, want, atol=3e-2 * scale)
    elif mode == "int8":
        # int8 from layer to layer (issue 31): a requantising layer, then a float one
        assert [n.op for n in p.graph.nodes if n.op.startswith("q")] == [
            "quantize", "qlinear_dense", "qdense"]
        np.testing.assert_allclose(got, _int8_reference(models["mlp"], cal, x),
                                   rtol=1e-5, atol=1e-5 * scale)
        old = sampan.quant.quantize_program(paths["mlp"], cal, str(tmp_path / "q.sampan"))
        np.testing.assert_allclose(got, create_predictor(Config(old)).run([x])[0],
                                   rtol=1e-6, atol=1e-6)      # as the old temp program
    else:
        w8 = [_int8_weight(layer.weight.numpy()) for layer in (models["mlp"][0],
                                                               models["mlp"][2])]
        h = np.maximum(x @ w8[0] + models["mlp"][0].bias.numpy(), 0)
        np.testing.assert_allclose(got, h @ w8[1] + models["mlp"][2].bias.numpy(),
                                   rtol=1e-4, atol=1e-5)


def _int8_weight(w):
    """Symmetric per-output-column int8 of w (in, out), dequantised (float64)."""
    s = np.where(np.abs(w).max(0) > 0, np.abs(w).max(0) / 127.0, 1.0).astype(np.float32)
    return np.clip(np.rint(w / s), -127, 127) * s.astype(np.float64)


def _affine(lo, hi):
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    s = np.float32((hi - lo) / 255.0)
    return s, int(np.clip(np.rint(-128 - lo / s), -128, 127))


def _int8_reference(mlp, cal, x):
    """numpy: both Linears int8 (per-tensor affine activations from min/max over the
    float model's calibration values, per-channel symmetric weights), accumulated exactly,
    the first requantised in its epilogue as onnxruntime does (int32 bias at sx * sw, a
    float32 multiplier, the ReLU as the lower bound), the second dequantised."""
    l1, l2 = mlp[0], mlp[2]
    w1, b1, w2, b2 = (a.numpy() for a in (l1.weight, l1.bias, l2.weight, l2.bias))
    xs = np.concatenate(cal)
    h = np.maximum(xs @ w1 + b1, 0)
    (s1, z1), (s2, z2) = _affine(xs.min(), xs.max()), _affine(h.min(), h.max())

    def layer(q, s, z, w, b):
        ws = np.where(np.abs(w).max(0) > 0, np.abs(w).max(0) / 127.0, 1.0).astype(np.float32)
        wq = np.clip(np.rint(w / ws), -127, 127).astype(np.int64)
        bq = np.rint(b.astype(np.float64) / (np.float64(s) * ws.astype(np.float64)))
        acc = (q.astype(np.int64) - z) @ wq + bq.astype(np.int64)
        return acc.astype(np.float32), np.float32(s) * ws
    q1 = np.clip(np.rint(x / s1) + z1, -128, 127)
    acc, m = layer(q1, s1, z1, w1, b1)
    q2 = np.clip(np.rint(acc * (m / s2)).astype(np.int64) + z2, z2, 127)
    acc, m = layer(q2, s2, z2, w2, b2)
    return acc * m


def test_an_option_set_on_the_builder_reaches_the_pass_and_outlives_other_settings(saved):
    models, paths = saved
    cfg = Config(paths["mlp"])
    cfg.enable_onnxruntime_offload(2)
    assert any(n.op == "engine" for n in create_predictor(cfg).graph.nodes)
    cfg.pass_builder().set_option("onnxruntime_offload", min_subgraph_size=50)
    cfg.set_precision("fp32")                   # another setting: the option stays
    assert cfg.pass_builder().get_option("onnxruntime_offload", "min_subgraph_size") == 50
    p = create_predictor(cfg)
    assert "onnxruntime_offload" in p.passes_run
    assert not any(n.op == "engine" for n in p.graph.nodes)       # no group of 50 nodes
    assert all("min_subgraph_size=50" in why or "ONNX" in why
               for _, why in p.graph.meta["offload_report"])
    x = rand(3, 8)
    np.testing.assert_allclose(p.run([x])[0], eager(models["mlp"], x), rtol=1e-5, atol=1e-5)


def test_provider_lists_put_the_steps_of_the_runtime_they_spell(saved):
    _, paths = saved
    base = pipeline("predictor")
    no_fusion = [n for n in base if n != "fuse_elementwise"]
    cfg = Config(paths["mlp"])
    cfg.set_providers(["numpy"])
    assert cfg.pass_builder().all_passes() == ["unfuse"] + no_fusion
    cfg.set_providers(["onnxruntime", "numpy"])
    old = Config(paths["mlp"])
    old.set_runtime("onnxruntime")
    assert cfg.pass_builder().all_passes() == old.pass_builder().all_passes()
    cfg.set_providers(["onnxruntime", "numba", "numpy"])      # offload, the rest fused
    at = base.index("fuse_elementwise")
    assert cfg.pass_builder().all_passes() == (["unfuse"] + base[:at]
                                               + ["onnxruntime_offload"] + base[at:])
    assert cfg.pass_builder().get_option("onnxruntime_offload", "min_subgraph_size") == 3
    cfg.set_providers(["onednn", "numba", "numpy"])
    assert cfg.pass_builder().enabled_passes() == base
    p = create_predictor(cfg)
    assert p.passes_run == base
