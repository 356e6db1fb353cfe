"""`sampan deploy`: the generated module runs with numpy alone and reproduces the numpy
runtime (sampan without numba: the op table's numpy kernels, fused nodes run op by op)
bit for bit, at several sizes of a symbolic batch dim."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.deploy import DeployError, generate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCHES = (1, 3, 6)

# the reference: the saved program run by sampan in a process without numba
_REF = r"""
import sys
sys.modules["numba"] = None
import json
import numpy as np
import sampan
progs, ins, out = json.loads(sys.argv[1])
res = {}
for name in progs:
    m = sampan.jit.load(progs[name])
    for b in %(batches)r:
        x = np.load(ins)[f"{name}.{b}"]
        res[f"{name}.{b}"] = m(sampan.from_numpy(x)).numpy()
np.savez(out, **res)
"""

# the generated modules, where neither sampan nor numba can be imported
_RUN = r"""
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("sampan", "numba"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, _Block())
sys.path = [p for p in sys.path if not __import__("os").path.isdir(p + "/sampan")]
import importlib.util, json
import numpy as np
mods, ins, out = json.loads(sys.argv[1])
before = set(sys.modules)
res = {}
for name, path in mods.items():
    spec = importlib.util.spec_from_file_location("gen_" + name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m = mod.load()
    for b in %(batches)r:
        res[f"{name}.{b}"] = m(np.load(ins)[f"{name}.{b}"])
np.savez(out, **res)
third = sorted({k.split(".")[0] for k in set(sys.modules) - before}
               - set(sys.stdlib_module_names) - {"numpy"} - {"gen_" + k for k in mods})
print(json.dumps(third))
"""


class _Strided(nn.Layer):
    """A matmul of a permuted (non-contiguous) batch by a matrix whose output the memory
    plan gives a buffer: the runtime runs it as a batched np.matmul."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(sampan.randn(5, 24))

    def forward(self, x):
        return sampan.relu(x.permute(0, 2, 1) @ self.w).sum(-1)


def _models():
    sampan.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 5))
    cnn = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Conv2d(6, 8, 3), nn.ReLU(), nn.Flatten(),
                        nn.Linear(8 * 2 * 2, 4))
    bn = cnn[1]
    bn.running_mean._data[:] = np.linspace(-0.2, 0.3, 6, dtype=np.float32)
    bn.running_var._data[:] = np.linspace(0.5, 1.5, 6, dtype=np.float32)
    enc = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    for m in (mlp, cnn, enc):
        m.eval()
    return {"mlp": (mlp, (4, 12)), "cnn": (cnn, (4, 1, 8, 8)), "enc": (enc, (4, 5, 16)),
            "strided": (_Strided(), (4, 5, 16))}


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    d = tmp_path_factory.mktemp("deploy")
    rng = np.random.default_rng(0)
    progs, mods, ins = {}, {}, {}
    for name, (m, shape) in _models().items():
        ex = sampan.from_numpy(rng.standard_normal(shape).astype(np.float32))
        progs[name] = sampan.jit.save(m, str(d / f"{name}.sampan"), (ex,), dynamic="batch")
        mods[name] = generate(progs[name], str(d / f"{name}_out")).module
        for b in BATCHES:
            ins[f"{name}.{b}"] = rng.standard_normal((b,) + shape[1:]).astype(np.float32)
    np.savez(d / "ins.npz", **ins)
    return d, progs, mods


def _py(code, args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code, json.dumps(args)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_generated_module_is_bit_identical_without_sampan(deployed):
    d, progs, mods = deployed
    ins = str(d / "ins.npz")
    _py(_REF % {"batches": BATCHES}, [progs, ins, str(d / "ref.npz")], str(d))
    env_out = _py(_RUN % {"batches": BATCHES}, [mods, ins, str(d / "gen.npz")], str(d))
    assert json.loads(env_out.strip().splitlines()[-1]) == []   # numpy and the stdlib only
    ref, gen = np.load(d / "ref.npz"), np.load(d / "gen.npz")
    assert sorted(ref.files) == sorted(gen.files) and len(ref.files) == 12
    for k in ref.files:
        assert ref[k].dtype == gen[k].dtype and ref[k].shape == gen[k].shape, k
        assert ref[k].tobytes() == gen[k].tobytes(), k


def test_module_source_names_only_numpy(deployed):
    _, _, mods = deployed
    for path in mods.values():
        src = open(path).read()
        imports = {ln.split()[1] for ln in src.splitlines()
                   if ln.startswith(("import ", "from "))}
        assert imports == {"hashlib", "io", "os", "numpy"}, imports
        assert "allow_pickle=False" in src


def _load_generated(path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("gen_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tampered_weights_and_bad_inputs_are_refused(deployed, tmp_path):
    _, _, mods = deployed
    mod = _load_generated(mods["mlp"])
    m = mod.load()
    with pytest.raises(mod.DeployError, match="input 0 is float64"):
        m(np.zeros((2, 12)))
    with pytest.raises(mod.DeployError, match=r"expects float32\['batch', 12\]"):
        m(np.zeros((2, 11), np.float32))
    w = os.path.join(os.path.dirname(mods["mlp"]), "weights.npz")
    bad = tmp_path / "w.npz"
    data = bytearray(open(w, "rb").read())
    data[len(data) // 2] ^= 1
    bad.write_bytes(bytes(data))
    with pytest.raises(mod.DeployError, match="sha256"):
        mod.load(str(bad))


def test_unsupported_op_is_named(tmp_path):
    def f(x):
        return sampan.sort(x, -1)[0]
    p = sampan.jit.save(f, str(tmp_path / "s.sampan"), (sampan.randn(3, 4),))
    with pytest.raises(DeployError, match="'sort'"):
        generate(p, str(tmp_path / "out"))


def test_cli_deploy(deployed, tmp_path, capsys):
    from sampan.cli import main
    _, progs, _ = deployed
    assert main(["deploy", progs["mlp"], "-o", str(tmp_path / "o")]) == 0
    assert "KiB" in capsys.readouterr().out
    assert (tmp_path / "o" / "model.py").exists() and (tmp_path / "o" / "weights.npz").exists()


_KERNELS = r"""
import sys
sys.modules["numba"] = None
import numpy as np
import sampan
from sampan.ops.registry import OPS
from sampan.deploy.kernelsource import kernel_source, supported_ops
from sampan.runtime import emit
ops = [op for op in supported_ops() if op != "fused"]
blocks, names = kernel_source(ops)
ns = {"np": np}
exec(str(emit.block(blocks, "\n\n")), ns)   # the module's kernels, in a namespace of numpy
n = 0
for op in ops:
    k = eval(names[op], ns)
    for s in (OPS[op].samples() if OPS[op].samples else []):
        for dt in (None, np.float16, np.float64):   # the sample's dtype, half, double
            args = [a.astype(dt) if dt and isinstance(a, np.ndarray) and a.dtype.kind == "f"
                    else a for a in s.args]
            try:
                ref = OPS[op].kernel(*args, **s.attrs)
            except Exception:
                continue
            got = k(*args, **s.attrs)
            if isinstance(ref, tuple):
                ref, got = ref[0], got[0]
            ref, got = np.asarray(ref), np.asarray(got)
            assert ref.dtype == got.dtype and ref.shape == got.shape, (op, ref.dtype, got.dtype)
            assert ref.tobytes() == got.tobytes(), (op, s.attrs, dt)
            n += 1
print(n)
"""


def test_kernels_match_the_op_tables_numpy_paths(tmp_path):
    n = int(_py(_KERNELS, [], str(tmp_path)).strip().splitlines()[-1])
    assert n >= 60
