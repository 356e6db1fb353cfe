"""Config.set_precision("int8"): the Predictor serves sampan.quant's int8 program, made at
create_predictor from calibration batches, weight-only, or given already quantised."""
import numpy as np
import pytest

import sampan
from sampan.inference import Config, InferenceError, create_predictor

from ._models import eager, rand


def _run(p, x):
    p.get_input_handle(p.get_input_names()[0]).copy_from_cpu(x)
    p.run()
    return p.get_output_handle(p.get_output_names()[0]).copy_to_cpu()


def test_int8_from_calibration_weight_only_and_prequantised(saved, tmp_path):
    models, paths = saved
    x = rand(5, 8, seed=3)
    want = eager(models["mlp"], x)
    cal = [rand(16, 8, seed=s) for s in range(4)]
    cfg = Config(paths["mlp"])
    cfg.set_precision("int8", calibration_data=cal)
    p = create_predictor(cfg)
    assert any(n.op in ("qmatmul", "quantize") for n in p.graph.nodes)
    got = _run(p, x)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 0.05 * scale       # int8: close, not equal
    assert not np.array_equal(got, want)
    cfg_w = Config(paths["mlp"])
    cfg_w.set_precision("int8", weight_only=True)
    assert np.abs(_run(create_predictor(cfg_w), x) - want).max() <= 0.05 * scale
    q = sampan.quant.quantize_program(paths["mlp"], cal, str(tmp_path / "q.sampan"))
    cfg_q = Config(q)
    cfg_q.set_precision("int8")                     # already int8: served as it is
    np.testing.assert_allclose(_run(create_predictor(cfg_q), x), got, rtol=1e-6, atol=1e-6)


def test_int8_without_data_is_a_clear_error(saved):
    _, paths = saved
    cfg = Config(paths["mlp"])
    cfg.set_precision("int8")
    with pytest.raises(InferenceError, match="needs calibration_data"):
        create_predictor(cfg)
