"""The composites that run as one row op (layer_norm -> layer_norm_affine) accept what the
composite accepted: numpy arrays as weight and bias."""
import numpy as np

import sampan


def test_layer_norm_takes_array_weight_and_bias():
    r = np.random.default_rng(2)
    x = r.standard_normal((3, 4)).astype(np.float32)
    w = r.standard_normal(4).astype(np.float32)
    b = r.standard_normal(4).astype(np.float32)
    got = sampan.layer_norm(sampan.tensor(x), 4, w, b).numpy()
    d = x - x.mean(-1, keepdims=True)
    ref = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
