"""A deterministic simulator of asynchronous parameter-server training.

:class:`Simulation` runs ``W`` workers against ``S`` shards in one process: real
:class:`~sampan.rec.sharded.LocalShard` s over real
:class:`~sampan.rec.table.HashEmbeddingTable` s with a real sparse optimiser, real
snapshot files (:func:`~sampan.rec.snapshot.export_full` / ``export_delta`` /
``restore``). Nothing runs concurrently: a scheduler seeded by ``seed`` picks, one at a
time, which enabled event happens next, so one seed is one interleaving, replayable bit
for bit, and many seeds explore the races real asynchronous training has.

Events. Each worker loops over steps ``t = 0 .. steps-1``: it sends one pull request per
shard (``pull_req``; a message is sent even when the batch has no id on that shard), each
is delivered separately (``pull``: the shard assigns rows and returns the vectors), then
``compute`` (a tiny logistic model: ``logit = sum over fields of v[id] . u``, log-loss
gradient, a pure function of the pulled vectors and the batch), then one push request
per shard (``push_req``) and its delivery (``push``: the optimiser step). A request may
be held back ``1..max_delay`` scheduler ticks (probability ``delay_prob``); before each
pick a shard may crash (probability ``crash_prob``, or forced with ``crash_at``). Every
``snapshot_every`` events each shard exports a delta (a full export every
``full_every``-th time; one full export at the start). Batches depend only on
``(data_seed, worker, step)``, never on the schedule.

Semantics.

- Bounded staleness (stale synchronous parallel): a worker may send a pull request of
  step ``t`` only when every push of every worker of steps ``<= t - 1 - max_staleness``
  has been delivered to every shard. ``max_staleness=0`` is synchronous: in addition a
  shard applies the pushes of step ``t`` only once all workers sent theirs, in worker
  order, so the final tables do not depend on the seed at all (float sums included).
  ``SimResult.staleness`` holds, per push, how many steps of other pushes the pulled
  view missed (``<= max_staleness`` always).
- Crash recovery (the same protocol as ``sampan.rec.remote``): every delivery that
  changes a shard (a pull creates rows and counts sightings; a push updates rows) gets
  the shard's next operation number, and the sending worker keeps it in a retained log
  until a snapshot of that shard covers it. A crashed shard loses its memory, restores
  the latest full snapshot plus its deltas, and the workers re-deliver exactly the
  logged operations numbered after the snapshot, in number order. Nothing is applied
  twice and nothing is lost: without eviction, the tables after any crash are
  bit-identical to a crash-free run of the same schedule. Messages in flight during a
  crash are simply delivered later. What a crash *can* lose: a worker's retained log
  lives in that worker, so a worker dying together with a shard loses that worker's
  operations on the shard since the shard's last snapshot (at most ``snapshot_every``
  events' worth; workers do not die in this simulator). With an eviction policy the
  restored table has a new row layout, so later eviction choices may differ from the
  crash-free run; the pinning guarantee below still holds.
- Pinning: a shard pins the ids of a pull until that worker's push of the same step
  lands (``HashEmbeddingTable.pin``), so eviction never drops a row a pending push still
  targets; ``SimResult.violations`` lists any eviction of such an id (empty unless
  ``pin=False``), and ``SimResult.lost`` counts pushed ids that found no row.

>>> r = Simulation(workers=2, shards=2, seed=1, dim=2).run(2)
>>> r.table["weights"].shape[1], Simulation.replay(r.log).digest() == r.digest()
(2, True)
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from sampan.errors import SampanError
from sampan.rec.hashtable import hash_ids
from sampan.rec.kernels import unique_inverse
from sampan.rec.optim import SparseAdagrad
from sampan.rec.sharded import LocalShard
from sampan.rec.snapshot import export_delta, export_full, restore, table_state
from sampan.rec.table import HashEmbeddingTable

__all__ = ["Event", "SimLog", "SimResult", "Simulation", "SimulationError"]

WORK_KINDS = ("pull_req", "pull", "compute", "push_req", "push")
KINDS = (*WORK_KINDS, "crash", "snapshot")


class SimulationError(SampanError, RuntimeError):
    """A bad simulation config, a log that does not replay, or a broken invariant."""


class Event(NamedTuple):
    """One scheduled event; ``worker``/``step``/``shard`` are -1 where they do not apply."""

    tick: int
    kind: str
    worker: int = -1
    step: int = -1
    shard: int = -1
    delay: int = 0  # ticks a request's message is held back


@dataclass(frozen=True)
class SimLog:
    """Everything needed to replay a run: the config, the step count and the events."""

    config: dict
    steps: int
    events: tuple


@dataclass
class SimResult:
    """Final tables (merged over shards, sorted by id), the schedule and the checks."""

    table: dict
    log: SimLog
    staleness: np.ndarray  # (pushes, 3): worker, step, steps of pushes the view missed
    lost: int = 0
    violations: list = field(default_factory=list)  # (shard, id, tick) evicted while pinned
    crashes: int = 0
    redelivered: int = 0

    @property
    def events(self) -> tuple:
        """The schedule that produced this result."""
        return self.log.events

    def row(self, id_: int) -> np.ndarray:
        """The final weights of one id."""
        i = np.searchsorted(self.table["ids"], id_)
        if i >= self.table["ids"].size or self.table["ids"][i] != id_:
            raise KeyError(id_)
        return self.table["weights"][i]

    def digest(self) -> str:
        """sha256 over every array of the final tables (ids, weights, slots, metadata)."""
        h = hashlib.sha256()
        for k in sorted(self.table):
            a = np.ascontiguousarray(self.table[k])
            h.update(k.encode() + a.dtype.str.encode() + str(a.shape).encode())
            h.update(a.tobytes())
        return h.hexdigest()


class _Entry(NamedTuple):
    op: int
    kind: str
    step: int
    ids: np.ndarray
    grads: np.ndarray | None


class _Worker:
    def __init__(self, shards: int):
        self.step, self.phase = 0, "pull"
        self.sent: set[int] = set()
        self.replies: dict[int, np.ndarray] = {}
        self.view = np.iinfo(np.int64).max  # oldest complete push step any reply saw
        self.batch = None  # (uniq, inverse, labels, parts)
        self.grads: np.ndarray | None = None
        self.retained: list[list[_Entry]] = [[] for _ in range(shards)]
        self.outstanding: dict[tuple[int, int], np.ndarray] = {}  # (step, shard) -> ids


class _Msg(NamedTuple):
    ready_at: int
    ids: np.ndarray
    grads: np.ndarray | None


@functools.lru_cache(maxsize=4096)
def _batch(data_seed: int, batch: int, fields: int, vocab: int, shards: int, w: int, t: int):
    """Worker ``w``'s batch of step ``t``: unique ids, inverse, labels, per-shard parts.

    A function of the data config only (never of the schedule); cached, so read-only.
    """
    rng = np.random.default_rng([data_seed, w, t])
    raw = rng.zipf(1.5, (batch, fields)) % vocab
    ids = (raw + np.arange(fields) * vocab).astype(np.int64)
    true = ((ids * 2654435761) % 1000).sum(axis=1) / (500.0 * fields) - 1.0
    labels = (rng.random(batch) < 1.0 / (1.0 + np.exp(-3.0 * true))).astype(np.float64)
    uniq, inv = unique_inverse(ids.ravel())
    # the routing of ShardedEmbedding.shard_of: high hash bits pick the shard
    sid = (hash_ids(uniq) >> np.uint64(40)) % np.uint64(shards)
    out = uniq, inv, labels, [np.flatnonzero(sid == k) for k in range(shards)]
    for a in (uniq, inv, labels, *out[3]):
        a.flags.writeable = False
    return out


def _tmp_root() -> str | None:
    # snapshots fsync: on tmpfs that is free, on a disk it costs ms per file
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class Simulation:
    """W workers, S shards, one seeded scheduler; see the module docstring.

    ``eviction`` is a policy object (copied per shard), ``optimizer_factory`` makes each
    shard's sparse optimiser (default ``SparseAdagrad(0.1)``), ``crash_at`` maps an
    event position (the number of work events before it) to a shard to crash there
    without touching the random stream, ``pin=False`` disables pinning (for tests that
    show why it is needed).
    """

    def __init__(self, workers: int = 2, shards: int = 2, seed: int = 0, *,
                 max_staleness: int = 0, crash_prob: float = 0.0, delay_prob: float = 0.0,
                 max_delay: int = 3, snapshot_every: int = 8, full_every: int = 4,
                 eviction=None, dim: int = 4, batch: int = 8, fields: int = 3,
                 vocab: int = 50, data_seed: int = 0, lr: float = 0.1,
                 optimizer_factory=None, crash_at: dict | None = None, pin: bool = True):
        for name, v, lo in (("workers", workers, 1), ("shards", shards, 1), ("dim", dim, 1),
                            ("batch", batch, 1), ("fields", fields, 1), ("vocab", vocab, 1),
                            ("max_staleness", max_staleness, 0), ("max_delay", max_delay, 1),
                            ("snapshot_every", snapshot_every, 0),
                            ("full_every", full_every, 1)):
            if not isinstance(v, (int, np.integer)) or v < lo:
                raise SimulationError(f"Simulation: {name} must be an int >= {lo}, got {v!r}")
        for name, p in (("crash_prob", crash_prob), ("delay_prob", delay_prob)):
            if not 0.0 <= p < 1.0:
                raise SimulationError(f"Simulation: {name} must be in [0, 1), got {p!r}")
        self.config = dict(workers=int(workers), shards=int(shards), seed=int(seed),
                           max_staleness=int(max_staleness), crash_prob=float(crash_prob),
                           delay_prob=float(delay_prob), max_delay=int(max_delay),
                           snapshot_every=int(snapshot_every), full_every=int(full_every),
                           eviction=eviction, dim=int(dim), batch=int(batch),
                           fields=int(fields), vocab=int(vocab), data_seed=int(data_seed),
                           lr=float(lr), optimizer_factory=optimizer_factory,
                           crash_at=dict(crash_at or {}), pin=bool(pin))
        self.W, self.S, self.s = int(workers), int(shards), int(max_staleness)
        self.dim = int(dim)
        self.u = np.linspace(-1.0, 1.0, self.dim) if self.dim > 1 else np.ones(1)
        self.events: list[Event] = []

    # -- data and the model ------------------------------------------------------------
    def _batch(self, w: int, t: int):
        c = self.config
        return _batch(c["data_seed"], c["batch"], c["fields"], c["vocab"], self.S, w, t)

    def _compute(self, wk: _Worker) -> np.ndarray:
        uniq, inv, labels, parts = wk.batch
        vec = np.empty((uniq.size, self.dim), np.float64)
        for k, p in enumerate(parts):
            vec[p] = wk.replies[k]
        b = labels.size
        logit = (vec[inv] @ self.u).reshape(b, -1).sum(axis=1)
        g = (1.0 / (1.0 + np.exp(-logit)) - labels) / b
        coeff = np.bincount(inv, weights=np.repeat(g, inv.size // b), minlength=uniq.size)
        return (coeff[:, None] * self.u[None, :]).astype(np.float32)

    # -- shards ------------------------------------------------------------------------
    def _new_optimizer(self):
        f = self.config["optimizer_factory"]
        return f() if f is not None else SparseAdagrad(self.config["lr"])

    def _watch(self, k: int):
        def on_evict(keys):
            for i in keys.tolist():
                if self._pending[k].get(i, 0) > 0:
                    self.violations.append((k, i, self.tick))
        return on_evict

    def _snapshot(self, k: int, full: bool) -> None:
        table = self.shards[k].table
        n = self._n_snaps[k]
        path = os.path.join(self._dir, f"s{k}.{n}")
        if full:
            export_full(table, path)
            for old in [self._snaps[k][0], *self._snaps[k][1]] if self._snaps[k] else []:
                os.remove(old)
            self._snaps[k] = (path, [], self._ops[k], copy.deepcopy(table.eviction))
        else:
            export_delta(table, path)
            f, deltas, _, _ = self._snaps[k]
            self._snaps[k] = (f, [*deltas, path], self._ops[k], copy.deepcopy(table.eviction))
        self._n_snaps[k] += 1
        for wk in self.workers:  # the shard reports what its snapshots hold
            wk.retained[k] = [e for e in wk.retained[k] if e.op > self._ops[k]]

    def _crash(self, k: int) -> None:
        full, deltas, mark, policy = self._snaps[k]
        lost = self._ops[k] - mark
        table = restore(full, deltas, eviction=copy.deepcopy(policy))
        table.on_evict = self._watch(k)
        self.shards[k] = LocalShard(table, self._new_optimizer())
        self._ops[k] = mark
        entries = sorted((e for wk in self.workers for e in wk.retained[k]), key=lambda e: e.op)
        if [e.op for e in entries] != list(range(mark + 1, mark + lost + 1)):
            raise SimulationError(f"shard {k}: retained logs hold ops "
                                  f"{[e.op for e in entries]}, lost ops {mark + 1}..{mark + lost}")
        if self.config["pin"]:  # a superset of what was pending at any point being redone
            for e in entries:
                table.pin(e.ids)
            self._repin(k)
        for e in entries:
            self._apply(k, e.kind, e.step, e.ids, e.grads, redo=True)
        if self.config["pin"]:
            table.pins.clear()
            self._repin(k)
        self.crashes += 1
        self.redelivered += lost

    def _repin(self, k: int) -> None:
        ids = [i for i, n in self._pending[k].items() for _ in range(n)]
        if ids:
            self.shards[k].table.pin(np.array(ids, np.int64))

    def _apply(self, k: int, kind: str, t: int, ids: np.ndarray, grads,
               redo: bool = False) -> np.ndarray | None:
        """Apply one shard-changing delivery; returns pulled vectors for a pull."""
        shard = self.shards[k]
        self._ops[k] += 1
        if kind == "pull":
            return shard.pull(ids, t)
        if not redo:
            self.lost += int((shard.table.map.get(ids) < 0).sum())
        shard.push(ids, grads, t)
        return None

    # -- scheduling --------------------------------------------------------------------
    def _frontier(self, k: int | None = None) -> int:
        """The oldest step whose pushes are not all delivered (to shard ``k``, or to all)."""
        ks = range(self.S) if k is None else [k]
        return min(self._front[j] for j in ks)

    def _eligible(self) -> list[tuple]:
        out = []
        for w, wk in enumerate(self.workers):
            t = wk.step
            if wk.phase == "pull" and t - 1 - self.s < self._frontier():
                out += [("pull_req", w, t, k) for k in range(self.S) if k not in wk.sent]
            elif wk.phase == "wait" and len(wk.replies) == self.S:
                out.append(("compute", w, t, -1))
            elif wk.phase == "push":
                out += [("push_req", w, t, k) for k in range(self.S) if k not in wk.sent]
        for (kind, w, t, k), m in self._flight.items():
            if m.ready_at > self.tick:
                continue
            if kind == "push" and self.s == 0 and (
                    self._sent_pushes.get((t, k), 0) < self.W or self._applied[(t, k)] != w):
                continue  # synchronous: a step's pushes land together, in worker order
            out.append((kind, w, t, k))
        out.sort(key=lambda e: (KINDS.index(e[0]), *e[1:]))
        return out

    def _execute(self, kind: str, w: int, t: int, k: int, delay: int) -> None:
        wk = self.workers[w]
        if kind == "pull_req":
            if wk.batch is None:
                wk.batch = self._batch(w, t)
            uniq, _, _, parts = wk.batch
            self._flight[("pull", w, t, k)] = _Msg(self.tick + 1 + delay, uniq[parts[k]], None)
            wk.sent.add(k)
            if len(wk.sent) == self.S:
                wk.phase, wk.sent = "wait", set()
        elif kind == "pull":
            m = self._flight.pop(("pull", w, t, k))
            self._saw(wk, k)
            wk.outstanding[(t, k)] = m.ids
            for i in m.ids.tolist():
                self._pending[k][i] = self._pending[k].get(i, 0) + 1
            if self.config["pin"]:
                self.shards[k].table.pin(m.ids)
            wk.replies[k] = self._apply(k, "pull", t, m.ids, None)
            wk.retained[k].append(_Entry(self._ops[k], "pull", t, m.ids, None))
        elif kind == "compute":
            wk.grads = self._compute(wk)
            self._stale.append((w, t, max(0, t - 1 - wk.view)))
            wk.phase, wk.replies, wk.view = "push", {}, np.iinfo(np.int64).max
        elif kind == "push_req":
            parts = wk.batch[3]
            ids = wk.batch[0][parts[k]]
            self._flight[("push", w, t, k)] = _Msg(self.tick + 1 + delay, ids, wk.grads[parts[k]])
            self._sent_pushes[(t, k)] = self._sent_pushes.get((t, k), 0) + 1
            wk.sent.add(k)
            if len(wk.sent) == self.S:
                wk.step += 1
                wk.phase = "pull" if wk.step < self._steps else "done"
                wk.sent, wk.batch, wk.grads = set(), None, None
        elif kind == "push":
            m = self._flight.pop(("push", w, t, k))
            self._apply(k, "push", t, m.ids, m.grads)
            wk.retained[k].append(_Entry(self._ops[k], "push", t, m.ids, m.grads))
            del wk.outstanding[(t, k)]
            for i in m.ids.tolist():
                self._pending[k][i] -= 1
                if not self._pending[k][i]:
                    del self._pending[k][i]
            if self.config["pin"]:
                self.shards[k].table.unpin(m.ids)
            self._applied[(t, k)] += 1
            while self._applied[(self._front[k], k)] == self.W:
                self._front[k] += 1

    def _saw(self, wk: _Worker, k: int) -> None:
        """Record the newest complete push step shard ``k`` holds as this pull sees it."""
        wk.view = min(wk.view, self._front[k] - 1)

    def _setup(self, steps: int) -> None:
        c = self.config
        self._steps = int(steps)
        self.tick, self._n_work = 0, 0
        self.workers = [_Worker(self.S) for _ in range(self.W)]
        self.shards = []
        for k in range(self.S):
            table = HashEmbeddingTable(self.dim, seed=c["data_seed"],
                                       eviction=copy.deepcopy(c["eviction"]))
            table.on_evict = self._watch(k)
            opt = self._new_optimizer()
            table.attach_slots(opt.slot_width(self.dim), opt.slot_init)
            self.shards.append(LocalShard(table, opt))
        self._ops = [0] * self.S
        self._front = [0] * self.S
        self._applied: dict = _Zero()
        self._sent_pushes: dict = {}
        self._flight: dict = {}
        self._pending: list[dict[int, int]] = [{} for _ in range(self.S)]
        self._stale: list = []
        self.lost, self.crashes, self.redelivered = 0, 0, 0
        self.violations: list = []
        self._snaps: list = [None] * self.S
        self._n_snaps = [0] * self.S
        self.events = []
        if self.W and steps == 0:
            for wk in self.workers:
                wk.phase = "done"

    def _finished(self) -> bool:
        return all(wk.phase == "done" for wk in self.workers) and not self._flight

    def _record(self, ev: Event) -> None:
        self.events.append(ev)
        if ev.kind == "crash":
            self._crash(ev.shard)
        elif ev.kind == "snapshot":
            n = self._n_snaps[0]
            for k in range(self.S):
                self._snapshot(k, full=n % self.config["full_every"] == 0)
        else:
            self._execute(ev.kind, ev.worker, ev.step, ev.shard, ev.delay)
            self.tick += 1
            self._n_work += 1

    def _after_work(self) -> None:
        every = self.config["snapshot_every"]
        if every and self._n_work % every == 0:
            self._record(Event(self.tick, "snapshot"))

    def _drive(self, steps: int, log: SimLog | None) -> SimResult:
        self._setup(steps)
        self._dir = tempfile.mkdtemp(prefix="sampan-sim-", dir=_tmp_root())
        try:
            for k in range(self.S):
                self._snapshot(k, full=True)  # a shard starts with a full snapshot
            if log is None:
                self._schedule()
            else:
                self._replay(log.events)
            if not self._finished():
                raise SimulationError(f"simulation stopped unfinished at tick {self.tick}")
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
        return self._result()

    def _schedule(self) -> None:
        c = self.config
        rng = np.random.default_rng(c["seed"])
        forced = dict(c["crash_at"])
        while not self._finished():
            if self._n_work in forced:
                self._record(Event(self.tick, "crash", shard=int(forced.pop(self._n_work))))
                continue
            if c["crash_prob"] and rng.random() < c["crash_prob"]:
                self._record(Event(self.tick, "crash", shard=int(rng.integers(self.S))))
                continue
            elig = self._eligible()
            if not elig:
                later = [m.ready_at for m in self._flight.values() if m.ready_at > self.tick]
                if not later:
                    raise SimulationError(f"deadlock at tick {self.tick}: nothing can run")
                self.tick = min(later)  # idle until the next held message is released
                continue
            kind, w, t, k = elig[int(rng.integers(len(elig)))]
            delay = 0
            if kind.endswith("_req") and c["delay_prob"] and rng.random() < c["delay_prob"]:
                delay = int(rng.integers(1, c["max_delay"] + 1))
            self._record(Event(self.tick, kind, w, t, k, delay))
            self._after_work()

    def _replay(self, events) -> None:
        for i, ev in enumerate(events):
            ev = Event(*ev)
            if ev.kind == "snapshot":
                continue  # taken by _after_work, as in the recorded run
            if ev.kind == "crash":
                if not 0 <= ev.shard < self.S:
                    raise SimulationError(f"replay: event {i} crashes shard {ev.shard} of {self.S}")
                self._record(ev)
                continue
            delay_ok = 0 <= ev.delay <= (self.config["max_delay"] if ev.kind.endswith("_req")
                                         else 0)
            if ev.kind not in WORK_KINDS or ev.tick < self.tick or not delay_ok:
                raise SimulationError(f"replay: event {i} {ev} is not a valid next event")
            self.tick = ev.tick
            if (ev.kind, ev.worker, ev.step, ev.shard) not in self._eligible():
                raise SimulationError(f"replay: event {i} {ev} is not enabled at tick {ev.tick}")
            self._record(ev)
            self._after_work()

    def _result(self) -> SimResult:
        states = [table_state(s.table) for s in self.shards]
        keys = [k for k in states[0] if k != "step"]
        merged = {k: np.concatenate([st[k] for st in states]) for k in keys}
        order = np.argsort(merged["ids"], kind="stable")
        table = {k: v[order] for k, v in merged.items()}
        return SimResult(table, self.log, np.array(self._stale, np.int64).reshape(-1, 3),
                         self.lost, list(self.violations), self.crashes, self.redelivered)

    # -- entry points ------------------------------------------------------------------
    @property
    def log(self) -> SimLog:
        """The config and schedule of the last run, for :meth:`replay`."""
        return SimLog(dict(self.config), getattr(self, "_steps", 0), tuple(self.events))

    def run(self, steps: int) -> SimResult:
        """Train ``steps`` steps on every worker under this seed's schedule."""
        if not isinstance(steps, (int, np.integer)) or steps < 0:
            raise SimulationError(f"Simulation.run: steps must be an int >= 0, got {steps!r}")
        return self._drive(int(steps), None)

    @classmethod
    def replay(cls, log: SimLog) -> SimResult:
        """Re-run a recorded schedule event by event (checking each is enabled)."""
        if not isinstance(log, SimLog):
            raise SimulationError(f"Simulation.replay: expected a SimLog, got {type(log)}")
        cfg = {**log.config, "crash_at": {}}  # forced crashes are events in the log
        return cls(**cfg)._drive(log.steps, log)


class _Zero(dict):
    def __missing__(self, key):
        return 0
