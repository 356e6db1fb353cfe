"""Issue 34: passes see into the blocks of cond / while_loop / scan nodes, and every
pipeline and registered pass leaves programs holding them computing eager's numbers."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
from sampan.ir import verify
from sampan.jit.tracing import trace
from sampan.passes import PIPELINES, PassManager, list_passes, pipeline
from sampan.runtime import compile_graph

R = np.random.default_rng(34)
W = (R.standard_normal((6, 6)) * 0.3).astype(np.float32)
X = R.standard_normal((2, 6)).astype(np.float32)
XS = R.standard_normal((5, 2, 6)).astype(np.float32)


def f_cond(x):
    w = sampan.tensor(W)
    return sampan.cond(x.sum() > 0, lambda a: (a @ w).relu() * 2.0 + 1.0,
                       lambda a: (a * 3.0).tanh(), x)


def f_while(x):
    w = sampan.tensor(W)

    def body(i, h):
        return i + 1, ((h @ w.transpose(0, 1)) * 0.5 + 1.0).tanh()
    return sampan.while_loop(lambda i, h: i < 4, body,
                             (sampan.zeros((), dtype=sampan.int64), x))[1]


def f_scan(x, xs):
    w = sampan.tensor(W)

    def step(h, xt):
        h = (h @ w.transpose(0, 1) + xt * 2.0).tanh() * 0.9 + 0.1
        return h, h.sum(1)
    return sampan.scan(step, x, xs)


CASES = {"cond": (f_cond, (X,)), "cond_neg": (f_cond, (-np.abs(X),)),
         "while_loop": (f_while, (X,)), "scan": (f_scan, (X, XS))}


def _graph(name):
    fn, args = CASES[name]
    g, slots, *_ = trace(fn, tuple(sampan.tensor(a) for a in args))
    assert all(k == "arg" for k, _ in slots)
    return g, args, [np.asarray(t.numpy()) for t in _flat(fn(*map(sampan.tensor, args)))]


def _flat(y):
    return list(y) if isinstance(y, tuple) else [y]


def _run(g, args):
    return [np.asarray(a) for a in compile_graph(g)(*args)]


def _ops(g):
    return [n.op for b in g.walk() for n in b.nodes]


PASS_LISTS = sorted(set(PIPELINES) - {"none"}) + ["every_pass"]


def _every_pass():
    skip = {"distribute"}   # needs a process group's gradients: tests/distributed
    return [p for p in list_passes() if p not in skip]


@pytest.mark.parametrize("plist", PASS_LISTS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_pipeline_keeps_eager_numbers(plist, case):
    g, args, want = _graph(case)
    names = _every_pass() if plist == "every_pass" else pipeline(plist)
    tol = 3e-2 if "amp" in names else 1e-5
    for ns in ([names] if plist != "every_pass" else [[p] for p in names]):
        g2 = PassManager(ns, debug=True).run(g)
        verify(g2)
        for a, b in zip(_run(g2, args), want):
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=f"{ns}")


def test_predictor_pass_list_runs_on_control_flow():
    # pipeline("predictor") is the list Config.pass_builder() starts from
    # (tests/inference/test_predictor_passes.py)
    for case in CASES:
        g, args, want = _graph(case)
        g2 = PassManager(pipeline("predictor"), debug=True).run(g)
        for a, b in zip(_run(g2, args), want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_constant_predicate_inlines_its_branch():
    def f(x):
        return sampan.cond(sampan.tensor(True), lambda a: a * 2.0, lambda a: a - 1.0, x)
    g, *_ = trace(f, (sampan.tensor(X),))
    assert "cond" in _ops(g)
    g2 = PassManager(["fold_constants", "dce"], debug=True).run(g)
    assert [n.op for n in g2.nodes] == ["mul"]
    np.testing.assert_allclose(_run(g2, [X])[0], X * 2)


def test_dce_cse_and_fusion_inside_blocks():
    def f(x):
        def then(a):
            dead = a.exp()                    # noqa: F841 - nothing reads it
            return (a * 2.0 + 1.0).tanh() + (a * 2.0 + 1.0).tanh()
        y1 = sampan.cond(x.sum() > 0, then, lambda a: a, x)
        y2 = sampan.cond(x.sum() > 0, then, lambda a: a, x)   # the same node: merged
        y3 = sampan.cond(x.sum() > 0, then, lambda a: -a, x)  # other blocks: kept
        return y1 + y2 + y3
    g, *_ = trace(f, (sampan.tensor(X),))
    g2 = PassManager(["cse", "dce"], debug=True).run(g)
    assert [n.op for n in g2.nodes].count("cond") == 2
    then = [n for n in g2.nodes if n.op == "cond"][0].blocks[0]
    assert "exp" not in [n.op for n in then.nodes]
    assert [n.op for n in then.nodes].count("tanh") == 1
    g3 = PassManager(pipeline("train"), debug=True).run(g)
    then = [n for n in g3.nodes if n.op == "cond"][0].blocks[0]
    assert "fused" in [n.op for n in then.nodes]
    want = 3 * (2 * np.tanh(X * 2 + 1)) if X.sum() > 0 else X + X - X
    np.testing.assert_allclose(_run(g3, [X])[0], want, rtol=1e-5, atol=1e-5)


def test_licm_moves_invariants_out_of_loops():
    for case in ("while_loop", "scan"):
        g, args, want = _graph(case)
        (loop,) = [n for n in g.nodes if n.op == case]
        body = loop.blocks[-1]
        assert "permute" in [n.op for n in body.nodes]
        g2 = PassManager(["licm"], debug=True).run(g)
        (loop2,) = [n for n in g2.nodes if n.op == case]
        assert "permute" not in [n.op for n in loop2.blocks[-1].nodes]
        assert "permute" in [n.op for n in g2.nodes]
        for a, b in zip(_run(g2, args), want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_loop_carry_reuses_its_buffers():
    g, args, want = _graph("scan")
    g2 = PassManager(pipeline("inference"), debug=True).run(g)
    (loop,) = [n for n in g2.nodes if n.op == "scan"]
    plan = loop.blocks[0].meta["memory_plan"]
    assert plan["donate"], "the new carry is written into the old carry's array"
    x = args[0].copy()
    got = _run(g2, [x, args[1]])
    np.testing.assert_array_equal(x, args[0])    # the caller's initial carry is untouched
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    got2 = _run(g2, [x, args[1]])                 # and a second call starts afresh
    for a, b in zip(got2, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_predictor_runs_a_saved_program_with_control_flow(tmp_path):
    from sampan.inference import Config, create_predictor
    fn, args = CASES["scan"]
    path = str(tmp_path / "scan.sampan")
    sampan.jit.save(fn, path, tuple(sampan.tensor(a) for a in args))
    cfg = Config(path)
    assert cfg.pass_builder().all_passes() == pipeline("predictor")
    p = create_predictor(cfg)
    want = _flat(fn(*map(sampan.tensor, args)))
    for a, b in zip(p.run(list(args)), want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-5)


def test_dce_drops_captures_no_block_reads():
    def f(x):
        y = x.exp()                          # read only by a dead node of the branch

        def then(a):
            unused = a * y                   # noqa: F841
            return a * 2.0
        return sampan.cond(x.sum() > 0, then, lambda a: a - 1.0, x)
    g, *_ = trace(f, (sampan.tensor(X),))
    (c,) = [n for n in g.nodes if n.op == "cond"]
    assert len(c.inputs) == 3                # pred, x, captured y
    g2 = PassManager(["dce"], debug=True).run(g)
    (c,) = [n for n in g2.nodes if n.op == "cond"]
    assert len(c.inputs) == 2 and all(len(b.inputs) == 1 for b in c.blocks)
    assert "exp" not in [n.op for n in g2.nodes]
    want = X * 2 if X.sum() > 0 else X - 1
    np.testing.assert_allclose(_run(g2, [X])[0], want)
