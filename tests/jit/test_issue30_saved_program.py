"""issue 30: `sampan.jit.SavedProgram` is the one reader of saved programs, and
`sampan.jit.pytree` the one encoder/decoder of their output trees: the loaded program,
the Predictor, `sampan.quant` and the CLI read a folder through it."""
import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.inference import Config, create_predictor
from sampan.jit import SavedProgram, pytree
from sampan.jit import serialize as S


class TwoHeads(nn.Layer):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 2)

    def forward(self, x, z):
        return {"logits": self.a(x), "rest": (self.b(x), z * 2)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    sampan.manual_seed(0)
    m = TwoHeads()
    m.eval()
    x, z = sampan.randn(3, 4), sampan.randn(3, 5)
    path = str(tmp_path_factory.mktemp("sp") / "two.sampan")
    with sampan.no_grad():
        sampan.jit.save(m, path, (x, z), dynamic="batch")
    return m, path


def _reference(m, x, z):
    """numpy's answer, from the layers' own weights (sampan keeps them (in, out))."""
    w1, b1 = m.a.weight.numpy(), m.a.bias.numpy()
    w2, b2 = m.b.weight.numpy(), m.b.bias.numpy()
    return x @ w1 + b1, x @ w2 + b2, z * 2


def test_the_reader_names_inputs_outputs_and_decodes_the_tree(saved):
    m, path = saved
    p = SavedProgram.read(path)
    g, meta, arrays = p                          # unpacks as serialize.read's triple
    assert (g is p.graph and meta is p.meta and arrays is p.arrays)
    assert p.arg_names == ["x", "z"] and p.n_args == 2 and p.symbolic
    assert [g.inputs[i] for i in p.arg_positions] == [v for v, s in zip(g.inputs, meta["inputs"])
                                                     if s["kind"] == "arg"]
    assert p.output_names == ["logits", "rest.0", "rest.1"]
    assert all(a is None for a, s in zip(p.fixed_inputs(), meta["inputs"]) if s["kind"] == "arg")
    assert [a.shape for a in p.example_arrays] == [(3, 4), (3, 5)]
    leaves = ["L0", "L1", "L2"]
    assert p.unflatten(leaves) == {"logits": "L0", "rest": ("L1", "L2")}
    assert p.guards == []


def test_loaded_predictor_and_reference_agree_at_another_batch(saved):
    m, path = saved
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 4), dtype=np.float32)
    z = rng.standard_normal((6, 5), dtype=np.float32)
    want = _reference(m, x, z)
    got = sampan.jit.load(path)(sampan.from_numpy(x), sampan.from_numpy(z))
    assert isinstance(got, dict) and isinstance(got["rest"], tuple)
    for a, b in zip((got["logits"], *got["rest"]), want):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-5, atol=1e-6)
    pred = create_predictor(Config(path))
    prog = SavedProgram.read(path)
    assert pred.get_input_names() == prog.input_names
    assert pred.get_output_names() == prog.output_names
    outs = pred.run([x, z])
    for a, b in zip(outs, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_old_reader_names_still_work(saved):
    _, path = saved
    g, meta, arrays = S.read(path)
    assert isinstance(sampan.jit.load(path), S.Loaded)
    assert isinstance(sampan.jit.load(path), SavedProgram)
    assert meta["out_tree"] == SavedProgram.read(path).meta["out_tree"]


def test_pytree_round_trip_through_json():
    t0, t1 = sampan.ones(2), sampan.zeros(3)
    obj = {"a": [t0, 3, "s"], (1, 2): (t1,)}
    leaves = []
    tree = pytree.flatten(obj, leaves)
    assert leaves == [t0, t1] and pytree.unflatten(tree, leaves) == obj
    j = pytree.to_json(tree, [])
    back = pytree.from_json(j, ["A", "B"], [])
    assert back == {"a": ["A", 3, "s"], (1, 2): ("B",)}       # a tuple key survives JSON
    assert pytree.leaf_names(j) == [(0, "a.0"), (1, "(1, 2).0")]
    problems = []
    pytree.check_json({"t": 5}, 2, 0, lambda ok, what: ok or problems.append(what))
    assert problems and "below 2" in problems[0]


def test_a_concrete_output_is_a_copy_per_call(tmp_path):
    c = sampan.from_numpy(np.arange(3, dtype=np.float32))

    def f(x):
        return x + 1, c          # `c` comes from outside the trace: saved as a constant
    path = str(tmp_path / "c.sampan")
    sampan.jit.save(f, path, (sampan.ones(3),))
    m = sampan.jit.load(path)
    _, a = m(sampan.ones(3))
    a.numpy()[0] = 99
    _, b = m(sampan.ones(3))
    assert b.numpy().tolist() == [0, 1, 2]
