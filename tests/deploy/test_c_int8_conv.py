"""The C target's int8 conv2d im2col / im2row (issue 35's int8 speed-up): the padded-copy
path of k_qconv2d_wcol (small images), its bounds-checked path (an image too big for the
padded copy), and k_qconv2d's 8-byte row copies (KW <= 8) and per-byte ones (KW > 8),
over strides, padding, dilation and groups, give the Predictor's int8 bytes exactly."""
import numpy as np
import pytest

import sampan
from sampan.deploy import generate

from test_c_int8 import FLAGS, _bits_equal, _build, _sample_fn
from test_c_target import CC, Lib, _predictor

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) on this machine")

# (x shape, w shape, stride, padding, dilation, groups, the kernel the generator picks)
CASES = [
    ((2, 1, 28, 28), (6, 1, 5, 5), (1, 1), (2, 2), (1, 1), 1, "k_qconv2d_wcol"),   # LeNet 1
    ((2, 2, 20, 19), (3, 2, 3, 3), (2, 1), (1, 2), (2, 1), 1, "k_qconv2d_wcol"),
    ((1, 4, 16, 16), (4, 2, 3, 2), (1, 2), (0, 1), (1, 2), 2, "k_qconv2d_wcol"),
    ((1, 2, 70, 70), (2, 2, 3, 3), (1, 1), (1, 1), (1, 1), 1, "k_qconv2d_wcol"),   # big
    ((2, 6, 14, 14), (16, 6, 5, 5), (1, 1), (0, 0), (1, 1), 1, "k_qconv2d"),      # LeNet 2
    ((1, 3, 12, 12), (32, 3, 9, 9), (1, 1), (4, 4), (1, 1), 1, "k_qconv2d"),      # KW > 8
    ((1, 4, 10, 11), (32, 2, 3, 4), (2, 1), (1, 0), (1, 2), 2, "k_qconv2d"),
]


def _args(xshape, wshape, rng):
    oc = wshape[0]
    return [rng.integers(0, 256, xshape).astype(np.uint8), np.float32(0.05), np.uint8(128),
            rng.integers(-60, 61, wshape).astype(np.int8), np.float32(0.004), np.int8(0),
            rng.integers(-300, 300, (oc,)).astype(np.int32), np.float32(0.5), np.int8(3)]


def test_int8_conv_im2col_paths_equal_the_predictor_bit_for_bit(tmp_path):
    rng = np.random.default_rng(7)
    progs = []
    for k, (xs, ws, st, pd, dl, g, kern) in enumerate(CASES):
        args = _args(xs, ws, rng)
        attrs = {"stride": st, "padding": pd, "dilation": dl, "groups": g}
        p = sampan.jit.save(_sample_fn("qlinear_conv2d", args, attrs),
                            str(tmp_path / f"c{k}.sampan"), (sampan.tensor(args[0]),))
        generate(p, str(tmp_path / f"c{k}"), target="c", prefix=f"m_c{k}",
                 max_batch=xs[0])
        src = (tmp_path / f"c{k}" / "model.c").read_text()
        assert f"{kern}({g}, " in src, (k, kern)
        progs.append((p, args[0]))
    so = _build([str(tmp_path / f"c{k}") for k in range(len(CASES))],
                str(tmp_path / "conv.so"), FLAGS["native"])
    for k, (p, x) in enumerate(progs):
        lib = Lib(so, f"m_c{k}", str(tmp_path / f"c{k}" / "weights.bin"))
        want = _predictor(p, [x])
        rc, got = lib.run([x], want, batch=x.shape[0])
        assert rc == 0, lib.error()
        _bits_equal(got, want, f"case {k}: {CASES[k]}")
        lib.close()
