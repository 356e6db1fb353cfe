"""Config: every pass-builder edit (seen in the steps run and the debug dumps), a pass
that breaks the graph, the switches, the runtimes and the precisions not available yet."""
import os

import numpy as np
import pytest

import sampan
from sampan.inference import Config, InferenceError, NotAvailableError, create_predictor
from sampan.passes import pipeline, register_pass, unregister_pass

from ._models import eager, rand


def _steps(folder):
    """The numbered steps a debug dir holds, in order; each has .ir and .dot."""
    files = sorted(os.listdir(folder))
    ir = [f[:-3] for f in files if f.endswith(".ir")]
    assert [f[:-4] for f in files if f.endswith(".dot")] == ir
    assert [int(f.split("_")[0]) for f in ir] == list(range(len(ir)))
    return [f.split("_", 1)[1] for f in ir]


def _check(p, model, shape=(2, 8)):
    x = rand(*shape)
    np.testing.assert_allclose(p.run([x])[0], eager(model, x), rtol=1e-4, atol=1e-5)


def test_default_pipeline_and_dumps(saved, tmp_path):
    models, paths = saved
    cfg = Config(paths["mlp"])
    assert cfg.pass_builder().all_passes() == pipeline("predictor")
    assert cfg.pass_builder().all_passes()[-1] == "plan_memory"
    cfg.switch_ir_debug(str(tmp_path))
    p = create_predictor(cfg)
    assert p.passes_run == pipeline("predictor")
    assert _steps(tmp_path) == ["loaded"] + pipeline("predictor")
    # step 11: "licm" (issue 34: a Predictor hoists loop invariants) and fuse_attention
    # (issue 31: nothing to do in an MLP) precede the fusion
    text = open(tmp_path / "11_fuse_elementwise.ir").read()
    assert text.splitlines()[0] == "// after step 11: fuse_elementwise"
    # step 14: fuse_layers (issue 31) folds each layer's epilogue; onednn_layout,
    # partition and the plan change no text
    last = open(tmp_path / "14_fuse_layers.ir").read()
    assert last.split("\n", 1)[1] == str(p.graph) != text.split("\n", 1)[1]
    assert open(tmp_path / "14_fuse_layers.dot").read() == p.graph.to_dot()
    assert open(tmp_path / "00_loaded.dot").read().startswith("digraph")
    _check(p, models["mlp"])


def test_every_edit_shows_in_the_steps_and_the_dumps(saved, tmp_path):
    models, paths = saved
    cfg = Config(paths["mlp"])
    cfg.switch_ir_debug(str(tmp_path))
    b = cfg.pass_builder()
    b.delete_pass("cse")                         # by name
    b.delete_pass(0)                             # by index: freeze_state
    b.insert_pass(0, "dce")
    b.append_pass("cse")
    b.turn_off("fold_batch_norm")
    b.turn_off("simplify")                       # every occurrence
    want_all = ["dce", "fold_constants", "dce", "fold_batch_norm", "dce", "licm",
                "fuse_attention", "fuse_elementwise", "onednn_layout", "partition", "fuse_layers", "plan_memory",
                "cse"]
    want_all.insert(1, "simplify")
    want_all.insert(3, "simplify")
    assert b.all_passes() == want_all
    assert b.enabled_passes() == [n for n in want_all if n not in ("simplify",
                                                                   "fold_batch_norm")]
    p = create_predictor(cfg)
    assert p.passes_run == ["dce", "fold_constants", "dce", "dce", "licm", "fuse_attention",
                            "fuse_elementwise", "onednn_layout", "partition", "fuse_layers",
                            "cse",
                            "plan_memory"]
    assert _steps(tmp_path) == ["loaded"] + p.passes_run
    _check(p, models["mlp"])
    b.turn_on("simplify")
    b.delete_pass(-1)
    create_predictor(cfg)                        # a second run replaces the old dumps
    assert _steps(tmp_path) == ["loaded", "dce", "simplify", "fold_constants", "simplify",
                                "dce", "dce", "licm", "fuse_attention", "fuse_elementwise",
                                "onednn_layout",
                                "partition", "fuse_layers", "plan_memory"]


def test_edits_of_unknown_passes_fail_at_once(saved):
    _, paths = saved
    b = Config(paths["mlp"]).pass_builder()
    with pytest.raises(InferenceError, match=r"append_pass: unknown pass 'fuse_everything'; "
                                             r"registered passes: .*cse"):
        b.append_pass("fuse_everything")
    with pytest.raises(InferenceError, match="insert_pass: unknown pass 'nope'"):
        b.insert_pass(1, "nope")
    with pytest.raises(InferenceError, match="delete_pass: pass 'nope' is not in"):
        b.delete_pass("nope")
    with pytest.raises(InferenceError, match="index 40 is outside"):
        b.delete_pass(40)
    with pytest.raises(InferenceError, match="turn_off: pass 'nope'"):
        b.turn_off("nope")
    assert b.all_passes() == pipeline("predictor")


def test_a_pass_that_breaks_the_graph_is_named_with_the_passes_before_it(saved):
    _, paths = saved

    def breaks(g):
        """Drop the first node (its users now read a dangling value)."""
        g.nodes.pop(0)
        return g

    def raises(g):
        raise RuntimeError("boom")
    register_pass("test_breaks_graph", breaks)
    register_pass("test_raises", raises)
    try:
        cfg = Config(paths["mlp"])
        cfg.pass_builder().insert_pass(3, "test_breaks_graph")
        with pytest.raises(InferenceError, match=r"pass 'test_breaks_graph' left an invalid "
                                                 r"graph: .*dangling.*\npasses run before it: "
                                                 r"\['freeze_state', 'simplify', "
                                                 r"'fold_constants'\]"):
            create_predictor(cfg)
        cfg.pass_builder().turn_off("test_breaks_graph")
        create_predictor(cfg)                    # skipped: fine
        cfg.pass_builder().insert_pass(0, "test_raises")
        with pytest.raises(InferenceError, match=r"pass 'test_raises' failed \(RuntimeError: "
                                                 r"boom\); passes run before it: none"):
            create_predictor(cfg)
    finally:
        unregister_pass("test_breaks_graph")
        unregister_pass("test_raises")


def test_ir_optim_and_memory_optim_switches(saved, tmp_path):
    models, paths = saved
    cfg = Config(paths["cnn"])
    cfg.switch_ir_optim(False)
    cfg.switch_ir_debug(str(tmp_path))
    p = create_predictor(cfg)
    assert p.passes_run == ["partition", "plan_memory"]
    assert _steps(tmp_path) == ["loaded", "partition", "plan_memory"]
    _check(p, models["cnn"], (2, 1, 8, 8))
    assert p._last.plan is not None              # planned buffers
    cfg.disable_memory_optim()
    p = create_predictor(cfg)
    assert p.passes_run == ["partition"] and not cfg.memory_optim_enabled()
    _check(p, models["cnn"], (3, 1, 8, 8))
    assert p._last.plan is None
    cfg.switch_ir_optim(True)
    cfg.enable_memory_optim()
    cfg.pass_builder().turn_off("plan_memory")   # the pass list decides too
    assert "plan_memory" not in create_predictor(cfg).passes_run


def test_numpy_runtime_runs_no_generated_kernels(saved, tmp_path):
    models, paths = saved
    cfg = Config(paths["cnn"])
    assert cfg.runtime() == "numba"
    generated = ("fused", "conv2d_block", "dense")     # fuse_layers takes in the fused epilogues
    assert any(n.op in generated for n in create_predictor(cfg).graph.nodes)
    cfg.set_runtime("numpy")
    cfg.switch_ir_debug(str(tmp_path))
    p = create_predictor(cfg)
    assert not any(n.op in generated for n in p.graph.nodes)
    assert p.passes_run[0] == "unfuse" and "fuse_elementwise" not in p.passes_run
    assert _steps(tmp_path)[:2] == ["loaded", "unfuse"]
    _check(p, models["cnn"], (1, 1, 8, 8))
    assert "fused" not in p.code


def test_runtime_and_precision_options(saved):
    _, paths = saved
    cfg = Config(paths["mlp"])
    ort = cfg.copy()              # the onnxruntime options: tests/inference/test_offload.py
    ort.set_runtime("onnxruntime")
    ort.enable_onnxruntime_offload(min_subgraph_size=3)
    assert ort.runtime() == "onnxruntime"
    assert "onnxruntime_offload" in ort.pass_builder().all_passes()
    with pytest.raises(InferenceError, match="unknown runtime 'tvm'"):
        cfg.set_runtime("tvm")
    cfg.set_precision("fp32")
    with pytest.raises(InferenceError, match="unknown observer 'median'"):
        cfg.set_precision("int8", observer="median")
    with pytest.raises(InferenceError, match="unknown precision 'fp8'"):
        cfg.set_precision("fp8")
    assert cfg.runtime() == "numba" and cfg.precision() == "fp32"
    with pytest.raises(InferenceError, match="positive int"):
        cfg.set_num_threads(0)
    before = sampan.get_num_threads()
    try:
        cfg.set_num_threads(1)
        create_predictor(cfg)
        assert sampan.get_num_threads() == 1
    finally:
        sampan.set_num_threads(before)
    assert "runtime       numba" in cfg.summary()
    with pytest.raises(InferenceError, match="expected a sampan.inference.Config"):
        create_predictor(paths["mlp"])


def test_config_edits_after_create_do_not_change_the_predictor(saved):
    _, paths = saved
    cfg = Config(paths["mlp"])
    p = create_predictor(cfg)
    cfg.pass_builder().delete_pass("cse")
    assert "cse" in p.passes_run


@pytest.mark.parametrize("name,shape", [("mlp", (3, 8)), ("cnn", (2, 1, 8, 8))])
def test_bf16_casts_the_weights_and_computes_in_bf16(saved, tmp_path, name, shape):
    """set_precision("bf16") runs the `amp` pass first (the op table's autocast policy):
    GEMM/conv weights become bfloat16 constants, those GEMMs compute in bfloat16."""
    models, paths = saved
    cfg = Config(paths[name])
    cfg.set_precision("bf16")
    cfg.switch_ir_debug(str(tmp_path))
    p = create_predictor(cfg)
    assert p.passes_run[:2] == ["unfuse", "amp"] and p.passes_run[-1] == "plan_memory"
    assert _steps(tmp_path)[1:3] == ["unfuse", "amp"]
    w = p.weights()
    gemm_w = {v.name for n in p.graph.nodes if n.op in ("matmul", "conv2d")
              for v in n.inputs if v.is_const}
    assert gemm_w and all(w[k].dtype == sampan.bfloat16 for k in gemm_w)
    assert all(n.outputs[0].dtype == sampan.bfloat16 for n in p.graph.nodes
               if n.op in ("matmul", "conv2d"))
    assert p.get_input_handle("x").type() == np.float32
    x = rand(*shape)
    got = p.run([x])[0]
    want = eager(models[name], x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=3e-2 * np.abs(want).max())
    assert not np.array_equal(got, want)        # it did compute in bfloat16
    c = p.clone()
    assert all(c.weights()[k] is a for k, a in w.items())
    np.testing.assert_array_equal(c.run([x])[0], got)
