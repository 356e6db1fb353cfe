"""`sampan.deploy.report` / `sampan deploy --report` over a C folder, and `threads=`
(OpenMP where the compiler has it): the threaded build gives the same bytes."""
import subprocess

import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.cli import main
from sampan.deploy import DeployError, generate, report
from sampan.ops.registry import OPS

from test_c_target import CC, Lib, _predictor

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) on this machine")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("c_report")
    sampan.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 8)).eval()
    p = sampan.jit.save(net, str(tmp / "m.sampan"), (sampan.randn(2, 64),),
                        dynamic={"x": {0: "batch"}})
    out = {}
    for t in (1, 2):
        d = tmp / f"t{t}"
        generate(p, str(d), target="c", threads=t, max_batch=16)
        r = subprocess.run(["make", "-s", "-C", str(d), "CFLAGS=-O1"], capture_output=True,
                           text=True)
        assert r.returncode == 0 and not r.stderr.strip(), r.stderr
        out[t] = d
    return p, out


def test_threads_give_the_same_bytes_and_use_openmp_where_the_compiler_has_it(built):
    p, out = built
    x = np.random.default_rng(0).standard_normal((16, 64), dtype=np.float32)
    want = _predictor(p, [x])
    got = {}
    for t, d in out.items():
        lib = Lib(str(d / "libmodel.so"), "model", str(d / "weights.bin"))
        rc, got[t] = lib.run([x], want, batch=16)
        assert rc == 0, lib.error()
        np.testing.assert_allclose(got[t][0], want[0], rtol=1e-5, atol=1e-6)
        lib.close()
    assert got[1][0].tobytes() == got[2][0].tobytes()
    make2 = (out[2] / "Makefile").read_text()
    assert "-fopenmp" in make2 and "OMP =" in (out[1] / "Makefile").read_text()
    assert "#define SP_THREADS 2" in (out[2] / "model.c").read_text()


def test_report_lists_ops_kernels_and_sizes_against_the_op_table(built, capsys):
    _, out = built
    r = report(out[2])
    assert r.ops == ("matmul", "relu") or set(r.ops) >= {"matmul", "relu"}
    assert "gemm_packed" in r.kernels and r.table == len(OPS) and 0 < r.covered < r.table
    assert r.threads == 2 and r.max_batch == 16 and not r.damaged
    assert r.code_bytes > 0 and r.library_bytes > 0 and r.weights_bytes > 64 * 96 * 4
    text = str(r)
    assert f"of the op table's {len(OPS)}" in text and "gemm_packed" in text
    assert main(["deploy", "--report", str(out[2])]) == 0
    assert "kernels:" in capsys.readouterr().out
    # a changed file is named; a folder without a manifest is refused by name
    (out[1] / "model.c").write_text((out[1] / "model.c").read_text() + "\n")
    assert report(out[1]).damaged == ("model.c",)
    with pytest.raises(DeployError, match="manifest.json"):
        report(out[1].parent)
