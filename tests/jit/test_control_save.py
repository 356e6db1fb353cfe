"""Issue 34: programs holding control flow save (format version 4) and load, also in a
fresh process; other programs keep the version they had."""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import sampan
from sampan.jit.serialize import LoadError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _model():
    big = sampan.tensor(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8))

    def f(h0, xs):
        def step(h, x):
            # a large constant inside nested blocks: stored in the weights by name
            h = sampan.cond(x.sum() > 0, lambda a: (a @ big).tanh(), lambda a: a * 0.5,
                            h + x)
            return h, h.sum(1)
        h, ys = sampan.scan(step, h0, xs)
        _, h = sampan.while_loop(lambda i, s: i < 3, lambda i, s: (i + 1, s * 0.9),
                                 (sampan.zeros((), dtype=sampan.int64), h))
        return h, ys
    rng = np.random.default_rng(0)
    h0 = sampan.tensor(rng.standard_normal((2, 8)).astype(np.float32))
    xs = sampan.tensor(rng.standard_normal((5, 2, 8)).astype(np.float32))
    return f, h0, xs


def test_save_load_with_blocks_in_this_and_a_fresh_process(tmp_path):
    f, h0, xs = _model()
    p = str(tmp_path / "cf.sampan")
    sampan.jit.save(f, p, (h0, xs))
    meta = json.loads(pathlib.Path(p, "meta.json").read_text())
    assert meta["version"] == 4
    assert "ref=" in pathlib.Path(p, "graph.ir").read_text()
    want = f(h0, xs)
    m = sampan.jit.load(p)
    got = m(h0, xs)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)
    np.save(tmp_path / "h0.npy", h0.numpy())
    np.save(tmp_path / "xs.npy", xs.numpy())
    code = ("import sys, numpy as np, sampan\n"
            "m = sampan.jit.load(sys.argv[1])\n"
            "h, ys = m(sampan.tensor(np.load(sys.argv[2])), sampan.tensor(np.load(sys.argv[3])))\n"
            "np.save(sys.argv[4], h.numpy())\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", code, p, str(tmp_path / "h0.npy"),
                    str(tmp_path / "xs.npy"), str(tmp_path / "out.npy")], check=True, env=env,
                   timeout=120)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want[0].numpy(), rtol=1e-6,
                               atol=1e-6)


def test_an_array_read_outside_and_inside_blocks_is_stored_once(tmp_path):
    big = sampan.tensor(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8))

    def f(h):
        h = h @ big
        return sampan.cond(h.sum() > 0, lambda a: a @ big, lambda a: a * 2.0, h)
    h = sampan.tensor(np.ones((2, 8), np.float32))
    p = str(tmp_path / "once.sampan")
    sampan.jit.save(f, p, (h,), passes="none")
    text = pathlib.Path(p, "graph.ir").read_text()
    refs = {line.split("ref=")[1] for line in text.splitlines() if "ref=" in line}
    assert text.count("ref=") == 2 and len(refs) == 1
    np.testing.assert_allclose(sampan.jit.load(p)(h).numpy(), f(h).numpy(), rtol=1e-6)


def test_plain_programs_keep_version_2_and_blocks_need_version_4(tmp_path):
    p = str(tmp_path / "plain.sampan")
    x = sampan.tensor(np.ones(3, np.float32))
    sampan.jit.save(lambda x: x * 2.0, p, (x,))
    assert json.loads(pathlib.Path(p, "meta.json").read_text())["version"] == 2
    f, h0, xs = _model()
    q = pathlib.Path(tmp_path / "cf.sampan")
    sampan.jit.save(f, str(q), (h0, xs))
    meta = json.loads((q / "meta.json").read_text())
    meta["version"] = 3               # an older format cannot hold blocks
    raw = json.dumps(meta, indent=1).encode()
    (q / "meta.json").write_bytes(raw)
    sums = (q / "checksums.sha256").read_text().splitlines()
    sums = [f"{hashlib.sha256(raw).hexdigest()}  meta.json" if s.endswith(" meta.json") else s
            for s in sums]
    (q / "checksums.sha256").write_text("\n".join(sums) + "\n")
    with pytest.raises(LoadError, match="version 4"):
        sampan.jit.load(str(q))
