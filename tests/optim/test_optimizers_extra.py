"""NAdam, RAdam, Adamax, Adadelta, ASGD, Rprop, LBFGS and SparseAdam against PyTorch's."""
import numpy as np
import pytest
import torch
from test_optimizers import _data, _feed, _run_both

import sampan
import sampan.optim as so

CASES = [
    ("NAdam", {}),
    ("NAdam", {"lr": 0.01, "momentum_decay": 0.01, "weight_decay": 0.1}),
    ("NAdam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True,
               "maximize": True}),
    ("RAdam", {"lr": 0.01}),
    ("RAdam", {"lr": 0.01, "betas": (0.8, 0.9), "weight_decay": 0.1}),
    ("RAdam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True,
               "maximize": True}),
    ("Adamax", {}),
    ("Adamax", {"lr": 0.01, "betas": (0.8, 0.95), "weight_decay": 0.1, "maximize": True}),
    ("Adadelta", {}),
    ("Adadelta", {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.1, "maximize": True}),
    ("ASGD", {}),
    ("ASGD", {"lr": 0.05, "lambd": 0.01, "alpha": 0.5, "t0": 5, "weight_decay": 0.1}),
    ("ASGD", {"lr": 0.05, "t0": 3, "maximize": True}),
    ("Rprop", {}),
    ("Rprop", {"lr": 0.05, "etas": (0.3, 1.5), "step_sizes": (1e-3, 0.2), "maximize": True}),
]
IDS = [f"{n}-{i}" for i, (n, _) in enumerate(CASES)]


def _close(a, b, **kw):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                               rtol=kw.get("rtol", 1e-10), atol=kw.get("atol", 1e-12))


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_matches_torch(name, kw):
    sp, tp, sopt, topt = _run_both(name, kw)
    for a, b in zip(sp, tp):
        _close(a.numpy(), b.detach().numpy())
    sstate, tstate = sopt.state_dict()["state"], topt.state_dict()["state"]
    assert sorted(sstate) == sorted(tstate)
    for idx, ts in tstate.items():
        assert set(sstate[idx]) == set(ts)
        for key, tv in ts.items():
            sv = sstate[idx][key]
            sv = sv.numpy() if isinstance(sv, sampan.Tensor) else sv
            _close(sv, tv.numpy() if isinstance(tv, torch.Tensor) else tv)


@pytest.mark.parametrize("name,kw", [CASES[2], CASES[5], CASES[7], CASES[9], CASES[11],
                                     CASES[14]], ids=["NAdam", "RAdam", "Adamax", "Adadelta",
                                                      "ASGD", "Rprop"])
def test_state_dict_round_trip_continues_identically(name, kw):
    init, grads = _data(12)

    def build(values):
        ps = [sampan.tensor(a.copy(), requires_grad=True) for a in values]
        return ps, getattr(so, name)([{"params": ps[:1]}, {"params": ps[1:]}], **kw)

    ps, opt = build(init)
    for t in range(6):
        _feed(ps, grads[t], t, sampan.tensor)
        opt.step()
    ps2, opt2 = build([p.numpy() for p in ps])
    opt2.load_state_dict(opt.state_dict())
    for t in range(6, 12):
        for params, o in ((ps, opt), (ps2, opt2)):
            _feed(params, grads[t], t, sampan.tensor)
            o.step()
    for a, b in zip(ps, ps2):
        assert np.array_equal(a.numpy(), b.numpy())


def test_float32_params_stay_float32():
    for name, kw in CASES[::3]:
        w = sampan.ones(4, requires_grad=True)
        opt = getattr(so, name)([w], **kw)
        (w * w).sum().backward()
        opt.step()
        assert w.dtype == np.float32, name


def test_bad_hyperparameters_name_the_argument():
    w = sampan.zeros(2, requires_grad=True)
    with pytest.raises(sampan.SampanValueError, match="beta1"):
        so.NAdam([w], betas=(1.0, 0.9))
    with pytest.raises(sampan.SampanValueError, match="rho"):
        so.Adadelta([w], rho=1.5)
    with pytest.raises(sampan.SampanValueError, match="etas"):
        so.Rprop([w], etas=(1.5, 1.2))


# ----------------------------------------------------------------- LBFGS
def _rosenbrock(lib, x):
    return ((1 - x[:-1]) ** 2).sum() + 100 * ((x[1:] - x[:-1] ** 2) ** 2).sum()


def _least_squares(lib, x, A, b):
    r = lib.matmul(A, x) - b
    return (r * r).sum()


def _lbfgs_pair(loss_of, x0, kw, steps):
    xs = sampan.tensor(x0.copy(), requires_grad=True)
    xt = torch.tensor(x0.copy(), requires_grad=True)
    runs = []
    pairs = ((sampan, xs, so.LBFGS([xs], **kw)), (torch, xt, torch.optim.LBFGS([xt], **kw)))
    for lib, x, opt in pairs:
        def closure(lib=lib, x=x, opt=opt):
            opt.zero_grad()
            loss = loss_of(lib, x)
            loss.backward()
            return loss
        trace = []
        for _ in range(steps):
            trace.append(float(opt.step(closure).detach()))
            trace.append(x.detach().numpy().copy())
        runs.append((trace, opt))
    return runs


@pytest.mark.parametrize("kw", [{}, {"line_search_fn": "strong_wolfe"},
                                {"lr": 0.5, "max_iter": 7, "history_size": 3},
                                {"line_search_fn": "strong_wolfe", "history_size": 4,
                                 "max_eval": 9, "tolerance_change": 1e-12}],
                         ids=["fixed", "wolfe", "small-history", "wolfe-max-eval"])
def test_lbfgs_rosenbrock_matches_torch(kw):
    x0 = np.array([-1.2, 1.0, -0.5, 0.8])
    (a, sopt), (b, topt) = _lbfgs_pair(_rosenbrock, x0, {"lr": 1e-3, **kw}
                                       if not kw.get("line_search_fn") else kw, 4)
    # Rosenbrock's valley amplifies last-bit differences of the dot products a little per
    # iteration (1e-16 after one step, 1e-9 after 30): same path, same evaluation counts
    for u, v in zip(a, b):
        _close(u, v, rtol=1e-7, atol=1e-10)
    ss = sopt.state[next(iter(sopt.state))]
    ts = topt.state[topt.param_groups[0]["params"][0]]
    assert ss["func_evals"] == ts["func_evals"] and ss["n_iter"] == ts["n_iter"]


def test_lbfgs_least_squares_converges_like_torch():
    rng = np.random.default_rng(3)
    A, b = rng.standard_normal((8, 5)), rng.standard_normal(8)
    sA, sb, tA, tb = sampan.tensor(A), sampan.tensor(b), torch.tensor(A), torch.tensor(b)

    def loss_of(lib, x):
        return _least_squares(lib, x, *((sA, sb) if lib is sampan else (tA, tb)))
    (a, _), (c, _) = _lbfgs_pair(loss_of, np.zeros(5), {"line_search_fn": "strong_wolfe",
                                                        "history_size": 5}, 2)
    for u, v in zip(a, c):
        _close(u, v, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(a[-1], np.linalg.lstsq(A, b, rcond=None)[0], atol=1e-4)


def test_lbfgs_needs_closure_and_one_group():
    w = sampan.zeros(2, requires_grad=True)
    with pytest.raises(sampan.SampanValueError, match="closure"):
        so.LBFGS([w]).step()
    with pytest.raises(sampan.SampanValueError, match="one"):
        so.LBFGS([{"params": [w]}, {"params": [sampan.zeros(1, requires_grad=True)]}])
    with pytest.raises(sampan.SampanValueError, match="line_search_fn"):
        so.LBFGS([w], line_search_fn="backtracking")


# ----------------------------------------------------------------- sparse embeddings
from sampan.nn.linear import sparse_grad_rows

SPARSE_CASES = [("SparseAdam", {"lr": 0.05}),
                ("SparseAdam", {"lr": 0.05, "betas": (0.8, 0.9), "eps": 1e-6, "maximize": True}),
                ("SGD", {"lr": 0.1, "momentum": 0.9}),
                ("SGD", {"lr": 0.1, "momentum": 0.5, "nesterov": True, "maximize": True}),
                ("Adagrad", {"lr": 0.1, "lr_decay": 0.05})]


def _sparse_pair(name, kw, padding_idx=None):
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal((9, 3))
    se = sampan.nn.Embedding(9, 3, padding_idx=padding_idx, dtype="float64", sparse=True)
    te = torch.nn.Embedding(9, 3, padding_idx=padding_idx, sparse=True, dtype=torch.float64)
    se.weight._data[...] = w0
    with torch.no_grad():
        te.weight.copy_(torch.tensor(w0))
    return rng, se, te, getattr(so, name)(se.parameters(), **kw), \
        getattr(torch.optim, name)(te.parameters(), **kw)


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")  # torch's own Adagrad
@pytest.mark.parametrize("name,kw", SPARSE_CASES,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(SPARSE_CASES)])
def test_sparse_embedding_updates_match_torch(name, kw):
    rng, se, te, sopt, topt = _sparse_pair(name, kw, padding_idx=0)
    for _ in range(6):
        ids = rng.integers(0, 9, size=(2, 3))  # different rows each step, repeats, padding
        c = rng.standard_normal((2, 3, 3))
        sopt.zero_grad(), topt.zero_grad()
        (se(sampan.tensor(ids)) * sampan.tensor(c)).sum().backward()
        (te(torch.tensor(ids)) * torch.tensor(c)).sum().backward()
        want = te.weight.grad.coalesce()
        assert sparse_grad_rows(se.weight).tolist() == want.indices()[0].tolist()
        sopt.step(), topt.step()
        _close(se.weight.numpy(), te.weight.detach().numpy())
    if name == "SparseAdam":
        ts = topt.state[te.weight]
        ss = sopt.state[se.weight]
        assert ss["step"] == ts["step"]
        _close(ss["exp_avg"], ts["exp_avg"].numpy())
        _close(ss["exp_avg_sq"], ts["exp_avg_sq"].numpy())


def test_sparse_rows_accumulate_and_reset_like_torch():
    _, se, _te, sopt, _ = _sparse_pair("SparseAdam", {})
    se(sampan.tensor([1, 5])).sum().backward()
    se(sampan.tensor([[2, 5]])).sum().backward()  # accumulates: union of the rows
    assert sparse_grad_rows(se.weight).tolist() == [1, 2, 5]
    sopt.zero_grad(set_to_none=False)  # zeroed (torch: no entries left), then fresh rows
    se(sampan.tensor([7])).sum().backward()
    assert sparse_grad_rows(se.weight).tolist() == [7]
    se.zero_grad()
    assert sparse_grad_rows(se.weight) is None
    before = se.weight.numpy().copy()
    se(sampan.tensor([3])).sum().backward()
    sopt.step()
    changed = np.flatnonzero(np.any(se.weight.numpy() != before, axis=1))
    assert changed.tolist() == [3]


def test_dense_optimisers_refuse_sparse_grads_and_sparse_adam_dense_ones():
    se = sampan.nn.Embedding(4, 2, sparse=True)
    se(sampan.tensor([1])).sum().backward()
    before = se.weight.numpy().copy()
    with pytest.raises(sampan.SampanValueError, match="sparse gradient"):
        so.Adam(se.parameters()).step()
    with pytest.raises(sampan.SampanValueError, match="weight_decay"):
        so.SGD(se.parameters(), lr=0.1, weight_decay=0.1).step()
    assert np.array_equal(se.weight.numpy(), before)  # refused before changing anything
    w = sampan.zeros(3, requires_grad=True)
    (w * w).sum().backward()
    with pytest.raises(sampan.SampanValueError, match="dense gradient"):
        so.SparseAdam([w]).step()


def test_eager_only_optimisers_refuse_a_traced_step_clearly():
    w = sampan.ones(3, requires_grad=True)
    opt = so.NAdam([w])

    @sampan.jit
    def step(x):
        opt.zero_grad()
        loss = (w * x).sum()
        loss.backward()
        opt.step()
        return loss
    with pytest.raises(sampan.SampanError, match="no traced update rule"):
        step(sampan.ones(3))


def test_lbfgs_state_dict_round_trip_continues_identically():
    x0 = np.array([-1.2, 1.0, -0.5])

    def run(x, opt, steps):
        def closure():
            opt.zero_grad()
            loss = _rosenbrock(sampan, x)
            loss.backward()
            return loss
        for _ in range(steps):
            opt.step(closure)

    kw = {"line_search_fn": "strong_wolfe", "max_iter": 3, "history_size": 4}
    xa = sampan.tensor(x0.copy(), requires_grad=True)
    oa = so.LBFGS([xa], **kw)
    run(xa, oa, 2)
    xb = sampan.tensor(xa.numpy().copy(), requires_grad=True)
    ob = so.LBFGS([xb], **kw)
    ob.load_state_dict(oa.state_dict())
    run(xa, oa, 2)
    run(xb, ob, 2)
    assert np.array_equal(xa.numpy(), xb.numpy())


def test_sparse_adam_state_dict_round_trip_continues_identically():
    rng, se, _, sopt, _ = _sparse_pair("SparseAdam", {"lr": 0.05})
    twin = sampan.nn.Embedding(9, 3, dtype="float64", sparse=True)
    steps = [(rng.integers(0, 9, 4), rng.standard_normal((4, 3))) for _ in range(6)]
    for ids, c in steps[:3]:
        sopt.zero_grad()
        (se(sampan.tensor(ids)) * sampan.tensor(c)).sum().backward()
        sopt.step()
    twin.weight._data[...] = se.weight.numpy()
    topt = so.SparseAdam(twin.parameters(), lr=0.05)
    topt.load_state_dict(sopt.state_dict())
    for ids, c in steps[3:]:
        for emb, opt in ((se, sopt), (twin, topt)):
            opt.zero_grad()
            (emb(sampan.tensor(ids)) * sampan.tensor(c)).sum().backward()
            opt.step()
    assert np.array_equal(se.weight.numpy(), twin.weight.numpy())


@pytest.mark.parametrize("name,kw", [("Rprop", {"lr": 0.05, "etas": (0.3, 1.7)}),
                                     ("NAdam", {"lr": 0.01}), ("ASGD", {"t0": 4})])
def test_float32_steps_match_torch_to_rounding(name, kw):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(40).astype(np.float32)
    sw = sampan.tensor(w0.copy(), requires_grad=True)
    tw = torch.tensor(w0.copy(), requires_grad=True)
    a, b = getattr(so, name)([sw], **kw), getattr(torch.optim, name)([tw], **kw)
    for _ in range(15):
        g = rng.standard_normal(40).astype(np.float32)
        sw.grad, tw.grad = sampan.tensor(g.copy()), torch.tensor(g.copy())
        a.step(), b.step()
    assert sw.dtype == np.float32
    np.testing.assert_allclose(sw.numpy(), tw.detach().numpy(), rtol=0, atol=5e-7)


def test_sparse_rows_of_a_deep_copied_embedding_are_its_own():
    import copy
    emb = sampan.nn.Embedding(6, 2, sparse=True)
    emb(sampan.tensor([1])).sum().backward()
    twin = copy.deepcopy(emb)
    twin.zero_grad()
    twin(sampan.tensor([4])).sum().backward()
    assert sparse_grad_rows(twin.weight).tolist() == [4]
    assert sparse_grad_rows(emb.weight).tolist() == [1]
