"""Issue 30: `sampan deploy` writes its numpy module from the op table's own numpy kernels
(one source: no hand copy in sampan/deploy that could drift), the module runs with numpy
alone, and it computes what eager sampan computes on the numpy provider, on every sample
the op harness has for the ops it supports, `-nan` included."""
import importlib.util
import inspect
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import sampan
from sampan.backends import set_providers
from sampan.deploy import generate, kernelsource
from sampan.ops.registry import OPS
from sampan.runtime import emit
from sampan.tensor import Tensor, apply

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "sampan", "deploy")
OPS_DEPLOYED = [op for op in kernelsource.supported_ops() if op != "fused"]


def _kernel_namespace(ops):
    """The module's kernels for `ops` executed in a namespace that holds numpy alone."""
    blocks, names = kernelsource.kernel_source(ops)
    ns = {"np": np}
    exec(compile(str(emit.block(blocks, "\n\n")), "<kernels>", "exec"), ns)
    return ns, names


def test_every_deployed_kernel_is_the_op_tables_numpy_kernel():
    # the ops deploy ran before this change are all still served, now from the op table
    before = ("avg_pool2d cast concat conv2d copy expand full getitem index_select "
              "layer_norm_affine log_softmax matmul max max_pool2d mean min permute relu "
              "reshape sigmoid softmax softplus standardize sum where add mul exp tanh").split()
    assert set(before) <= set(OPS_DEPLOYED)
    blocks, names = kernelsource.kernel_source(OPS_DEPLOYED + [kernelsource.PLANNED])
    for op in OPS_DEPLOYED:
        k = OPS[op].kernels["numpy"]
        assert kernelsource.kernel_of(op) is k
        assert names[op] == (f"np.{k.__name__}" if isinstance(k, np.ufunc) else k.__name__)
    # every copied function is a function of the op table's modules, copied verbatim
    col = kernelsource._Collector()
    for op in OPS_DEPLOYED:
        k = OPS[op].kernels["numpy"]
        if not isinstance(k, np.ufunc):
            col.function(k, op)
    assert col.functions and all(f.__module__.startswith("sampan.ops.")
                                 for f in col.functions.values())
    text = "\n".join(str(b) for b in blocks)
    for f in col.functions.values():
        assert inspect.getsource(f).strip() in text
    # and sampan/deploy holds no kernel of its own: its modules are the generator's, and
    # the old name `deploy.kernels.KERNELS` is a view of the op table (`c/` is the C
    # target of issue 35: C templates, no numpy kernel; wasm.py, web.py and web_assets/ its
    # wasm and web targets: a toolchain driver, the JS loader and page, no kernel)
    assert sorted(f for f in os.listdir(DEPLOY) if not f.startswith("__pycache__")) == [
        "__init__.py", "c", "cli.py", "generate.py", "kernels.py", "kernelsource.py",
        "wasm.py", "web.py", "web_assets"]
    from sampan.deploy import kernels as old
    assert not [f for f in vars(old).values() if inspect.isfunction(f)
                and f.__module__ == old.__name__]
    assert sorted(old.KERNELS) == OPS_DEPLOYED
    assert all(old.KERNELS[op] is OPS[op].kernels["numpy"] for op in OPS_DEPLOYED)


def test_a_hand_written_kernel_is_refused():
    # what the collector accepts is plain numpy from the op table: a lambda, a closure,
    # or a function of another package (a hand copy elsewhere) is not copied
    col = kernelsource._Collector()
    with pytest.raises(kernelsource.DeployError, match="module-level"):
        col.function(lambda a: a, "op x")

    def closure(a):
        return np.maximum(a, 0)
    with pytest.raises(kernelsource.DeployError, match="module-level"):
        col.function(closure, "op x")
    with pytest.raises(kernelsource.DeployError, match="not a kernel module"):
        col.function(sampan.deploy.package_bytes, "op x")
    # a kernel reading sampan (an error helper, a numba loop) makes its op unsupported
    from sampan.ops import index
    with pytest.raises(kernelsource.DeployError, match="op_error"):
        kernelsource._Collector().function(index._check_range, "op index_select")


def test_the_generator_reads_the_table(monkeypatch):
    # swapping the op table's numpy kernel swaps what deploy copies
    from sampan.ops import unary
    op = OPS["softplus"]
    monkeypatch.setitem(op.kernels, "numpy", unary._sigmoid)
    kernelsource._SUPPORTED.clear()
    try:
        _, names = kernelsource.kernel_source(["softplus"])
        assert names["softplus"] == "_sigmoid"
    finally:
        kernelsource._SUPPORTED.clear()


def test_numba_loops_are_not_what_deploy_reads():
    from sampan.backends import get_provider
    nb = get_provider("numba")
    for op in ("relu", "where", "sum", "softmax", "conv2d", "max_pool2d", "layer_norm_affine"):
        if "numba" in OPS[op].kernels:          # numba installed: the loops are numba's
            assert op in nb.kernels and nb.kernel(op) is OPS[op].kernels["numba"]
        assert kernelsource.kernel_of(op) is OPS[op].kernels["numpy"]
        assert kernelsource.standalone(op)


def _variants(s):
    """The sample's arrays as given, in float16 and in float64."""
    for dt in (None, np.float16, np.float64):
        yield dt, [a.astype(dt) if dt and isinstance(a, np.ndarray) and a.dtype.kind == "f"
                   else a for a in s.args]


def _eager(op, args, attrs):
    with sampan.no_grad():
        out = apply(OPS[op], tuple(Tensor(np.asarray(a)) for a in args), dict(attrs))
    outs = out if isinstance(out, tuple) else (out,)
    return [o.numpy() for o in outs]


def test_deployed_kernels_equal_eager_on_every_sample():
    ns, names = _kernel_namespace(OPS_DEPLOYED)
    n = 0
    with set_providers(["numpy"]):      # eager on the reference provider
        for op in OPS_DEPLOYED:
            k = eval(names[op], ns)
            for s in (OPS[op].samples() if OPS[op].samples else []):
                for dt, args in _variants(s):
                    try:
                        ref = _eager(op, args, s.attrs)
                    except sampan.SampanError:
                        continue            # a dtype the op refuses (float16 for some)
                    got = k(*args, **s.attrs)
                    got = [np.asarray(g) for g in (got if isinstance(got, tuple) else (got,))]
                    assert len(ref) == len(got), op
                    for r, g in zip(ref, got):
                        assert (r.dtype, r.shape) == (g.dtype, g.shape), (op, s.attrs, dt)
                        assert r.tobytes() == g.tobytes(), (op, s.attrs, dt)
                    n += 1
    assert n >= 150


_RUN = r"""
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("sampan", "numba"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, _Block())
import importlib.util
import numpy as np
spec = importlib.util.spec_from_file_location("kernels", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
x = np.array([[-1.0, 2.0, float("-nan")]], np.float32)
w = np.ones((2, 1, 1, 1), np.float32)
print(mod._relu(x).tobytes().hex(), mod._softmax_kernel(x[:, :2]).sum(),
      mod._conv2d_np_kernel(x[None, None], w, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                            groups=1).shape)
"""


def test_every_kernel_loads_without_sampan(tmp_path):
    blocks, _ = kernelsource.kernel_source(OPS_DEPLOYED + [kernelsource.PLANNED])
    path = tmp_path / "kernels.py"
    path.write_text("import numpy as np\n\n" + str(emit.block(blocks, "\n\n")) + "\n")
    r = subprocess.run([sys.executable, "-c", _RUN, str(path)], capture_output=True,
                       text=True, timeout=60, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    relu_hex, total, shape = r.stdout.split(" ", 2)
    want = np.maximum(np.array([[-1.0, 2.0, -math.nan]], np.float32), np.float32(0))
    assert bytes.fromhex(relu_hex) == want.tobytes()      # the NaN keeps its sign
    assert abs(float(total) - 1.0) < 1e-6 and shape.strip() == "(1, 2, 1, 3)"


def test_minus_nan_keeps_its_sign(tmp_path):
    nan = -math.nan

    def f(x):
        return sampan.where(x > 0, x, sampan.full(tuple(x.shape), nan)) + x * 0.0

    x = np.array([[1.0, -2.0, 3.0], [-1.0, 0.5, -0.25]], np.float32)
    # a dynamic batch keeps `full` a node (its value an attribute), not a folded constant
    prog = sampan.jit.save(f, str(tmp_path / "nan.sampan"), (sampan.from_numpy(x),),
                           dynamic="batch")
    out = generate(prog, str(tmp_path / "out"))
    src = open(out.module).read()
    assert "-_nan" in src                       # the attribute is written with its sign
    spec = importlib.util.spec_from_file_location("gen_nan", out.module)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = mod.load()(x)
    ref = sampan.jit.load(prog)(sampan.from_numpy(x)).numpy()
    assert got.tobytes() == ref.tobytes()
    assert np.signbit(got[x <= 0]).all() and np.isnan(got[x <= 0]).all()
