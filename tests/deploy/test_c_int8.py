"""The C target's int8 (issue 35): the int8 programs of `sampan.quant.quantize_program`
(quantize, qlinear_dense, qdense, qlinear_conv2d, uint8 max pooling) and the op table's
samples of the int8 ops give the Predictor's int8 bytes exactly, on the VNNI path
(`_mm512_dpbusd_epi32`, where the compiler targets it) and on the portable path."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import sampan
from sampan import inference
from sampan.deploy import generate
from sampan.ops.registry import OPS
from sampan.tensor import apply

from test_c_target import CC, Lib, _predictor

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) on this machine")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
INT8_OPS = ("quantize", "dequantize", "qlinear_dense", "qdense", "qlinear_conv2d")
# the portable path (no -march: no VNNI) and the native one (VNNI where the CPU has it)
FLAGS = {"portable": ["-O1"], "native": ["-O1", "-march=native"]}


def _vnni():
    r = subprocess.run([CC, "-march=native", "-dM", "-E", "-x", "c", "/dev/null"],
                       capture_output=True, text=True)
    return "__AVX512VNNI__" in r.stdout


def _build(src_dirs, out, flags):
    r = subprocess.run([CC, *flags, "-Wall", "-Wextra", "-std=c99", "-fPIC", "-shared",
                        "-o", out, *[os.path.join(d, "model.c") for d in src_dirs], "-lm"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr[-3000:]
    return out


def _bits_equal(got, want, what):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, what
        assert g.tobytes() == w.tobytes(), (what, np.abs(g.astype(float) - w).max())


def _sample_fn(op, args, attrs):
    """x is the argument; the scales, zero points, weights and bias are the program's
    constants (as `quantize_program` writes them)."""
    rest = [np.array(a) for a in args[1:]]

    def f(x):
        return apply(OPS[op], (x, *[sampan.tensor(a) for a in rest]), dict(attrs))
    return f


@pytest.fixture(scope="module")
def int8_libs(tmp_path_factory):
    import w5_inference
    import w5_prune
    from sampan.quant import quantize_program
    tmp = tmp_path_factory.mktemp("c_int8")
    r = np.random.default_rng(0)
    progs = {}
    for name, net, shape in (("mlp", w5_inference.mlp_layer(), (784,)),
                             ("lenet", w5_prune.lenet(), (1, 28, 28))):
        p = sampan.jit.save(net.eval(), str(tmp / f"{name}.sampan"),
                            (sampan.randn(2, *shape),), dynamic={"x": {0: "batch"}})
        cal = [r.standard_normal((8, *shape), dtype=np.float32) for _ in range(3)]
        progs[name] = (quantize_program(p, cal, str(tmp / f"{name}8.sampan")), shape)
    for op in INT8_OPS:
        for k, s in enumerate(OPS[op].samples()):
            p = sampan.jit.save(_sample_fn(op, s.args, s.attrs), str(tmp / f"{op}{k}.sampan"),
                                (sampan.tensor(s.args[0]),))
            progs[f"{op}{k}"] = (p, s.args[0])
    dirs = []
    for name, (p, _) in progs.items():
        generate(p, str(tmp / name), target="c", prefix=f"m_{name}", max_batch=4)
        dirs.append(str(tmp / name))
    libs = {}

    def lib(path):      # built on first use: the portable run is in the slow set
        if path not in libs:
            libs[path] = _build(dirs, str(tmp / f"{path}.so"), FLAGS[path])
        return libs[path]
    return tmp, progs, lib


PATHS = ["native", pytest.param("portable", marks=pytest.mark.slow)]


@pytest.mark.parametrize("path", PATHS)
def test_int8_models_equal_the_predictors_int8_bit_for_bit(int8_libs, path):
    tmp, progs, libs = int8_libs
    for name in ("mlp", "lenet"):
        p, shape = progs[name]
        lib = Lib(libs(path), f"m_{name}", str(tmp / name / "weights.bin"))
        ops = {n.op for n in sampan.jit.program.SavedProgram.read(p).graph.nodes}
        assert {"quantize", "qdense"} <= ops and ("qlinear_conv2d" in ops) == (name == "lenet")
        for b in (1, 3):
            x = np.random.default_rng(b).standard_normal((b, *shape), dtype=np.float32) * 2
            want = _predictor(p, [x])
            rc, got = lib.run([x], want, batch=b)
            assert rc == 0, lib.error()
            _bits_equal(got, want, f"{name} batch {b} ({path})")
        lib.close()


@pytest.mark.parametrize("path", PATHS)
def test_int8_ops_equal_the_op_tables_samples_bit_for_bit(int8_libs, path):
    tmp, progs, libs = int8_libs
    n = 0
    for name, (p, x) in progs.items():
        if name in ("mlp", "lenet"):
            continue
        lib = Lib(libs(path), f"m_{name}", str(tmp / name / "weights.bin"))
        want = _predictor(p, [x])
        rc, got = lib.run([x], want)
        assert rc == 0, lib.error()
        _bits_equal(got, want, name)
        lib.close()
        n += 1
    assert n >= 10


def test_the_vnni_path_is_the_one_compiled_where_the_compiler_targets_it(int8_libs):
    tmp, progs, _ = int8_libs
    src = (tmp / "mlp" / "model.c").read_text()
    assert "_mm512_dpbusd_epi32" in src and "#if defined(__AVX512VNNI__)" in src
    if not _vnni():
        pytest.skip("this compiler does not target AVX512-VNNI here")
    r = subprocess.run([CC, "-O1", "-march=native", "-S", "-o", "-", str(tmp / "mlp" / "model.c")],
                       capture_output=True, text=True)
    assert "vpdpbusd" in r.stdout
