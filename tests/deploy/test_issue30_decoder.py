"""issue 30: the standalone module of `sampan deploy` decodes a program's output tree with
sampan's own decoder (`sampan.jit.pytree.decode_tree`, copied in), so a nested result
(a dict of tuples, a returned constant) comes back with the structure `sampan.jit.load`
gives."""
import importlib.util
import inspect

import numpy as np

import sampan
from sampan.jit import pytree


def test_nested_outputs_decode_as_sampan_does(tmp_path):
    sampan.manual_seed(0)
    lin = sampan.nn.Linear(4, 3)
    lin.eval()
    c = sampan.from_numpy(np.arange(2, dtype=np.float32))

    def f(x):
        y = lin(x)
        return {"y": y, "more": (y.relu(), c), "k": [x * 2]}
    path = str(tmp_path / "nested.sampan")
    x = sampan.randn(5, 4)
    with sampan.no_grad():
        sampan.jit.save(f, path, (x,))
    out = tmp_path / "out"
    sampan.deploy.generate(path, str(out))
    src = (out / "model.py").read_text()
    assert inspect.getsource(pytree.decode_tree).strip() in src
    spec = importlib.util.spec_from_file_location("nested_model", out / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = mod.load()(x.numpy())
    want = sampan.jit.load(path)(x)
    assert got.keys() == want.keys() and isinstance(got["more"], tuple)
    assert isinstance(got["k"], list)
    for a, b in [(got["y"], want["y"]), (got["more"][0], want["more"][0]),
                 (got["more"][1], want["more"][1]), (got["k"][0], want["k"][0])]:
        np.testing.assert_array_equal(a, b.numpy())
    got["more"][1][0] = 7                 # a returned constant is a copy per call
    assert mod.load()(x.numpy())["more"][1][0] == 0
