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
