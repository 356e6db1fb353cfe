"""Batch buckets of the program and onnxruntime kinds: the program kind pads to powers
of two up to 2 * pad_step and then every pad_step rows (a batch of 20 runs as 24 rows,
not 32), the onnxruntime kind does not pad unless asked; answers checked against the
numpy float64 reference at every batch size either way."""
import json
import os

import numpy as np
import pytest

from sampan.serving import ServingError
from sampan.serving.model import load_model

from ._models import mlp_reference, model_dir, save_mlp


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("pad"))
    path, w = save_mlp(folder)
    return folder, path, w


def test_program_buckets_step_past_the_powers_of_two(mlp):
    folder, path, w = mlp
    m = load_model("a", model_dir(folder, "a", path, max_batch_size=64))
    assert m._buckets == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    m = load_model("b", model_dir(folder, "b", path, max_batch_size=64, pad_step=0))
    assert m._buckets == [1, 2, 4, 8, 16, 32, 64]
    m = load_model("c", model_dir(folder, "c", path, max_batch_size=32, pad_step=4,
                                  dynamic_batching={"preferred_batch_sizes": [13]}))
    assert m._buckets == [1, 2, 4, 8, 12, 13, 16, 20, 24, 28, 32]
    for bad in (-1, 2.5, True, "8"):
        with pytest.raises(ServingError, match="pad_step must be a non-negative int"):
            load_model("d", model_dir(folder, f"d{bad}", path, max_batch_size=8,
                                      pad_step=bad))


def test_padded_and_unpadded_answers_match_numpy(mlp):
    folder, path, w = mlp
    prog = load_model("p", model_dir(folder, "p", path, max_batch_size=32))
    ort_dir = os.path.join(folder, "mlp_ort")
    with open(os.path.join(ort_dir, "config.json")) as f:
        cfg = json.load(f)
    ort = load_model("o", ort_dir, dict(cfg, max_batch_size=32))
    assert ort._buckets is None
    # no table indexed by an input: the worker may parse a JSON request's values
    assert prog.checks_values() is False and ort.checks_values() is False
    ort_pad = load_model("q", ort_dir, dict(cfg, max_batch_size=32, pad_batch=True))
    assert ort_pad._buckets == [1, 2, 4, 8, 16, 24, 32]
    x = np.random.default_rng(0).standard_normal((32, 12)).astype(np.float32)
    for n in (1, 3, 17, 20, 25, 32):
        ref = mlp_reference(w, x[:n])
        for m in (prog, ort, ort_pad):
            y = next(iter(m.infer({"x": x[:n]}).values()))
            assert y.shape == (n, 5)
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
