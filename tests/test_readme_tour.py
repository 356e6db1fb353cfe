"""The README's tour runs as written: its Python blocks, in order, in one namespace."""
import os
import re

import numpy as np

import sampan

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "README.md")


def _tour_blocks():
    text = open(README).read()
    tour = text.split("## A short tour", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", tour, re.S)


def test_tour_runs(tmp_path, monkeypatch):
    blocks = _tour_blocks()
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)
    sampan.manual_seed(0)
    ns = {}
    for code in blocks:
        exec(compile(code, README, "exec"), ns)
    # the values the tour shows are what they say they are
    assert tuple(ns["logits"].shape) == (32, 3)
    np.testing.assert_array_equal(ns["indices"].numpy(), ns["logits"].numpy().argmax(1))
    assert ns["indices"].dtype == np.int64
    assert "i64[batch,12]" in open(tmp_path / "classifier.sampan" / "graph.ir").read()
    with sampan.no_grad():
        direct = ns["model"](sampan.tensor(ns["batch"])).numpy()
        np.testing.assert_allclose(ns["probs"], direct, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(ns["imported"](sampan.tensor(ns["batch"])).numpy(), direct,
                                   rtol=1e-4, atol=1e-5)
    assert ns["graph"].inputs[0].shape[0] == "batch"
    loaded = sampan.jit.load(str(tmp_path / "classifier.sampan"))
    ids = sampan.randint(0, 1000, (5, 12))
    with sampan.no_grad():
        np.testing.assert_allclose(loaded(ids).numpy(), ns["model"](ids).numpy(), rtol=1e-4,
                                   atol=1e-5)
