"""Issue 31: the numba runtime binds the direct kernels to stride-2 depthwise convolutions
too (PP-OCR's 5x5 layers at stride (2, 1) and (2, 2)), whatever their size, and they give
PyTorch's numbers at batch 1 and above."""
import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.inference import Config, create_predictor

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("stride", [(2, 1), (2, 2)])
def test_strided_depthwise_is_specialised_and_matches_torch(tmp_path, stride):
    sampan.manual_seed(0)
    conv = nn.Conv2d(12, 12, 5, stride=stride, padding=2, groups=12)
    m = nn.Sequential(conv, nn.ReLU())
    m.eval()
    path = sampan.jit.save(m, str(tmp_path / "dw.sampan"), (sampan.randn(2, 12, 6, 20),),
                           dynamic={"x": {0: "batch"}})
    cfg = Config(path)
    cfg.pass_builder().delete_pass("fuse_layers")   # the specialised conv itself (its
    p = create_predictor(cfg)                         # conv2d_block runs the same kernel)
    ref = torch.nn.Conv2d(12, 12, 5, stride=stride, padding=2, groups=12)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(conv.weight.numpy()))
        ref.bias.copy_(torch.from_numpy(conv.bias.numpy()))
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 12, 6, 20)).astype(np.float32)
        (got,) = p.run([x])
        with torch.no_grad():
            want = torch.relu(ref(torch.from_numpy(x))).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        specialised = [ln for ln in p.code.splitlines() if "= s" in ln and "_conv2d(" in ln]
        assert len(specialised) == 1, p.code
