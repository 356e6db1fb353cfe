"""The shard actor of ``sampan.rec.remote``: one shard's table, its snapshot chain and the
numbered calls it applies (see that module's docstring for the protocol).

Plain Python: ``RemoteShardedEmbedding`` makes it a Ray actor with ``ray.remote``, and
the tests drive it in-process too.
"""

from __future__ import annotations

import glob
import os
import queue
import re
import threading
import time

from sampan.rec import _shm
from sampan.rec.optim import SparseAdagrad
from sampan.rec.sharded import LocalShard
from sampan.rec.snapshot import _take_export, _write_atomic, restore, table_state
from sampan.rec.table import HashEmbeddingTable

__all__ = ["ShardServer"]

# what a restored table takes from the caller (the rest is in the snapshot)
_RESTORE_KWARGS = ("admission", "eviction", "initial_capacity", "pending_limit")
_FILE = re.compile(r"^(full|delta)\.(\d+)\.(\d+)$")  # kind.seq.operation
IN_SLOT = "in-slot"     # a pull's answer: written into the slot the caller reserved


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
        self._broken = False     # the writer's: a file of the chain is missing
        self._need_full = False  # the writer asks the next export to be a full one
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
        if self._need_full:
            kind, self._need_full = "full", False  # a delta would follow a missing file
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
                self._broken = self._need_full = True
                self.write_error = f"{name}: {type(exc).__name__}: {exc}"
            finally:
                self._count("write_" + kind, time.thread_time() - t0)
                self._writes.task_done()
        self._writes.task_done()

    def _stop_writer(self) -> None:
        self._writes.put(None)
        self._writer.join()

    def close(self) -> None:
        """Finish the queued snapshot writes and stop the writer thread (an actor's
        process ends with it; a server made in-process must be closed)."""
        if self._writer.is_alive():
            self._stop_writer()

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
            if op in ("push", "write_rows"):  # a cache's write-back counts as a push
                self._after_push()
        self._count(op, time.thread_time() - t0)
        return ("ok", result, self.applied, self.durable, self.shard.table.step)

    def call_many(self, calls):
        """Several calls in one: ``[call(*c) for c in calls]`` (the answers in order). A
        call that raises answers ``("error", exception)`` and the others still run, as
        they would have one by one."""
        out = []
        for op, n, need, args in calls:
            try:
                out.append(self.call(op, n, need, *args))
            except Exception as exc:  # noqa: BLE001  (raised again at the caller)
                out.append(("error", exc))
        return out

    def _pull(self, ids, step, out=None):
        v = self.shard.pull(ids, step)
        if out is None:
            return v
        out[...] = v
        return IN_SLOT

    def _push(self, ids, grads, step):
        self.shard.push(ids, grads, step)

    def _read_rows(self, ids):
        return self.shard.read_rows(ids)

    def _top_ids(self, k):
        return self.shard.top_ids(k)

    def _write_rows(self, ids, weights, slots, seen, step):
        self.shard.write_rows(ids, weights, slots, seen, step)

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
        self._broken = self._need_full = False
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
