"""Issue 34: serving's index-bounds check (`sampan.serving.program.index_bounds`) walks
into `scan` bodies, which run on every slice of each xs, every capture and the initial
carry when the length is >= 1, so an id outside an embedding table looked up inside a
scan is refused before it runs; `cond` branches and `while_loop` bodies (which may not
run) are left alone, and so is a scan of symbolic length (it may be 0)."""
import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.serving.model import ServingError
from sampan.serving.program import ProgramModel, index_bounds


class ScanBag(nn.Layer):
    """ids (T, B) looked up per step in a table of 10 rows; extra (B,) ids captured and
    looked up in a table of 7 rows at every step; start (B,) the carry, an index into 5."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.side = nn.Embedding(7, 4)
        self.first = nn.Embedding(5, 4)

    def forward(self, ids, extra, start):
        def step(carry, x):
            c, h = carry            # the index rides in the carry: looked up in the body
            h = (h + self.emb(x) + self.side(extra) + self.first(c)).tanh()
            return (c, h), h
        _, hs = sampan.scan(step, (start, sampan.zeros(start.shape[0], 4)), ids)
        return hs.sum(0)


class Branchy(nn.Layer):
    """ids used only inside a cond branch and a while_loop body: no bound is known."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, ids, flag):
        y = sampan.cond(flag.sum() > 0, lambda i: self.emb(i).sum(0),
                        lambda i: sampan.zeros(4), ids)
        # the ids ride in the carry: the lookup stays in the body, which may not run
        _, _, z = sampan.while_loop(
            lambda k, i, z: k < flag.shape[0],
            lambda k, i, z: (k + 1, i, z + self.emb(i).sum(0)),
            (sampan.tensor(np.array(0, np.int64)), ids, sampan.zeros(4)))
        return y + z


def _names(p):
    g = p.graph
    return {g.inputs[pos].id: n for pos, n in zip(p.get_input_positions(),
                                                   p.get_input_names())}


@pytest.fixture(scope="module")
def scan_model(tmp_path_factory):
    sampan.manual_seed(3)
    net = ScanBag()
    net.eval()
    args = (sampan.tensor(np.zeros((3, 2), np.int64)), sampan.tensor(np.zeros(2, np.int64)),
            sampan.tensor(np.zeros(2, np.int64)))
    with sampan.no_grad():
        path = sampan.jit.save(net, str(tmp_path_factory.mktemp("scan") / "m.sampan"), args)
    return net, ProgramModel("scanbag", path, {})


def test_ids_inside_a_scan_body_get_their_tables_bounds(scan_model):
    net, m = scan_model
    b = {k: v[0] for k, v in m._bounds.items()}
    names = m._p.get_input_names()
    assert b == dict(zip(names, (10, 7, 5))), m._bounds
    assert "index_select" in m._bounds[names[0]][1]
    good = {names[0]: np.array([[1, 9], [0, 3], [4, 4]], np.int64),
            names[1]: np.array([6, 0], np.int64), names[2]: np.array([4, 1], np.int64)}
    m.check(good)
    # the served numbers are numpy's over the model's own weights
    w, s, f = (t.weight.numpy() for t in (net.emb, net.side, net.first))
    h, acc = np.zeros((2, 4), np.float32), 0
    for x in good[names[0]]:
        h = np.tanh(h + w[x] + s[good[names[1]]] + f[good[names[2]]])
        acc = acc + h
    got = next(iter(m.infer(good).values()))
    np.testing.assert_allclose(got, acc, rtol=1e-5, atol=1e-6)
    for pos, bad, size in ((0, 10, 10), (1, 7, 7), (2, -1, 5)):
        feed = dict(good)
        a = feed[names[pos]].copy()
        a.flat[-1] = bad
        feed[names[pos]] = a
        with pytest.raises(ServingError) as e:
            m.check(feed)
        msg = str(e.value)
        assert repr(names[pos]) in msg and str(bad) in msg and f"[0, {size})" in msg, msg


def test_cond_while_and_symbolic_length_scan_are_left_alone(tmp_path):
    sampan.manual_seed(4)
    from sampan.inference import Config, create_predictor
    with sampan.no_grad():
        net = Branchy()
        net.eval()
        path = sampan.jit.save(net, str(tmp_path / "b.sampan"),
                               (sampan.tensor(np.zeros(3, np.int64)), sampan.ones(2)))
    p = create_predictor(Config(path))
    assert index_bounds(p.graph, _names(p)) == {}
    sampan.manual_seed(3)
    net = ScanBag()
    net.eval()
    args = (sampan.tensor(np.zeros((3, 2), np.int64)), sampan.tensor(np.zeros(2, np.int64)),
            sampan.tensor(np.zeros(2, np.int64)))
    with sampan.no_grad():
        path = sampan.jit.save(net, str(tmp_path / "d.sampan"), args,
                               dynamic={"ids": {0: "seq"}})
    p = create_predictor(Config(path))
    b = index_bounds(p.graph, _names(p))
    ids = p.get_input_names()[0]
    assert ids not in b and b, b       # the bounds outside the scan still hold
