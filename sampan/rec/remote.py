"""Embedding shards as Ray actors: the local pull/push interface, served across processes.

``ShardedEmbedding(dim, n_shards=N, backend="ray")`` returns a :class:`RemoteShardedEmbedding`:
each shard (table, optimiser slots, metadata, admission and eviction) lives in a Ray actor
(:class:`ShardServer`), ids are deduplicated and split by shard once per batch on the
caller's side, and every shard's request goes out before any answer is awaited.

Transport (profiled on W4 with ``benchmarks/ray_ps_profile.py``). When an actor runs on
the caller's host, a call's ids, gradients and answer vectors travel through a shared
memory file per shard (``sampan.rec._shm``); elsewhere inline with the call (up to
``INLINE_BYTES``) or through Ray's object store. A push does not travel alone: it waits
in its shard's outbox and leaves with the next call to that shard (with prefetch, the
pull of the batch after next), so a training step costs one Ray call per shard. Shard
actors write their snapshot files from a thread of their own.

Recovery. Every call that changes a shard (a pull, which creates rows and counts
sightings, and a push) carries a per-shard operation number ``n``, and the caller keeps
those calls in a log. A shard writes a full snapshot when it starts and a delta every
``delta_every`` pushes (the ``sampan.rec.snapshot`` format, checksummed) and reports the
last operation number a snapshot holds; the caller then drops the log up to it. Actors
restart on failure (``max_restarts``); a restarted shard restores the latest full
snapshot plus its deltas in ``__init__`` and knows which operation it restored to. A call
that finds the shard behind (it is numbered past what the shard holds, or it is a read
that must see earlier calls) answers ``gap``; the caller then re-sends exactly the logged
calls the shard lost, once each, in order, and a call the shard already holds answers
``dup`` and is not applied again. So a crash loses nothing: after recovery the tables are
bit for bit those of an undisturbed run (with no eviction policy; an eviction policy's
sweep cursor is not in the snapshot, so with one a restarted shard may evict other rows).
What a crash *can* lose is bounded the other way round: if the caller itself dies (and
its shard actors with it), the shards' files hold every update up to their last delta, and
a new ``ShardedEmbedding(..., backend="ray", snapshot_dir=)`` over the same folder resumes
from them (``restores()`` says where each shard stood).
"""

from __future__ import annotations

import collections
import contextlib
import os
import tempfile
import threading

import numpy as np

from sampan.errors import SampanError
from sampan.rec import _shm
from sampan.rec._server import ShardServer, _chain
from sampan.rec.kernels import unique_inverse
from sampan.rec.optim import SparseAdagrad
from sampan.rec.sharded import (ShardedEmbedding, _init_signature, _join_rows,
                                register_backend, top_of)
from sampan.rec.snapshot import _write_atomic, export_full

__all__ = ["RemoteShardedEmbedding", "ShardServer", "ShardUnavailableError", "init_ray",
           "require_ray"]

ARENA_BYTES = 32 << 20  # per shard: a few steps of W4 pulls and pushes in flight


class ShardUnavailableError(SampanError, RuntimeError):
    """A remote shard did not answer within the timeout (or cannot be restarted)."""


def require_ray():
    """The ``ray`` module, or a SampanError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise SampanError("ShardedEmbedding(backend='ray') needs Ray: install sampan's "
                          "'dist' extra (pip install 'sampan[dist]') or pip install ray"
                          ) from exc
    return ray


# Arguments and results up to this size travel inside the task's own RPC instead of
# through the object store. A shard's pull answer or push of one W4 batch is 0.5-1.1 MB;
# through the store each costs a create/seal/get/release round of IPC with the raylet
# (measured: the raylet took 5.7 ms of CPU a W4 step, 0.25 ms inline) while inline
# stays cheaper up to about 2 MB, above which the store's zero-copy read wins.
INLINE_BYTES = 2 << 20
# Ray starts workers at nice 15, below everything else on the host. A shard's pull is on
# the training step's critical path (the in-process backend runs the same work in the
# trainer's own threads, at its priority): at 15 a shard starved behind any other
# process, and the trainer waited 10-12 ms a step for its prefetch on the loaded 2-core
# machine against 1.6-3 ms at 0 (benchmarks/ray_ps_profile.py, A/B in one run).
WORKER_NICENESS = 0


LOOPBACK = "127.0.0.1"


def init_ray(ray, host: str | None = LOOPBACK, **kwargs) -> None:
    """``ray.init`` with this sampan on the workers' import path (they inherit it).

    A local cluster it starts listens on ``host`` only: loopback by default, so a job on
    one machine is not reachable from the network; ``host=None`` lets Ray pick the
    machine's external address (other machines may then join it). It passes arrays up to
    ``INLINE_BYTES`` inline with the call and runs its workers at ``WORKER_NICENESS``
    (``_system_config`` given by the caller wins). A cluster it joins (``address=``, or
    ``RAY_ADDRESS``) keeps its own addresses and configuration; joining one on loopback
    (``address="127.0.0.1:PORT"``) keeps this driver on loopback as well."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env_path = os.environ.get("PYTHONPATH", "")
    if pkg_root not in env_path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env_path) if p)
    defaults = {"include_dashboard": False, "log_to_driver": False}
    node = None
    if kwargs.get("address") in (None, "local") and not os.environ.get("RAY_ADDRESS"):
        defaults["_system_config"] = {"max_direct_call_object_size": INLINE_BYTES,
                                      "worker_niceness": WORKER_NICENESS}
        if host is not None:
            defaults["_node_ip_address"] = host
        node = kwargs.get("_node_ip_address", host)
    elif isinstance(kwargs.get("address"), str) and \
            (joined := kwargs["address"].rsplit(":", 1)[0]) in (LOOPBACK, "localhost"):
        # joining a cluster on loopback (another process's, e.g. a trainer started
        # again): this driver binds loopback too, or Ray swaps the address for the
        # machine's external one and never reaches the cluster
        node = defaults["_node_ip_address"] = joined
    with _loopback_node(ray, node):
        ray.init(**{**defaults, **kwargs})


# Ray turns a loopback node address into the machine's external one (so that other
# machines could join) unless it is told that this platform runs no clusters, as it is
# on macOS and Windows: then every server of the node (GCS, raylet, object manager,
# workers, runtime-env agent) binds the loopback address. The switch is an environment
# variable read when `ray` is imported (by the processes the cluster starts, which
# inherit it) and a constant in this process, set back once the cluster is up.
_RAY_LOCAL_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def _loopback_node(ray, host: str | None):
    if host not in (LOOPBACK, "localhost", "::1"):
        yield
        return
    consts = getattr(getattr(ray, "_private", None), "ray_constants", None)
    env, const = os.environ.get(_RAY_LOCAL_ENV), getattr(consts, "ENABLE_RAY_CLUSTER", None)
    os.environ[_RAY_LOCAL_ENV] = "0"
    if const is not None:
        consts.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if env is None:
            os.environ.pop(_RAY_LOCAL_ENV, None)
        else:
            os.environ[_RAY_LOCAL_ENV] = env
        if const is not None:
            consts.ENABLE_RAY_CLUSTER = const


class _Remote:
    """The caller's side of one shard actor: numbering, the log, recovery."""

    def __init__(self, actor, index: int):
        self.actor, self.index = actor, index
        self.n = 0  # last operation number handed out
        self.log: collections.OrderedDict = collections.OrderedDict()  # n -> (op, args)
        self.replayed: dict = {}  # n -> result, for calls answered `dup` after a replay
        self.submit = threading.Lock()
        self.recover = threading.RLock()
        self.step = 0  # last step the shard reported
        self.durable = 0
        self.restores: list[dict] = []
        self.arena: _shm.Arena | None = None  # same host: arrays travel through it
        self.shm = False
        self.outbox: list = []  # calls numbered but not yet sent (a push waits here)

    def note_restore(self, info: dict) -> None:
        """Record what the actor restored from, once per actor process (``info``: its
        ``ShardServer.info``)."""
        if info["restored"] and (not self.restores or
                                 self.restores[-1]["pid"] != info["pid"]):
            self.restores.append({**info["restored"], "pid": info["pid"]})


class _Sent:
    """A submitted call: its number, what it needs, Ray's ref, and its arena slots
    (``answer``: where a pull's vectors come back)."""

    __slots__ = ("n", "need", "ref", "index", "slots", "answer")

    def __init__(self, n, need, slots=(), answer=None):
        self.n, self.need, self.slots, self.answer = n, need, slots, answer
        self.ref = self.index = None  # index: its place in a batched call's answers


class RemoteShardedEmbedding(ShardedEmbedding):
    """``ShardedEmbedding`` whose shards are Ray actors (see the module docstring).

    ``snapshot_dir`` holds one folder per shard (a temporary folder when not given);
    ``delta_every`` pushes between deltas; ``timeout`` seconds before a shard that does
    not answer raises :class:`ShardUnavailableError`; ``max_restarts`` (-1: always) and
    ``max_task_retries`` go to the actors; ``max_staleness`` is read by ``Prefetcher``.

    >>> # e = ShardedEmbedding(16, n_shards=2, backend="ray"); u, inv, v = e.pull(ids)
    """

    def __init__(self, dim: int, n_shards: int = 4, optimizer_factory=None, shards=None,
                 threads: int | None = None, *, backend: str = "ray",
                 num_shards: int | None = None, snapshot_dir: str | None = None,
                 delta_every: int = 10, timeout: float = 60.0, max_restarts: int = -1,
                 max_task_retries: int = -1, max_staleness: int = 0,
                 initial_tables=None, **table_kwargs):
        ray = require_ray()
        self._ray = ray
        self.dim = int(dim)
        n = int(num_shards if num_shards is not None else n_shards)
        if initial_tables is not None:
            n = len(initial_tables)
        if n < 1:
            raise ValueError(f"n_shards must be >= 1, got {n}")
        if shards is not None:
            raise ValueError("backend='ray' creates its own shards; shards= is for 'local'")
        self.timeout = float(timeout)
        self.max_staleness = int(max_staleness)
        self._tmp = None
        if snapshot_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sampan-ps-")
            snapshot_dir = self._tmp.name
        self.snapshot_dir = snapshot_dir
        if not ray.is_initialized():
            init_ray(ray)
        make_opt = optimizer_factory or (lambda: SparseAdagrad(0.05))
        self.make_optimizer = make_opt  # what a cache in front copies (sampan.rec.hotcache)
        opts = {"num_cpus": 0, "max_restarts": max_restarts,
                "max_task_retries": max_task_retries}
        # Workers must import this sampan. They inherit the environment ray.init saw; when
        # that did not name this checkout, say so per actor (a runtime_env costs a fresh
        # worker process, so only then).
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env_path = os.environ.get("PYTHONPATH", "")
        if pkg_root not in env_path.split(os.pathsep):
            opts["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(
                p for p in (pkg_root, env_path) if p)}}
        cls = ray.remote(ShardServer).options(**opts)
        self.shards = []
        for i in range(n):
            d = os.path.join(snapshot_dir, f"shard_{i}")
            if initial_tables is not None:
                os.makedirs(d, exist_ok=True)
                if _chain(d) is None:
                    export_full(initial_tables[i], os.path.join(d, "full.0.0"))
            arena = _shm.new_arena(ARENA_BYTES)
            actor = cls.remote(i, n, self.dim, make_opt(), dict(table_kwargs), d, delta_every,
                               arena=None if arena is None else arena.handle())
            self.shards.append(_Remote(actor, i))
            self.shards[-1].arena = arena
        self.pool = None
        self.push_log = None
        self._pending: collections.deque = collections.deque()  # (shard, args, _Sent)
        self._written: collections.deque = collections.deque()  # write_rows, likewise
        for s, info in zip(self.shards, self._get([s.actor.info.remote()
                                                   for s in self.shards], self.shards)):
            # a shard that restored snapshot_dir's files (a trainer started again after
            # its process died) holds operations up to `applied`: number on from there,
            # or its first calls would be answered `dup` and dropped
            s.step, s.durable, s.n = info["step"], info["durable"], info["applied"]
            if initial_tables is None:
                s.note_restore(info)
            s.shm = bool(info["arena"])
            if not s.shm and s.arena is not None:  # another host: arrays go inline
                s.arena.close()
                s.arena = None

    # -- plumbing ----------------------------------------------------------------------------
    def _get(self, refs, shards):
        """ray.get with the timeout, naming the shard that did not answer."""
        ray = self._ray
        try:
            return ray.get(refs, timeout=self.timeout)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as exc:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            late = [s for s, r in zip(shards, refs) if r not in ready] or list(shards)
            s = late[0]
            what = "did not answer within" if isinstance(
                exc, ray.exceptions.GetTimeoutError) else "died and was not restarted within"
            raise ShardUnavailableError(
                f"remote embedding shard {s.index} {what} {self.timeout:g} s; its last known "
                f"step is {s.step} ({type(exc).__name__})") from None

    def _send(self, s: _Remote, op: str, args: tuple, mutating: bool, answer=None,
              park: bool = False) -> _Sent:
        """Number and submit one call. On the shard's host its large arrays travel through
        the arena, and ``answer`` (a shape) reserves the place a pull's vectors come back
        in. A ``park`` ed call (a push) waits in the shard's outbox and leaves with the
        next call to that shard (the next batch's pull, as a rule), as one Ray call: a Ray
        call costs about 0.5 ms of CPU on each side whatever it carries."""
        wire, slots, out = args, [], None
        if s.shm:
            wire, slots, out = _shm.encode(s.arena, args, answer)
        with s.submit:
            if mutating:
                s.n += 1
                n, need = s.n, s.n - 1
                s.log[n] = (op, args)
            else:
                n, need = None, s.n
            sent = _Sent(n, need, slots, out)
            s.outbox.append((op, n, need, wire, sent))
            if not park:
                self._kick_locked(s)
            return sent

    def _kick(self, s: _Remote) -> None:
        """Send what waits in a shard's outbox."""
        with s.submit:
            self._kick_locked(s)

    def _kick_locked(self, s: _Remote) -> None:
        box, s.outbox = s.outbox, []
        if len(box) == 1:
            op, n, need, wire, sent = box[0]
            sent.ref = s.actor.call.remote(op, n, need, *wire)
        elif box:
            ref = s.actor.call_many.remote([c[:4] for c in box])
            for i, c in enumerate(box):
                c[4].ref, c[4].index = ref, i

    def _replies(self, sent: list, shards: list) -> list:
        """The answers of submitted calls (each its part of a batched call's)."""
        got = self._get([c.ref for c in sent], shards)
        return [g if c.index is None else g[c.index] for c, g in zip(sent, got)]

    def _release(self, s: _Remote, sent: _Sent) -> None:
        for slot in sent.slots:
            s.arena.free(slot.offset)

    def _settle(self, s: _Remote, op: str, args: tuple, n, need, reply):
        """The result of a call from its reply, recovering the shard first when behind."""
        while True:
            status = reply[0]
            if status == "ok":
                _, result, applied, durable, step = reply
                s.step = max(s.step, step)
                self._trim(s, durable)
                return result
            if status == "error":  # a call of a batched one raised in the actor
                raise reply[1]
            if status == "inline":  # a restarted actor that cannot reach the arena
                s.shm = False
                reply = self._get([s.actor.call.remote(op, n, need, *args)], [s])[0]
                continue
            self._recover(s, n if n is not None else need)
            if n is not None:
                with s.recover:
                    if n in s.replayed:
                        return s.replayed.pop(n)
                if op in ("push", "write_rows"):
                    return None
                # applied before a crash, held by the snapshot, answered `dup` on retry:
                # the shard's current vectors (nothing later can have reached it yet)
                op, args, n, need = "read", args[:1], None, n
            reply = self._get([s.actor.call.remote(op, n, need, *args)], [s])[0]

    def _trim(self, s: _Remote, durable: int) -> None:
        with s.submit:
            s.durable = max(s.durable, durable)
            while s.log and next(iter(s.log)) <= s.durable:
                s.log.popitem(last=False)

    def _recover(self, s: _Remote, upto: int) -> None:
        """Re-send, in order, the logged calls up to ``upto`` that the shard lost."""
        with s.recover:
            info = self._get([s.actor.info.remote()], [s])[0]
            s.note_restore(info)
            applied = info["applied"]
            with s.submit:
                todo = [(k, v) for k, v in s.log.items() if applied < k <= upto]
            if todo and todo[0][0] != applied + 1:
                raise ShardUnavailableError(
                    f"remote embedding shard {s.index} restored to operation {applied} but "
                    f"the log starts at {todo[0][0]}: updates are lost (last step {s.step})")
            for k, (op, args) in todo:
                reply = self._get([s.actor.call.remote(op, k, k - 1, *args)], [s])[0]
                if reply[0] == "ok":
                    s.replayed[k] = reply[1]
                    s.step = max(s.step, reply[4])
                    self._trim(s, reply[3])
                elif reply[0] == "gap":
                    raise ShardUnavailableError(
                        f"remote embedding shard {s.index} lost operations again while "
                        f"recovering (at {reply[1]}, last step {s.step})")
            if s.restores and s.restores[-1]["pid"] == info["pid"]:
                s.restores[-1]["resent"] = s.restores[-1].get("resent", 0) + len(todo)
            for k in [k for k in s.replayed if k < s.durable - 4096]:
                s.replayed.pop(k)  # results nobody asked for (their call had an answer)

    def _fan(self, op: str, argsets, mutating: bool):
        """One call per shard, all submitted before any is awaited; results in order."""
        sent = [self._send(s, op, a, mutating) for s, a in zip(self.shards, argsets)]
        replies = self._replies(sent, self.shards)
        out = []
        for s, a, c, rep in zip(self.shards, argsets, sent, replies):
            out.append(self._settle(s, op, a, c.n, c.need, rep))
            self._release(s, c)
        return out

    # -- the ShardedEmbedding interface ---------------------------------------------------
    def close(self) -> None:
        """Wait for pending pushes and stop the shard actors."""
        try:
            self.flush()
        finally:
            # Stop and join every shard's snapshot writer before anything is removed: a
            # kill is asynchronous, and a writer still running would create files in the
            # folder being deleted ("Directory not empty"), or after it is gone.
            self._stop_writers()
            for s in self.shards:
                self._ray.kill(s.actor, no_restart=True)
                if s.arena is not None:
                    s.arena.close()
                    s.arena, s.shm = None, False
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None

    def _stop_writers(self) -> None:
        refs = [s.actor.close.remote() for s in self.shards]
        for s, ref in zip(self.shards, refs):
            try:
                self._get([ref], [s])
            except Exception:  # noqa: BLE001 - a dead shard's writer died with it
                pass

    def __len__(self) -> int:
        return int(sum(self._fan("len", [()] * len(self.shards), False)))

    @property
    def nbytes(self) -> int:
        """Bytes the shards' tables hold."""
        return int(sum(self._fan("nbytes", [()] * len(self.shards), False)))

    def plan(self, ids, step: int | None = None):
        """Dedupe, split by shard and send every shard its pull; the answers are awaited
        by :meth:`fetch` (``rows`` holds the pending calls)."""
        uniq, inverse = unique_inverse(ids)
        self._count(uniq, inverse)
        parts, sent = self.plan_unique(uniq, step)
        return uniq, inverse, parts, sent

    def plan_unique(self, uniq: np.ndarray, step: int | None = None):
        """:meth:`plan` of ids already distinct: ``(parts, rows)`` (one pull per shard)."""
        parts = self._split(uniq)
        sent = []
        for s, p in zip(self.shards, parts):
            args = (uniq[p], step)
            sent.append((s, args, self._send(s, "pull", args, True, (p.size, self.dim))))
        return parts, sent

    def fetch(self, uniq, parts, rows) -> np.ndarray:
        out = np.empty((uniq.size, self.dim), np.float32)
        replies = self._replies([c for _, _, c in rows], [s for s, *_ in rows])
        for p, (s, args, c), rep in zip(parts, rows, replies):
            v = self._settle(s, "pull", args, c.n, c.need, rep)
            out[p] = s.arena.view(c.answer) if isinstance(v, str) else v
            self._release(s, c)
        return out

    def _push(self, uniq, grads, step) -> None:
        """`push` (ShardedEmbedding's, with its profiler span): send each shard its ids'
        summed gradients without waiting; at most ``max_staleness + 1`` pushes per shard
        stay unconfirmed (their answers, and any recovery they need, are settled before
        more are sent)."""
        uniq = np.ascontiguousarray(uniq, np.int64)
        grads = np.ascontiguousarray(grads, np.float32)
        parts = self._split(uniq)
        for s, p in zip(self.shards, parts):
            args = (uniq[p], grads[p], step)
            self._pending.append((s, args, self._send(s, "push", args, True, park=True)))
        if self.push_log is not None:
            self.push_log.append(uniq.copy())
        self._drain(len(self.shards) * (self.max_staleness + 1))

    def _drain(self, keep: int) -> None:
        while len(self._pending) > keep:
            s, args, c = self._pending.popleft()
            if c.ref is None:
                self._kick(s)
            self._settle(s, "push", args, c.n, c.need, self._replies([c], [s])[0])
            self._release(s, c)

    def flush(self) -> None:
        """Wait until every push (and write-back) sent so far is applied."""
        for s in self.shards:
            self._kick(s)
        self._drain(0)
        self._settle_written()

    def _settle_written(self) -> None:
        """Settle the write-backs sent so far (and free their arena slots)."""
        while self._written:
            s, args, c = self._written.popleft()
            if c.ref is None:
                self._kick(s)
            self._settle(s, "write_rows", args, c.n, c.need, self._replies([c], [s])[0])
            self._release(s, c)

    def _refetch(self, uniq, parts, rows, mask, out) -> None:
        sel = [p[mask[p]] for p in parts]
        got = self._fan("read", [(uniq[q],) for q in sel], False)
        for q, v in zip(sel, got):
            out[q] = v

    def read_rows(self, uniq):
        """``(found, weights, slots)`` of unique ids on their shards (after every push)."""
        uniq = np.ascontiguousarray(uniq, np.int64)
        parts = self._split(uniq)
        got = self._fan("read_rows", [(uniq[p],) for p in parts], False)
        return _join_rows(uniq.size, self.dim, parts, got)

    def top_ids(self, k: int):
        """``(ids, counts)``: the ``k`` ids the shards counted most, most first (each
        shard answers after every call sent to it before, write-backs included)."""
        return top_of(self._fan("top_ids", [(int(k),)] * len(self.shards), False), k)

    def write_rows(self, uniq, weights, slots, seen, step: int | None = None) -> None:
        """Overwrite unique ids' rows on their shards: numbered and logged like a push,
        so a restarted shard gets it again, and like a push it does not wait: it leaves
        with the next call to each shard (the next pull, as a rule; every later call of
        that shard sees it), and its answers are settled by the next write-back or
        :meth:`flush` (a write-back every few steps that waited for its round trip cost
        the W4 trainer a quarter of its time)."""
        uniq = np.ascontiguousarray(uniq, np.int64)
        parts = self._split(uniq)
        self._settle_written()  # the last write-back's: applied long since, as a rule
        for s, p in zip(self.shards, parts):
            args = (uniq[p], np.ascontiguousarray(weights[p]),
                    None if slots is None else np.ascontiguousarray(slots[p]),
                    np.ascontiguousarray(seen[p], np.int64), step)
            self._written.append((s, args, self._send(s, "write_rows", args, True,
                                                      park=True)))

    def read(self, ids) -> np.ndarray:
        """Vectors of ids without creating rows; sees every push sent before it."""
        uniq, inverse = unique_inverse(ids)
        parts = self._split(uniq)
        out = np.empty((uniq.size, self.dim), np.float32)
        for p, v in zip(parts, self._fan("read", [(uniq[p],) for p in parts], False)):
            out[p] = v
        return out[inverse]

    # -- state, snapshots, recovery reports ---------------------------------------------------
    def states(self) -> list[dict]:
        """``snapshot.table_state`` of every shard (sorted ids, weights, slots, metadata)."""
        return self._fan("state", [()] * len(self.shards), False)

    def info(self) -> list[dict]:
        """Each shard actor's :meth:`ShardServer.info`."""
        for s in self.shards:
            self._kick(s)
        return self._get([s.actor.info.remote() for s in self.shards], self.shards)

    def restores(self) -> list[list[dict]]:
        """Per shard, the restarts this embedding recovered from: the step and operation
        each restored to, the files read and the seconds the restore took."""
        return [list(s.restores) for s in self.shards]

    def export_sharded(self, directory: str, tag: int = 0) -> dict:
        """A consistent full export of every shard into ``directory`` (the format of
        ``snapshot.export_sharded``: ``restore_sharded(directory, [tag])`` reads it)."""
        self.flush()
        os.makedirs(directory, exist_ok=True)
        got = self._fan("export_shard", [(directory, tag)] * len(self.shards), False)
        manifest = {"kind": "full", "seq": tag, "n_shards": len(self.shards),
                    "files": [g["file"] for g in got], "steps": [g["step"] for g in got],
                    "lineages": [g["lineage"] for g in got]}
        _write_atomic(os.path.join(directory, f"manifest.{tag}.json"), manifest, {})
        return manifest

    def clear(self) -> None:
        """Drop every row of every shard (the actors stay up; their chains restart)."""
        self.flush()
        self._get([s.actor.clear.remote() for s in self.shards], self.shards)
        for s in self.shards:
            with s.recover, s.submit:
                s.n = s.step = s.durable = 0
                s.log.clear()
                s.replayed.clear()
                s.restores.clear()

    def kill_shard(self, index: int) -> None:
        """Kill one shard's actor process (Ray restarts it; for tests and demos)."""
        self._ray.kill(self.shards[index].actor, no_restart=False)


RemoteShardedEmbedding.__signature__ = _init_signature(RemoteShardedEmbedding)
register_backend("ray", RemoteShardedEmbedding)   # ShardedEmbedding(..., backend="ray")
