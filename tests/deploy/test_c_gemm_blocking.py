"""The C target's packed GEMM per target (issue 35's edge figures): the half-panel single
rows that wasm SIMD128 compiles (`-DSP_GEMM_NARROW` natively), the default 16-float rows
with their prefetch, and the plain loops, all equal the Predictor (float32, 1e-5 relative)
on dense layers with K not a multiple of 4 and N not one of 16, at batches that leave
single rows after the 8- and 4-row blocks."""
import os
import subprocess

import numpy as np
import pytest

import sampan
from sampan.deploy import generate

from test_c_target import CC, Lib, _close, _predictor

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) on this machine")

FLAGS = {"narrow": ["-DSP_GEMM_NARROW"], "wide": [], "plain": ["-DSP_NO_VECTORS"]}


def test_every_gemm_blocking_equals_the_predictor(tmp_path):
    sampan.manual_seed(0)
    net = sampan.nn.Sequential(sampan.nn.Linear(203, 37), sampan.nn.ReLU(),
                               sampan.nn.Linear(37, 18)).eval()
    p = sampan.jit.save(net, str(tmp_path / "d.sampan"), (sampan.randn(2, 203),),
                        dynamic={"x": {0: "batch"}})
    generate(p, str(tmp_path / "d"), target="c", max_batch=16)
    src = (tmp_path / "d" / "model.c").read_text()
    assert "SP_GEMM_NARROW" in src and "SP_PREFETCH(b)" in src
    rng = np.random.default_rng(0)
    for name, flags in FLAGS.items():
        so = str(tmp_path / f"{name}.so")
        r = subprocess.run([CC, "-O1", "-march=native", *flags, "-Wall", "-Wextra", "-std=c99",
                            "-fPIC", "-shared", "-o", so, os.path.join(tmp_path, "d", "model.c"),
                            "-lm"], capture_output=True, text=True)
        assert r.returncode == 0 and not r.stderr.strip(), r.stderr[-3000:]
        lib = Lib(so, "model", str(tmp_path / "d" / "weights.bin"))
        for b in (1, 3, 15):
            x = rng.standard_normal((b, 203), dtype=np.float32)
            want = _predictor(p, [x])
            rc, got = lib.run([x], want, batch=b)
            assert rc == 0, lib.error()
            _close(got, want, f"{name} batch {b}")
        lib.close()


class _Products(sampan.nn.Module):
    """Attention's batched products of two computed values (k_gemm): scores, then mixing."""

    def forward(self, q, k):
        s = sampan.matmul(q, k)                       # (2, 3, 13, 19): rows and columns left
        return sampan.matmul(s, sampan.tanh(k.transpose(-1, -2)))    # (2, 3, 13, 21)


def test_every_blocking_of_the_batched_products_equals_the_predictor(tmp_path):
    """k_gemm's 4 x 8 blocks (-DSP_GEMM_NARROW, as wasm compiles), its 8 x 16 ones and the
    plain loops, on products whose M, N and K are none of 4, 8 or 16's multiples, within
    1e-6 of the largest |value| of the float64 product."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 13, 21), dtype=np.float32)
    k = rng.standard_normal((2, 3, 21, 19), dtype=np.float32)
    p = sampan.jit.save(_Products().eval(), str(tmp_path / "p.sampan"),
                        (sampan.tensor(q), sampan.tensor(k)))
    generate(p, str(tmp_path / "p"), target="c")
    assert "k_gemm(" in (tmp_path / "p" / "model.c").read_text()
    want = _predictor(p, [q, k])
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    ref = (q64 @ k64) @ np.tanh(np.swapaxes(k64, -1, -2))      # float64
    for name, flags in FLAGS.items():
        so = str(tmp_path / f"{name}.so")
        r = subprocess.run([CC, "-O2", "-march=native", *flags, "-Wall", "-Wextra", "-std=c99",
                            "-fPIC", "-shared", "-o", so, os.path.join(tmp_path, "p", "model.c"),
                            "-lm"], capture_output=True, text=True)
        assert r.returncode == 0 and not r.stderr.strip(), r.stderr[-3000:]
        lib = Lib(so, "model", str(tmp_path / "p" / "weights.bin"))
        rc, got = lib.run([q, k], want)
        assert rc == 0, lib.error()
        err = np.abs(got[0] - ref).max() / np.abs(ref).max()
        assert got[0].shape == ref.shape and err <= 1e-6, f"{name}: relative error {err:.3g}"
        lib.close()
