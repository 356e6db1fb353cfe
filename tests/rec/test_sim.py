"""The deterministic parameter-server simulator: determinism, staleness, recovery, pinning."""

import numpy as np
import pytest

from sampan.rec.policies import CallableEviction, LFUEviction, TTLEviction
from sampan.rec.sim import Event, SimLog, Simulation, SimulationError
from sampan.rec.table import HashEmbeddingTable, hashed_normal

ASYNC = dict(workers=3, shards=2, max_staleness=2, delay_prob=0.3, crash_prob=0.03,
             snapshot_every=10)


def work(events):
    return [e for e in events if e.kind not in ("crash", "snapshot")]


def test_same_seed_gives_bit_identical_tables_and_schedule():
    a = Simulation(seed=7, **ASYNC).run(5)
    b = Simulation(seed=7, **ASYNC).run(5)
    assert a.events == b.events
    assert a.digest() == b.digest()
    for k in a.table:
        assert a.table[k].tobytes() == b.table[k].tobytes()
    assert a.crashes > 0 or any(e.delay for e in a.events)


def test_different_seeds_race_differently_but_synchronous_tables_do_not_depend_on_seed():
    runs = [Simulation(seed=s, **ASYNC).run(5) for s in range(6)]
    assert len({tuple(work(r.events)) for r in runs}) == 6
    assert len({r.digest() for r in runs}) >= 5
    sync = dict(ASYNC, max_staleness=0)
    syncs = [Simulation(seed=s, **sync).run(5) for s in range(6)]
    assert len({tuple(work(r.events)) for r in syncs}) == 6
    assert len({r.digest() for r in syncs}) == 1
    assert (syncs[0].staleness[:, 2] == 0).all()


def _reference_sync(steps, workers, dim, lr, sim):
    """Synchronous training written out directly: one dict of rows, numpy float32 Adagrad."""
    w, acc = {}, {}
    u = np.linspace(-1.0, 1.0, dim)
    for t in range(steps):
        grads = []
        for wk in range(workers):
            uniq, inv, labels, _ = sim._batch(wk, t)
            for i in uniq.tolist():
                if i not in w:
                    w[i] = hashed_normal([i], dim, seed=0)[0].copy()
                    acc[i] = np.zeros(dim, np.float32)
            ids = uniq[inv].reshape(labels.size, -1)
            g = {}
            for b in range(labels.size):
                logit = sum(float(w[i].astype(np.float64) @ u) for i in ids[b].tolist())
                d = (1.0 / (1.0 + np.exp(-logit)) - labels[b]) / labels.size
                for i in ids[b].tolist():
                    g[i] = g.get(i, 0.0) + d
            grads.append(g)
        for g in grads:  # every pull of the step saw the previous step; pushes in order
            for i, c in g.items():
                gi = (c * u).astype(np.float32)
                acc[i] += gi * gi
                w[i] -= np.float32(lr) * gi / (np.sqrt(acc[i]) + np.float32(1e-10))
    return w


def test_synchronous_run_matches_a_direct_reference():
    sim = Simulation(workers=2, shards=3, seed=4, delay_prob=0.4, dim=4, lr=0.1)
    r = sim.run(4)
    ref = _reference_sync(4, 2, 4, 0.1, sim)
    assert sorted(ref) == r.table["ids"].tolist()
    np.testing.assert_allclose(np.stack([ref[i] for i in sorted(ref)]), r.table["weights"],
                               rtol=1e-5, atol=1e-7)


def _check_staleness(events, workers, shards, s):
    """Walk a log: a pull request of step t needs every push of steps <= t-1-s delivered."""
    delivered = {}
    for e in events:
        if e.kind == "push":
            delivered[e.step] = delivered.get(e.step, 0) + 1
        elif e.kind == "pull_req":
            for old in range(e.step - s):
                assert delivered.get(old, 0) == workers * shards, (e, old)


def test_bounded_staleness_holds_on_every_event_of_many_seeds():
    worst = {}
    for s in (0, 1, 2):
        for seed in range(6):
            cfg = dict(ASYNC, max_staleness=s, delay_prob=0.4, snapshot_every=0)
            r = Simulation(seed=seed, **cfg).run(5)
            _check_staleness(r.events, 3, 2, s)
            assert r.staleness.shape == (3 * 5, 3)
            worst[s] = max(worst.get(s, 0), int(r.staleness[:, 2].max()))
    assert worst == {0: 0, 1: 1, 2: 2}  # the bound is reached, never passed


@pytest.mark.parametrize("stale", [0, 1])
def test_crash_at_every_event_position_recovers_exactly(stale):
    cfg = dict(workers=2, shards=2, seed=3, max_staleness=stale, delay_prob=0.2,
               snapshot_every=6, full_every=3)
    base = Simulation(**cfg).run(3)
    n = len(work(base.events))
    redelivered = 0
    for pos in range(n + 1):
        r = Simulation(crash_at={pos: pos % 2}, **cfg).run(3)
        assert r.crashes == (1 if pos < n else 0)
        assert work(r.events) == work(base.events)  # a forced crash leaves the schedule
        assert r.digest() == base.digest(), pos
        redelivered += r.redelivered
    assert redelivered >= n // 4  # crashes did lose operations, which came back


class _Forgetful(Simulation):
    """Recovery that skips the re-delivery: what the exact-recovery test must catch."""

    def _apply(self, k, kind, t, ids, grads, redo=False):
        if redo:
            self._ops[k] += 1
            return None
        return super()._apply(k, kind, t, ids, grads)


def test_recovery_checks_catch_a_recovery_that_loses_operations():
    cfg = dict(workers=2, shards=2, seed=3, snapshot_every=6)
    sim = Simulation(**cfg)
    base = sim.run(3)
    assert sim.log == base.log
    caught = [_Forgetful(crash_at={p: p % 2}, **cfg).run(3) for p in range(10, 40, 3)]
    assert any(r.redelivered and r.digest() != base.digest() for r in caught)


def test_random_crashes_lose_nothing_against_the_same_schedule_without_them():
    for seed in range(4):
        r = Simulation(seed=seed, **dict(ASYNC, crash_prob=0.08)).run(5)
        assert r.crashes > 0
        # the same events with the crashes removed replay to the same tables
        clean = [e for e in r.events if e.kind != "crash"]
        cfg = dict(r.log.config, crash_prob=0.0)
        again = Simulation.replay(SimLog(cfg, r.log.steps, tuple(clean)))
        assert again.crashes == 0 and again.digest() == r.digest()


def _evict_all():
    return CallableEviction(lambda m, s: np.ones(m["freq"].shape, bool), window=6)


@pytest.mark.parametrize("policy", [_evict_all, lambda: TTLEviction(0, window=4),
                                    lambda: LFUEviction(capacity=4, window=8)])
def test_eviction_never_drops_a_row_a_pending_push_targets(policy):
    for seed in range(5):
        r = Simulation(seed=seed, eviction=policy(), **dict(ASYNC, crash_prob=0.05)).run(4)
        assert r.violations == [] and r.lost == 0, seed
    bad = [Simulation(seed=seed, eviction=policy(), pin=False, **ASYNC).run(4)
           for seed in range(4)]
    assert any(r.violations for r in bad) and any(r.lost for r in bad)  # pinning is needed


def test_replay_reproduces_and_refuses_a_tampered_log():
    r = Simulation(seed=11, **ASYNC).run(4)
    again = Simulation.replay(r.log)
    assert again.events == r.events and again.digest() == r.digest()
    assert (again.staleness == r.staleness).all()
    ev = list(r.log.events)
    i = next(j for j, e in enumerate(ev) if e.kind == "compute")
    ev[i], ev[i - 1] = ev[i - 1], ev[i]  # a compute before its pulls arrived
    with pytest.raises(SimulationError, match="not enabled"):
        Simulation.replay(SimLog(r.log.config, r.log.steps, tuple(ev)))
    with pytest.raises(SimulationError, match="unfinished"):
        Simulation.replay(SimLog(r.log.config, r.log.steps, tuple(ev[: i - 3])))
    late = [e._replace(delay=99) if e.kind == "push_req" else e for e in r.log.events]
    with pytest.raises(SimulationError, match="not a valid next event"):
        Simulation.replay(SimLog(r.log.config, r.log.steps, tuple(late)))
    with pytest.raises(SimulationError, match="crashes shard"):
        Simulation.replay(SimLog(r.log.config, r.log.steps, (Event(0, "crash", shard=9),)))


def test_bad_config_raises_sampan_errors():
    with pytest.raises(SimulationError, match="workers"):
        Simulation(workers=0)
    with pytest.raises(SimulationError, match="crash_prob"):
        Simulation(crash_prob=1.5)
    with pytest.raises(SimulationError, match="steps"):
        Simulation().run(-1)
    with pytest.raises(SimulationError, match="SimLog"):
        Simulation.replay([])


def test_table_pins_block_eviction_until_unpinned():
    t = HashEmbeddingTable(2, eviction=TTLEviction(0, window=64))
    t.lookup([1, 2, 3], step=0)
    t.pin([1, 2])
    t.pin([2])
    t.lookup([9], step=5)  # evicts every row older than this step, but pinned ones
    assert sorted(t.ids().tolist()) == [1, 2, 9]
    t.unpin([1, 2])
    t.lookup([9], step=10)
    assert sorted(t.ids().tolist()) == [2, 9]
    t.unpin([2])
    t.lookup([8], step=20)
    assert sorted(t.ids().tolist()) == [8]
    with pytest.raises(ValueError, match="pinned 0 times"):
        t.unpin([2])
