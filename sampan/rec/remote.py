"""Embedding shards as Ray actors: the local pull/push interface, served across processes.

``ShardedEmbedding(dim, n_shards=N, backend="ray")`` returns a :class:`RemoteShardedEmbedding`:
each shard (table, optimiser slots, metadata, admission and eviction) lives in a Ray actor
(:class:`ShardServer`), ids are deduplicated and split by shard once per batch on the
caller's side, every shard's request goes out before any answer is awaited, and vectors
come back through Ray's object store (read-only arrays, copied once into the batch).

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
What a crash *can* lose is bounded the other way round: if the caller itself dies, the
shards hold every update up to their last delta.
"""

from __future__ import annotations

import collections
import glob
import os
import queue
import re
import tempfile
import threading
import time

import numpy as np

from sampan.errors import SampanError
from sampan.profiler import recorder as _rec
from sampan.rec import _shm
from sampan.rec.kernels import unique_inverse
from sampan.rec.optim import SparseAdagrad
from sampan.rec.sharded import LocalShard, ShardedEmbedding, _init_signature
from sampan.rec.snapshot import _take_export, _write_atomic, export_full, restore, table_state
from sampan.rec.table import HashEmbeddingTable

__all__ = ["RemoteShardedEmbedding", "ShardServer", "ShardUnavailableError", "init_ray",
           "require_ray"]

# what a restored table takes from the caller (the rest is in the snapshot)
_RESTORE_KWARGS = ("admission", "eviction", "initial_capacity", "pending_limit")
_FILE = re.compile(r"^(full|delta)\.(\d+)\.(\d+)$")  # kind.seq.operation
ARENA_BYTES = 32 << 20  # per shard: a few steps of W4 pulls and pushes in flight
_IN_SLOT = "in-slot"    # a pull's answer: written into the slot the caller reserved


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


def init_ray(ray, **kwargs) -> None:
    """``ray.init`` with this sampan on the workers' import path (they inherit it).

    A local cluster it starts passes arrays up to ``INLINE_BYTES`` inline with the call
    (``_system_config`` given by the caller wins); a cluster it joins (``address=``) keeps
    its own configuration."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env_path = os.environ.get("PYTHONPATH", "")
    if pkg_root not in env_path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env_path) if p)
    defaults = {"include_dashboard": False, "log_to_driver": False}
    if kwargs.get("address") in (None, "local") and not os.environ.get("RAY_ADDRESS"):
        defaults["_system_config"] = {"max_direct_call_object_size": INLINE_BYTES}
    ray.init(**{**defaults, **kwargs})


def _chain(directory: str):
    """The newest full snapshot in ``directory`` and the deltas that follow it."""
    files = []
    for path in glob.glob(os.path.join(directory, "*")):
        m = _FILE.match(os.path.basename(path))
        if m:
            files.append((int(m.group(2)), m.group(1), int(m.group(3)), path))
    files.sort()
    fulls = [f for f in files if f[1] == "full"]
    if not fulls:
        return None
    start = fulls[-1][0]
    chain = [fulls[-1]] + [f for f in files if f[1] == "delta" and f[0] > start]
    return chain


class ShardServer:
    """One shard, run inside a Ray actor (``ray.remote`` is applied when one is created).

    ``call(op, n, need, *args)`` answers ``("ok", result, applied, durable, step)``,
    ``("gap", applied)`` when the shard holds fewer operations than ``need``, or
    ``("dup", applied)`` when operation ``n`` is already applied.
    """

    def __init__(self, index: int, count: int, dim: int, optimizer, table_kwargs: dict,
                 snapshot_dir: str, delta_every: int, full_every: int = 20, arena=None):
        self.index, self.count = index, count
        self._arena_handle = arena
        self._arena = _shm.attach(arena) if arena is not None else None
        self.optimizer = optimizer if optimizer is not None else SparseAdagrad(0.05)
        self.dir = snapshot_dir
        self.delta_every, self.full_every = max(1, int(delta_every)), max(1, int(full_every))
        self.dim, self.table_kwargs = dim, table_kwargs
        os.makedirs(snapshot_dir, exist_ok=True)
        chain = _chain(snapshot_dir)
        t0 = time.perf_counter()
        if chain is None:
            table = HashEmbeddingTable(dim, **table_kwargs)
            self.applied = 0
            self.restored = None
        else:
            keep = {k: v for k, v in table_kwargs.items() if k in _RESTORE_KWARGS}
            table = restore(chain[0][3], [c[3] for c in chain[1:]], **keep)
            self.applied = chain[-1][2]
            self.restored = {"step": table.step, "op": self.applied, "files": len(chain),
                             "seconds": time.perf_counter() - t0}
        self.shard = LocalShard(table, self.optimizer)
        self.durable = self.applied
        self.pushes = 0
        self.deltas = 0
        self.cpu: dict = {}  # op -> [calls, thread CPU seconds] (what `info` reports)
        # Snapshot files are written by a thread of their own: a call only captures the
        # rows (a copy, consistent at its operation) and returns, so the next pull is not
        # held up by hashing, writing and fsync. `durable` moves only once a file is on
        # disk; a failed write makes the next export a full one (the deltas queued after
        # it are dropped: their base is missing) and is reported by `info`.
        self._writes: queue.Queue = queue.Queue()
        self._broken = False
        self.write_error = None
        self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                        name=f"shard-{index}-snapshots")
        self._writer.start()
        if chain is None:
            self._export("full", wait=True)

    def clear(self) -> None:
        """Start again from an empty table (and an empty snapshot chain)."""
        self._stop_writer()
        for *_, path in _chain_all(self.dir):
            os.remove(path)
        self.__init__(self.index, self.count, self.dim, self.optimizer, self.table_kwargs,
                      self.dir, self.delta_every, self.full_every, self._arena_handle)

    # -- snapshots -----------------------------------------------------------------------
    def _export(self, kind: str, wait: bool = False) -> None:
        t0 = time.thread_time()
        if self._broken:
            kind = "full"  # a delta would follow a file that is not on disk
        t = self.shard.table
        with t.lock:
            header, arrays, _ = _take_export(t, kind)
        name = f"{kind}.{header['seq']}.{self.applied}"
        self._writes.put((kind, name, header, arrays, self.applied))
        self._count("capture_" + kind, time.thread_time() - t0)
        if wait:
            self._writes.join()

    def _write_loop(self) -> None:
        while (job := self._writes.get()) is not None:
            t0 = time.thread_time()
            kind, name, header, arrays, applied = job
            try:
                if kind == "delta" and self._broken:
                    continue
                _write_atomic(os.path.join(self.dir, name), header, arrays)
                if kind == "full":  # the older chains are no longer needed
                    self._broken = False
                    for seq, _, _, path in _chain_all(self.dir):
                        if seq < header["seq"]:
                            os.remove(path)
                self.durable = max(self.durable, applied)
            except Exception as exc:  # noqa: BLE001  (reported by info; a full follows)
                self._broken = True
                self.write_error = f"{name}: {type(exc).__name__}: {exc}"
            finally:
                self._count("write_" + kind, time.thread_time() - t0)
                self._writes.task_done()
        self._writes.task_done()

    def _stop_writer(self) -> None:
        self._writes.put(None)
        self._writer.join()

    def _count(self, what: str, seconds: float) -> None:
        c = self.cpu.setdefault(what, [0, 0.0])
        c[0] += 1
        c[1] += seconds

    def _after_push(self) -> None:
        self.pushes += 1
        if self.pushes % self.delta_every == 0:
            self.deltas += 1
            self._export("full" if self.deltas % self.full_every == 0 else "delta")

    # -- the one entry point ---------------------------------------------------------------
    def call(self, op: str, n, need: int, *args):
        if n is not None and n <= self.applied:
            return ("dup", self.applied)
        if self.applied < need:
            return ("gap", self.applied)
        if any(type(a) is _shm.Slot for a in args):
            if self._arena is None:  # restarted where the caller's arena is out of reach
                return ("inline", self.applied)
            args = tuple(_shm.view(self._arena, a) if type(a) is _shm.Slot else a
                         for a in args)
        t0 = time.thread_time()
        result = getattr(self, "_" + op)(*args)
        if n is not None:
            self.applied = n
            if op == "push":
                self._after_push()
        self._count(op, time.thread_time() - t0)
        return ("ok", result, self.applied, self.durable, self.shard.table.step)

    def call_many(self, calls):
        """Several calls in one: ``[call(*c) for c in calls]`` (the answers in order)."""
        return [self.call(op, n, need, *args) for op, n, need, args in calls]

    def _pull(self, ids, step, out=None):
        v = self.shard.pull(ids, step)
        if out is None:
            return v
        out[...] = v
        return _IN_SLOT

    def _push(self, ids, grads, step):
        self.shard.push(ids, grads, step)

    def _read(self, ids):
        return self.shard.table.read(ids)

    def _state(self):
        return table_state(self.shard.table)

    def _len(self):
        return len(self.shard.table)

    def _nbytes(self):
        return self.shard.table.nbytes

    def _export_shard(self, directory: str, tag: int):
        """A full export (also the start of this shard's own new chain) into ``directory``
        as shard file ``shard_<i>.<tag>.full`` of a sharded export."""
        self._writes.join()  # the files queued so far first, in order
        t = self.shard.table
        with t.lock:
            header, arrays, _ = _take_export(t, "full")
        _write_atomic(os.path.join(self.dir, f"full.{header['seq']}.{self.applied}"),
                      header, dict(arrays))
        self.durable = self.applied
        self._broken = False
        header["shard"] = {"index": self.index, "count": self.count}
        name = f"shard_{self.index}.{tag}.full"
        _write_atomic(os.path.join(directory, name), header, arrays)
        return {"file": name, "step": header["step"], "lineage": header["lineage"]}

    def _sleep(self, seconds: float):  # for tests of the caller's timeout
        time.sleep(seconds)

    def info(self) -> dict:
        """Where this shard stands: operations applied and snapshotted, its step, and
        what it restored from when it (re)started (None for a fresh shard)."""
        return {"index": self.index, "applied": self.applied, "durable": self.durable,
                "step": self.shard.table.step, "rows": len(self.shard.table),
                "restored": self.restored, "pid": os.getpid(),
                "cpu": {k: tuple(v) for k, v in list(self.cpu.items())},
                "write_error": self.write_error, "arena": self._arena is not None,
                "process_cpu": time.process_time()}


def _chain_all(directory: str):
    out = []
    for path in glob.glob(os.path.join(directory, "*")):
        m = _FILE.match(os.path.basename(path))
        if m:
            out.append((int(m.group(2)), m.group(1), int(m.group(3)), path))
    return out


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
        for s, info in zip(self.shards, self._get([s.actor.info.remote()
                                                   for s in self.shards], self.shards)):
            s.step, s.durable = info["step"], info["durable"]
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
            if status == "inline":  # a restarted actor that cannot reach the arena
                s.shm = False
                reply = self._get([s.actor.call.remote(op, n, need, *args)], [s])[0]
                continue
            self._recover(s, n if n is not None else need)
            if n is not None:
                with s.recover:
                    if n in s.replayed:
                        return s.replayed.pop(n)
                if op == "push":
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
            if info["restored"] and (not s.restores or
                                     s.restores[-1]["pid"] != info["pid"]):
                s.restores.append({**info["restored"], "pid": info["pid"]})
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
            for s in self.shards:
                self._ray.kill(s.actor, no_restart=True)
                if s.arena is not None:
                    s.arena.close()
                    s.arena, s.shm = None, False
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None

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
        parts = self._split(uniq)
        sent = []
        for s, p in zip(self.shards, parts):
            args = (uniq[p], step)
            sent.append((s, args, self._send(s, "pull", args, True, (p.size, self.dim))))
        return uniq, inverse, parts, sent

    def fetch(self, uniq, parts, rows) -> np.ndarray:
        out = np.empty((uniq.size, self.dim), np.float32)
        replies = self._replies([c for _, _, c in rows], [s for s, *_ in rows])
        for p, (s, args, c), rep in zip(parts, rows, replies):
            v = self._settle(s, "pull", args, c.n, c.need, rep)
            out[p] = s.arena.view(c.answer) if isinstance(v, str) else v
            self._release(s, c)
        return out

    def push(self, uniq, grads, step: int | None = None) -> None:
        """Send each shard its ids' summed gradients without waiting; at most
        ``max_staleness + 1`` pushes per shard stay unconfirmed (their answers, and any
        recovery they need, are settled before more are sent)."""
        if _rec.ACTIVE:
            with _rec.span("push", "rec", ids=int(np.size(uniq))):
                return self._push(uniq, grads, step)
        return self._push(uniq, grads, step)

    def _push(self, uniq, grads, step) -> None:
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
        """Wait until every push sent so far is applied."""
        for s in self.shards:
            self._kick(s)
        self._drain(0)

    def _refetch(self, uniq, parts, rows, mask, out) -> None:
        sel = [p[mask[p]] for p in parts]
        got = self._fan("read", [(uniq[q],) for q in sel], False)
        for q, v in zip(sel, got):
            out[q] = v

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
