"""The C target's branch-free e^x and erf (`sp_expf`, `sp_erff`: the loops of softmax and
GELU vectorise around them) and the 8-lane softmax, against float64 references (math.erf,
numpy's softmax in float64), over the whole float range and its special values: erf
within 3e-7, softmax / log_softmax within 1e-6 relative (masked -inf entries exactly 0),
NaN propagating: natively with vectors, in the plain loops (-DSP_NO_VECTORS) and in
wasm SIMD128 under Node."""
import importlib.util
import math
import os
import shutil

import numpy as np
import pytest

import sampan
from sampan.deploy import generate

from test_c_target import CC, Lib, _cc

HAS_WASM = importlib.util.find_spec("ziglang") is not None and shutil.which("node") is not None

N = 131          # not a multiple of 8: the softmax's 8 lanes and its tail both run


class Net(sampan.nn.Module):
    def forward(self, x):
        return (sampan.erf(x), sampan.nn.functional.gelu(x),
                sampan.nn.functional.softmax(x, -1), sampan.nn.functional.log_softmax(x, -1))


def _inputs():
    rng = np.random.default_rng(0)
    x = np.empty((6, N), np.float32)
    x[0] = np.linspace(-6, 6, N)                         # erf's both branches, |x| = 0.5
    x[1] = np.linspace(-0.6, 0.6, N)
    x[2] = rng.standard_normal(N) * 30                   # softmax rows far from 0
    x[3] = rng.standard_normal(N) * 3
    x[3, ::7] = -np.inf                                  # masked entries
    x[4] = rng.uniform(80, 89, N)                        # e^x near overflow before the max
    x[5] = rng.standard_normal(N)
    x[5, 5] = np.nan                                     # NaN: erf there, the whole row
    x[5, 9], x[5, 10], x[5, 11], x[5, 12] = 1e-30, -1e-30, np.inf, -np.inf
    return x


def _softmax64(x):
    x = x.astype(np.float64)
    m = np.max(x, -1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(-1, keepdims=True), (x - m) - np.log(e.sum(-1, keepdims=True))


@pytest.mark.parametrize("flags", [
    pytest.param(["-O2", "-march=native"], id="vectors",
                 marks=pytest.mark.skipif(CC is None, reason="no C compiler (cc)")),
    pytest.param(["-O2", "-DSP_NO_VECTORS"], id="plain",
                 marks=pytest.mark.skipif(CC is None, reason="no C compiler (cc)")),
    pytest.param("wasm", id="wasm-simd128",
                 marks=pytest.mark.skipif(not HAS_WASM, reason="zig (ziglang) or node missing"))])
def test_erf_gelu_softmax_match_float64(tmp_path, flags):
    x = _inputs()
    p = sampan.jit.save(Net().eval(), str(tmp_path / "m.sampan"), (sampan.tensor(x),))
    out = tmp_path / "c"
    generate(p, str(out), target="c")
    src = (out / "model.c").read_text()
    assert "sp_erff(" in src and "sp_expf(" in src
    if flags == "wasm":          # V8: float-to-int conversions trap on NaN there
        from sampan.deploy import wasm
        wasm.build_wasm(str(out), str(tmp_path / "w"))
        erf, gelu, sm, lsm = wasm.run_node(str(tmp_path / "w"), [x])["outputs"]
    else:
        so = _cc(str(tmp_path / "m.so"), [os.path.join(out, "model.c")], flags)
        lib = Lib(so, "model", str(out / "weights.bin"))
        rc, (erf, gelu, sm, lsm) = lib.run([x], [np.zeros_like(x) for _ in range(4)])
        assert rc == 0, lib.error()
        lib.close()

    x64 = x.astype(np.float64)
    erf64 = np.vectorize(math.erf)(np.nan_to_num(x64, nan=0.0, posinf=np.inf, neginf=-np.inf))
    erf64[np.isnan(x64)] = np.nan
    np.testing.assert_allclose(erf, erf64, rtol=0, atol=3e-7, equal_nan=True)
    small = np.abs(x64) < 1e-3                       # tiny arguments: relative accuracy
    np.testing.assert_allclose(erf[small], erf64[small], rtol=1e-6, atol=0)
    # gelu = x/2 (1 + erf(x / sqrt 2)), from math.erf at x / sqrt 2 in float64
    with np.errstate(invalid="ignore"):          # -inf * 0
        g64 = x64 * 0.5 * (1 + np.vectorize(lambda v: math.erf(v / math.sqrt(2)))(
            np.nan_to_num(x64, nan=0.0)))
    g64[np.isnan(x64)] = np.nan
    fin = np.isfinite(x64)
    np.testing.assert_allclose(gelu[fin], g64[fin], rtol=1e-6, atol=3e-7)
    assert gelu[5, 11] == np.inf and np.isnan(gelu[5, 5])

    sm64, lsm64 = _softmax64(x[:5])
    np.testing.assert_allclose(sm[:5], sm64, rtol=1e-6, atol=1e-9)
    assert np.all(sm[3, ::7] == 0.0) and np.all(lsm[3, ::7] == -np.inf)
    keep = np.isfinite(lsm64)
    np.testing.assert_allclose(lsm[:5][keep], lsm64[keep], rtol=1e-6, atol=2e-6)
    np.testing.assert_allclose(sm[:5].sum(-1), 1.0, rtol=2e-6)
    assert np.all(np.isnan(sm[5])) and np.all(np.isnan(lsm[5]))
