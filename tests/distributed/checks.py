"""Collective checks that run on whatever group is current: 2 inproc replicas (spawn, in
the test process) and 2 MPI ranks (mpi_checks.py under mpiexec) run the same code. Each
rank checks its own results against numpy on every rank's inputs (which every rank can
rebuild: they are seeded by rank). A check raises AssertionError or returns None."""
from __future__ import annotations

import time

import numpy as np

import sampan
import sampan.distributed as dist
from sampan.distributed import functional as F
from sampan.dtypes import bfloat16

DTYPES = {"float32": np.float32, "float64": np.float64, "bfloat16": bfloat16,
          "int64": np.int64}


def rank_input(r, dtype, shape=(3, 5)):
    """Rank r's input: distinct per rank, small integers (exact in every dtype)."""
    rng = np.random.default_rng(10 + r)
    return rng.integers(-8, 9, size=shape).astype(dtype)


def reference(op, arrays):
    a = np.stack([x.astype(np.float64) for x in arrays])
    return {"sum": a.sum(0), "mean": a.mean(0), "max": a.max(0), "min": a.min(0)}[op]


def _close(got, want, what, tol=0.0):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == np.shape(want), f"{what}: shape {got.shape} != {np.shape(want)}"
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)


def check_collectives(dtype_name):
    dtype = np.dtype(DTYPES[dtype_name])
    r, n = dist.rank(), dist.world_size()
    ins = [rank_input(q, dtype) for q in range(n)]
    ops = ["sum", "max", "min"] + ([] if dtype.kind == "i" else ["mean"])
    for op in ops:
        x = rank_input(r, dtype)
        assert dist.all_reduce(x, op=op) is x and x.dtype == dtype
        # mean of small integers over 2 ranks is a half-integer: exact in bfloat16 too
        _close(x, reference(op, ins), f"all_reduce {op} {dtype}")
    x = rank_input(r, dtype)
    h = dist.all_reduce(x, op="sum", async_op=True)
    assert isinstance(h, dist.Work)
    assert h.wait() is x and h.is_completed()
    _close(x, reference("sum", ins), f"async all_reduce {dtype}")
    b = rank_input(r, dtype)
    dist.broadcast(b, src=n - 1)
    _close(b, ins[n - 1].astype(np.float64), f"broadcast {dtype}")
    parts = dist.all_gather(rank_input(r, dtype, (r + 1, 2)))       # uneven first dims
    assert [p.shape for p in parts] == [(q + 1, 2) for q in range(n)]
    for q, p in enumerate(parts):
        assert p.dtype == dtype
        _close(p, rank_input(q, dtype, (q + 1, 2)).astype(np.float64), f"all_gather {dtype}")
    full = reference("sum", [rank_input(q, dtype, (2 * n, 3)) for q in range(n)])
    rs = dist.reduce_scatter(rank_input(r, dtype, (2 * n, 3)))
    assert rs.dtype == dtype
    _close(rs, full[2 * r:2 * r + 2], f"reduce_scatter {dtype}")


def check_async_tensors_send_recv():
    r, n = dist.rank(), dist.world_size()
    t = sampan.tensor([1.0, 2.0, 3.0]) * (r + 1)
    v0 = t._version
    hs = [dist.all_reduce(t, op="mean", async_op=True),
          dist.all_gather(sampan.tensor([float(r)]), async_op=True)]
    deadline = time.monotonic() + 30
    while not all(h.is_completed() for h in hs):       # polling completes them in order
        assert time.monotonic() < deadline
    assert hs[0].wait() is t and t._version > v0        # in place: autograd sees the write
    scale = sum(q + 1 for q in range(n)) / n
    _close(t.numpy(), np.array([1.0, 2.0, 3.0]) * scale, "all_reduce mean of a tensor")
    gathered = hs[1].wait()
    assert all(isinstance(g, sampan.Tensor) for g in gathered)
    _close(np.concatenate([g.numpy() for g in gathered]), np.arange(n, dtype=float),
           "all_gather of tensors")
    base = np.arange(6.0).reshape(2, 3)
    view = base.T                                       # not contiguous: reduced via a copy
    assert dist.all_reduce(view) is view
    _close(base, np.arange(6.0).reshape(2, 3) * n, "all_reduce of a transposed view")
    if r == 0:
        dist.send(np.arange(4.0), dst=1)
        dist.send(sampan.tensor([7, 8], dtype="int64"), dst=1)
    elif r == 1:
        _close(dist.recv((4,), src=0, dtype="float64"), np.arange(4.0), "recv shape")
        into = sampan.zeros(2, dtype="int64")
        assert dist.recv(into, src=0) is into
        _close(into.numpy(), [7, 8], "recv into a tensor")
    dist.barrier()


def check_autograd():
    """Gradients of the op-table collectives on every rank against numpy: for a loss that
    sums every rank's `(y * w_r).sum()`, d/dx_r is the numpy expression given."""
    r, n = dist.rank(), dist.world_size()
    rng = [np.random.default_rng(50 + q) for q in range(n)]
    xs = [g.standard_normal((2 * n, 3)) for g in rng]
    ws = [np.random.default_rng(90 + q).standard_normal((2 * n, 3)) for q in range(n)]
    wsum = sum(ws)

    def grad_of(fn, w=None):
        x = sampan.tensor(xs[r], requires_grad=True)
        y = fn(x)
        (y * sampan.tensor(ws[r] if w is None else w)).sum().backward()
        return y.numpy(), x.grad.numpy()

    y, g = grad_of(lambda x: F.all_reduce(x, "sum"))
    _close(y, sum(xs), "F.all_reduce", 1e-12)
    _close(g, wsum, "grad of all_reduce(sum): all_reduce(sum) of the gradient", 1e-12)
    y, g = grad_of(lambda x: F.all_reduce(x, "mean"))
    _close(g, wsum / n, "grad of all_reduce(mean)", 1e-12)
    y, g = grad_of(lambda x: F.all_reduce(x, "max"))
    _close(g, wsum * (xs[r] == np.max(xs, 0)), "grad of all_reduce(max)", 1e-12)
    y, g = grad_of(lambda x: F.broadcast(x, src=1 % n))
    _close(y, xs[1 % n], "F.broadcast", 0)
    _close(g, wsum if r == 1 % n else np.zeros_like(wsum), "grad of broadcast", 1e-12)
    wg = [np.random.default_rng(70 + q).standard_normal((2 * n * n, 3)) for q in range(n)]
    y, g = grad_of(lambda x: F.all_gather(x), wg[r])
    _close(y, np.concatenate(xs), "F.all_gather", 0)
    k = 2 * n
    _close(g, sum(wg)[r * k:(r + 1) * k], "grad of all_gather: reduce_scatter", 1e-12)
    wr = [np.random.default_rng(80 + q).standard_normal((2, 3)) for q in range(n)]
    y, g = grad_of(lambda x: F.reduce_scatter(x, "sum"), wr[r])
    _close(y, sum(xs)[2 * r:2 * r + 2], "F.reduce_scatter", 1e-12)
    _close(g, np.concatenate(wr), "grad of reduce_scatter: all_gather", 1e-12)


def check_traced():
    """A sampan.jit graph records an all_reduce node that runs through the current group,
    forward and backward."""
    r, n = dist.rank(), dist.world_size()
    f = sampan.jit(lambda x: F.all_reduce(x * 2.0, "sum") + 1.0)
    x = sampan.tensor(np.arange(4.0) + r, requires_grad=True)
    y = f(x)
    assert "all_reduce(" in str(f.graph), str(f.graph)
    want = 2 * sum(np.arange(4.0) + q for q in range(n)) + 1
    _close(f(x).numpy(), want, "traced all_reduce, second call", 0)
    (y * (r + 1)).sum().backward()
    _close(x.grad.numpy(), np.full(4, 2.0 * sum(q + 1 for q in range(n))),
           "traced all_reduce backward", 0)


def _raises(fn, *needles):
    try:
        fn()
    except dist.DistributedError as e:
        for s in needles:
            assert s in str(e), f"{s!r} not in {e}"
        return str(e)
    raise AssertionError(f"no DistributedError (expected one naming {needles})")


def check_mismatch_errors():
    r = dist.rank()
    other = 1 - r
    g = dist.current_group()
    every = getattr(g, "check_every", None)
    if every is not None:          # MPI checks every call's signature (SAMPAN_DIST_CHECK=1)
        g.check_every = 1
    try:
        _mismatch_errors(r, other)
    finally:
        if every is not None:
            g.check_every = every


def _mismatch_errors(r, other):
    _raises(lambda: dist.all_reduce(np.ones(2 + r, np.float32)), f"rank {other} passed")
    _raises(lambda: dist.all_reduce(np.ones(2, [np.float32, np.float64][r])),
            f"rank {other} passed", "float")
    _raises(lambda: dist.all_reduce(np.ones(2, np.int64), op="mean"), "mean")
    _raises(lambda: dist.broadcast(np.ones(2), src=5), "src=5")
    _raises(lambda: dist.all_reduce([1.0, 2.0]), "expected a numpy array")
    x = np.ones(3)                                      # the group still works after those
    dist.all_reduce(x)
    _close(x, np.full(3, 2.0), "all_reduce after errors")


def check_late_peer_timeout():
    """A peer that is late: the wait fails within its timeout naming that rank, and the
    same handle completes once the peer joins."""
    r = dist.rank()
    x = np.full(2, 1.0 + r)
    if r == 0:
        h = dist.all_reduce(x, async_op=True)
        t0 = time.monotonic()
        msg = _raises(lambda: h.wait(timeout=0.4), "rank 1")
        assert time.monotonic() - t0 < 3, "the timeout was not honoured"
        assert "timed out after 0.4 s" in msg, msg
        h.wait()
    else:
        time.sleep(1.0)
        dist.all_reduce(x)
    _close(x, np.full(2, 3.0), "late all_reduce")


def check_half_reductions():
    """float16/bfloat16 all-reduces: every rank gets the same bits, those of the pairwise
    sum rounded once a step (two ranks: the rounded sum); under MPI the buffers went
    through the 2-byte user op (its steps counted on some rank)."""
    r, n = dist.rank(), dist.world_size()
    for dt in (np.dtype(np.float16), bfloat16):
        ins = [(np.arange(40, dtype=np.float32) * 0.37 - 7 + q * 1.9 + (q + 1) * 2.0 ** -9)
               .astype(dt) for q in range(n)]
        ins[0][0], ins[0][1] = 60000.0, np.nan         # an overflow to inf, a NaN
        ins[-1][0] = 60000.0
        for op in ("sum", "mean", "max", "min"):
            x = ins[r].copy()
            assert dist.all_reduce(x, op=op) is x and x.dtype == dt
            got = dist.all_gather(x.view(np.int16))
            assert all((p == got[0]).all() for p in got), f"{op} {dt}: ranks differ"
            if n == 2:
                f = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}[op]
                want = f(ins[0].astype(np.float32), ins[1].astype(np.float32))
                with np.errstate(over="ignore"):
                    want = (want / np.float32(2) if op == "mean" else want).astype(dt)
                assert x.view(np.int16).tolist() == want.view(np.int16).tolist(), (op, dt)
    if dist.get_backend() == "mpi":
        from sampan.distributed import mpi
        steps = dist.all_gather(np.array([mpi.STATS["low_precision_steps"]], np.int64))
        assert sum(int(p[0]) for p in steps) > 0, "the 2-byte reduction op never ran"


CHECKS = {f"collectives_{d}": (check_collectives, (d,)) for d in DTYPES}
CHECKS.update({"half_reductions": (check_half_reductions, ()),
               "async_tensors_send_recv": (check_async_tensors_send_recv, ()),
               "autograd": (check_autograd, ()), "traced": (check_traced, ()),
               "mismatch_errors": (check_mismatch_errors, ()),
               "late_peer_timeout": (check_late_peer_timeout, ())})

try:                        # torch spellings, subgroups, comm hooks
    from .checks_api import CHECKS as _API_CHECKS
except ImportError:         # run as a script's sibling (mpi_checks.py under mpiexec)
    from checks_api import CHECKS as _API_CHECKS

CHECKS.update(_API_CHECKS)
