"""DataLoader: batches from a dataset, optionally loaded ahead by worker threads/processes.

Batches always come out in the sampler's order: task k goes to worker ``k % n`` and
the main side reorders replies by sequence number, keeping at most
``prefetch_factor * num_workers`` tasks in flight. Workers are shut down when an epoch
ends, when a worker fails, and when the iterator is dropped (a `break`, garbage
collection), through a `weakref.finalize` that holds no reference to the iterator.
"""
from __future__ import annotations

import collections
import contextlib
import multiprocessing
import multiprocessing.connection as _mp_connection
import pickle
import queue
import signal
import threading
import time
import weakref

from sampan.errors import SampanError, SampanValueError
from sampan import _recorder as _rec

from . import _worker
from .collate import default_collate, default_convert
from .dataset import IterableDataset
from .sampler import BatchSampler, RandomSampler, SequentialSampler

__all__ = ["DataLoader", "DataLoaderWorkerError"]

# A clean shutdown (end of epoch, `break`) lets workers finish the task in hand for up
# to _JOIN_S. After a failure nothing they hold is wanted: they get _ABORT_JOIN_S to
# take their stop message (an idle worker exits at once), then processes are
# terminated, so a hung worker cannot hold the error back.
_JOIN_S = 2.0
_ABORT_JOIN_S = 0.1
_KILL_S = 0.5
_SHOWN_INDICES = 32  # longer batches are shortened in messages (the error keeps them all)


class DataLoaderWorkerError(SampanError, RuntimeError):
    """A DataLoader worker failed; the message carries the worker's own traceback.

    `worker_id` is the worker, `indices` the batch's dataset indices (a list, or one
    index when batching is off; None for an iterable dataset or worker_init_fn).
    """

    def __init__(self, message, worker_id=None, exc_type=None, worker_traceback=None,
                 indices=None):
        super().__init__(message)
        self.worker_id = worker_id
        self.exc_type = exc_type
        self.worker_traceback = worker_traceback
        self.indices = indices


class DataLoader:
    """Iterate over `dataset` in batches, optionally loading ahead with workers.

    `shuffle=True` uses a `RandomSampler` seeded with `seed`: with a seed, the same
    seed gives the same batches in the same order whatever `num_workers` and
    `worker_mode` ("thread" or "process"). Process workers use `mp_context`
    ("forkserver" by default where available, else "spawn"), so the dataset and
    `collate_fn` must be picklable. `timeout` > 0 bounds the wait for one batch: past
    it, `DataLoaderWorkerError` names the worker and the batch's indices, and process
    workers are terminated at once (a thread cannot be; it ends when its task returns).

    With `persistent_workers=True` the workers (and their dataset copies) live across
    epochs until the loader is closed (`close()`) or garbage-collected. A `generator`
    (a `sampan.Generator` or a numpy one) drives the shuffle and the workers' seeds
    instead of `seed`. `pin_memory` and `pin_memory_device` are accepted for PyTorch
    compatibility and do nothing (host memory needs no pinning on the CPU backend).

    Example::

        >>> loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, seed=0,
        ...                     num_workers=2)
        >>> for xb, yb in loader: ...
    """

    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None,
                 drop_last=False, collate_fn=None, num_workers=0, worker_mode="thread",
                 prefetch_factor=None, seed=None, timeout=0.0, worker_init_fn=None,
                 mp_context=None, generator=None, persistent_workers=False, pin_memory=False,
                 pin_memory_device="", multiprocessing_context=None):
        def bad(msg):
            return SampanValueError(f"DataLoader: {msg}")

        if prefetch_factor is None:
            prefetch_factor = 2
        if multiprocessing_context is not None:  # torch's name for mp_context
            if mp_context is not None:
                raise bad("got both mp_context and multiprocessing_context; give one")
            mp_context = multiprocessing_context
        if persistent_workers and not (isinstance(num_workers, int) and num_workers > 0):
            raise bad("persistent_workers=True needs num_workers > 0")
        if not isinstance(pin_memory, bool) or not isinstance(pin_memory_device, str):
            raise bad(f"got pin_memory={pin_memory!r}, pin_memory_device="
                      f"{pin_memory_device!r}; expected a bool and a str")
        self.generator = generator
        self.persistent_workers = bool(persistent_workers)
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self._pool = None  # the persistent workers, once started
        self._pool_finalizer = None

        if not isinstance(num_workers, int) or num_workers < 0:
            raise bad(f"got num_workers={num_workers!r}; expected an int >= 0")
        if worker_mode not in ("thread", "process"):
            raise bad(f"got worker_mode={worker_mode!r}; expected 'thread' or 'process'")
        if not isinstance(prefetch_factor, int) or prefetch_factor < 1:
            raise bad(f"got prefetch_factor={prefetch_factor!r}; expected an int >= 1")
        if timeout < 0:
            raise bad(f"got timeout={timeout}; expected >= 0 (0 waits without limit)")
        self.dataset = dataset
        self.num_workers = num_workers
        self.worker_mode = worker_mode
        self.prefetch_factor = prefetch_factor
        self.seed = seed
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.mp_context = mp_context
        self.drop_last = drop_last
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable:
            if shuffle or sampler is not None or batch_sampler is not None:
                raise bad("an IterableDataset decides its own order; got shuffle, sampler or "
                          "batch_sampler")
            self.batch_size = batch_size
            self.sampler = self.batch_sampler = None
        else:
            if batch_sampler is not None:
                if batch_size != 1 or shuffle or sampler is not None or drop_last:
                    raise bad("batch_sampler excludes batch_size, shuffle, sampler and "
                              "drop_last")
                batch_size = None
            elif batch_size is None and drop_last:
                raise bad("drop_last needs a batch_size")
            if sampler is not None and shuffle:
                raise bad("got both sampler and shuffle=True; shuffle inside the sampler")
            if sampler is None:
                sampler = RandomSampler(dataset, seed=None if generator is not None else seed,
                                        generator=generator) if shuffle else \
                    SequentialSampler(dataset)
            if batch_size is not None and batch_sampler is None:
                batch_sampler = BatchSampler(sampler, batch_size, drop_last)
            self.batch_size = batch_size
            self.sampler = sampler
            self.batch_sampler = batch_sampler
        self._auto_collation = self.batch_size is not None or batch_sampler is not None
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn

    def set_epoch(self, epoch: int) -> None:
        """Pass `epoch` to the sampler (to resume a seeded shuffle mid-run).

        Example::

            >>> loader.set_epoch(5)
        """
        target = self.batch_sampler if self.batch_sampler is not None else self.sampler
        if hasattr(target, "set_epoch"):
            target.set_epoch(epoch)

    def __len__(self) -> int:
        if self._iterable:
            n = len(self.dataset)  # TypeError when the stream has no length
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        return len(self.sampler)

    def _fetcher(self):
        if self._iterable:
            return _worker.IterFetcher(self.dataset, self.collate_fn, self.batch_size,
                                       self.drop_last)
        return _worker.MapFetcher(self.dataset, self.collate_fn, self._auto_collation)

    def _tasks(self):
        if self._iterable:
            return None
        return iter(self.batch_sampler if self.batch_sampler is not None else self.sampler)

    def __iter__(self):
        if self.num_workers == 0:
            return _SingleIter(self)
        tasks = self._tasks()  # first: a seeded shuffle's epoch also seeds the workers
        if not self.persistent_workers:
            return _WorkerIter(self, tasks, _Pool(self, self._base_seed()), owned=True)
        pool = self._pool
        if pool is None or pool.closed or pool.dead_worker() is not None:
            if pool is not None:
                self._pool_finalizer()
            pool = self._pool = _Pool(self, self._base_seed())
            # the finalizer holds the pool, not the loader: collecting the loader stops it
            self._pool_finalizer = weakref.finalize(self, _Pool.shutdown, pool)
        return _WorkerIter(self, tasks, pool, owned=False)

    def _base_seed(self) -> int:
        import numpy as np

        g = self.generator
        if g is not None:
            if isinstance(g, np.random.Generator):
                return int(g.integers(0, 2**31))
            # keyed by the generator's state without advancing it, so the shuffle a
            # sampan.Generator gives does not depend on whether there are workers
            return int(np.random.default_rng([g.seed, g.counter, 1]).integers(0, 2**31))
        if self.seed is not None:
            return int(self.seed) * 1000 + getattr(self.sampler, "epoch", 0)
        return int(np.random.default_rng().integers(0, 2**31))

    def close(self) -> None:
        """Stop persistent workers now (garbage collection of the loader also does).

        Example::

            >>> loader.close()
        """
        if self._pool_finalizer is not None:
            self._pool_finalizer()
        self._pool = None


class _SingleIter:
    """Loads each batch in the calling thread."""

    def __init__(self, loader: DataLoader):
        self._fetcher = loader._fetcher()
        self._tasks = loader._tasks()

    def __iter__(self):
        return self

    def __next__(self):
        if self._tasks is None:
            batch = _worker.fetch(self._fetcher, None)
            if batch is _worker._End:
                raise StopIteration
            return batch
        return _worker.fetch(self._fetcher, next(self._tasks))


class _Pool:
    """The workers and queues of one epoch; knows nothing of the iterator that owns it."""

    def __init__(self, loader: DataLoader, base_seed: int):
        self.mode = loader.worker_mode
        n = loader.num_workers
        if self.mode == "process":
            ctx = loader.mp_context
            if ctx is None or isinstance(ctx, str):
                methods = multiprocessing.get_all_start_methods()
                name = ctx or ("forkserver" if "forkserver" in methods else "spawn")
                ctx = multiprocessing.get_context(name)
                if name == "forkserver":
                    # modules the server imports once are already there in every worker it
                    # forks; this only takes effect if the server is not running yet
                    ctx.set_forkserver_preload(["__main__", "numpy", "sampan.data"])
            self.done = ctx.Event()
            # one reply pipe per worker (see _worker._Sender): a worker that dies poisons
            # only its own, and its end closing shows here as end of file
            pipes = [ctx.Pipe(duplex=False) for _ in range(n)]
            self.readers = [r for r, _ in pipes]
            outs = [w for _, w in pipes]
            self.results = None
            self.index_queues = [ctx.Queue() for _ in range(n)]
            # shared memory, one slot per worker, written before each task: what a worker
            # that dies was loading, even if its last replies died with it in the pipe buffer
            self.busy = ctx.RawArray("q", [-1] * n)
            make = ctx.Process
        else:
            self.done = threading.Event()
            self.results = queue.Queue()
            outs = [self.results] * n
            self.readers = []
            self.index_queues = [queue.Queue() for _ in range(n)]
            self.busy = [-1] * n
            make = threading.Thread
        self.workers = []
        self.closed = False
        self.epoch = 0  # epochs served (persistent pools serve several)
        self.next_seq = 0
        self._open = list(self.readers)  # reply pipes not at end of file yet
        self._pending = collections.deque()  # replies read off a pipe, not yet taken
        try:
            for wid in range(n):
                args = (loader._fetcher(), self.index_queues[wid], outs[wid], self.done, wid, n,
                        base_seed + wid, loader.worker_init_fn, self.mode, self.busy)
                w = make(target=_worker.worker_loop, args=args, daemon=True,
                         name=f"sampan-data-worker-{wid}")
                w.start()
                self.workers.append(w)
                if self.mode == "process":
                    outs[wid].close()  # the worker holds its own copy now
        except Exception as e:
            if self.mode == "process":
                for out in outs[len(self.workers):]:  # the failed worker's and the rest
                    out.close()
            self.shutdown()
            if self.mode == "process" and isinstance(e, (pickle.PicklingError, AttributeError,
                                                         TypeError)):
                raise DataLoaderWorkerError(
                    "DataLoader: cannot start process workers: the dataset, collate_fn and "
                    f"worker_init_fn must be picklable ({type(e).__name__}: {e}); define them "
                    "at module level, or use worker_mode='thread'") from e
            raise

    def get(self, timeout: float):
        """The next reply of any worker, waiting up to `timeout` s (queue.Empty if none)."""
        if self.mode == "thread":
            return self.results.get(timeout=timeout)
        if not self._pending:
            if self._open:
                ready = _mp_connection.wait(self._open, timeout)
            else:
                ready = []
                time.sleep(timeout)
            for r in ready:
                try:
                    self._pending.append(r.recv_bytes())
                except (EOFError, OSError):  # its worker ended: dead_worker() says how
                    self._open.remove(r)
        if not self._pending:
            raise queue.Empty
        return self._pending.popleft()

    def dead_worker(self):
        """(id, exit code) of a worker that ended without being told to, else None.

        A thread has no exit code (None): it ends early only when something that is not
        an Exception (a KeyboardInterrupt, say) escaped the dataset.
        """
        if self.done.is_set():
            return None
        for wid, w in enumerate(self.workers):
            if not w.is_alive():
                return wid, (w.exitcode if self.mode == "process" else None)
        return None

    def shutdown(self, patience: float = _JOIN_S):
        """Stop the workers: each gets up to `patience` s in all to finish and exit.

        Process workers still running after that are terminated (killed if they ignore
        SIGTERM). A thread cannot be stopped from outside: one still inside the dataset
        is left to finish its task (it is a daemon and exits right after, seeing `done`).
        """
        if self.closed:
            return
        self.closed = True
        self.done.set()
        for r in self.readers:  # a worker writing to a pipe no one reads stops at once
            r.close()
        for q in self.index_queues:
            with contextlib.suppress(OSError, ValueError):  # a closed queue: worker gone
                q.put(None)
        deadline = time.monotonic() + patience
        for w in self.workers:
            w.join(max(0.0, deadline - time.monotonic()))
        if self.mode == "process":
            stuck = [w for w in self.workers if w.is_alive()]
            for w in stuck:
                w.terminate()
            for w in stuck:
                w.join(_KILL_S)
                if w.is_alive():
                    w.kill()
                    w.join(_KILL_S)
            for q in self.index_queues:
                q.cancel_join_thread()
                q.close()


class _WorkerIter:
    """Hands tasks to workers round-robin and yields their batches in task order."""

    def __init__(self, loader: DataLoader, tasks, pool: _Pool, owned: bool):
        self._loader = loader
        self._tasks = tasks
        self._n = loader.num_workers
        self._max_inflight = loader.prefetch_factor * self._n
        self._timeout = loader.timeout
        self._pool = pool
        # an epoch's own pool stops with its iterator; persistent workers outlive it
        self._finalizer = weakref.finalize(self, _Pool.shutdown, pool) if owned else None
        # sequence numbers run on across the epochs of a persistent pool: a reply older
        # than this epoch's first task (an abandoned epoch's) is dropped on arrival
        pool.epoch += 1
        self._epoch = pool.epoch
        self._first_seq = self._send_seq = self._recv_seq = pool.next_seq
        self._task_of = {}  # seq -> (worker id, task), for error messages
        self._ready = {}  # seq -> reply that arrived early
        self._death = None  # (worker id, error, seq it died on or None) once one has died
        self._live = set(range(self._n))  # workers of an iterable dataset not yet dry
        self._exhausted = False
        self._rr = 0
        for _ in range(self._max_inflight):
            if not self._dispatch():
                break

    def __iter__(self):
        return self

    def _dispatch(self) -> bool:
        if self._exhausted:
            return False
        if self._tasks is None:
            if not self._live:
                self._exhausted = True
                return False
            # iterable datasets: a worker in turn, skipping those known to be dry
            while True:
                wid = self._rr % self._n
                self._rr += 1
                if wid in self._live:
                    break
            task = None
            sent = self._epoch  # an iterable dataset's workers restart their stream per epoch
        else:
            try:
                task = next(self._tasks)
            except StopIteration:
                self._exhausted = True
                return False
            wid = self._send_seq % self._n
            sent = task
        self._task_of[self._send_seq] = (wid, task)
        self._pool.index_queues[wid].put((self._send_seq, sent))
        self._send_seq += 1
        self._pool.next_seq = self._send_seq
        return True

    def _receive(self):
        """Block until the reply for `self._recv_seq` is here and return it."""
        deadline = time.monotonic() + self._timeout if self._timeout else None
        while self._recv_seq not in self._ready:
            if self._death is not None:
                wid, error, lost = self._death
                # the live workers' batches before the lost one still come, in order; a
                # batch of the dead worker's own never will (its reply may have died with it)
                if lost is None or self._recv_seq >= lost or \
                        self._task_of[self._recv_seq][0] == wid:
                    raise self._fail(error)
            wait = _worker._POLL_S
            if deadline is not None:  # wake at the deadline, not at the next poll after it
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            try:
                msg = self._pool.get(wait)
            except queue.Empty:
                if self._death is None:
                    dead = self._pool.dead_worker()
                    if dead is not None:
                        self._death = (dead[0], *self._death_error(*dead))
                        continue
                if deadline is not None and time.monotonic() >= deadline:
                    raise self._fail(self._timeout_error()) from None
                continue
            if self._pool.mode == "process":
                try:
                    msg = pickle.loads(msg)
                except Exception as e:
                    err = DataLoaderWorkerError(
                        f"DataLoader: cannot unpickle a batch from a process worker ({e})")
                    raise self._fail(err) from e
            _, seq, status, payload = msg
            if seq >= self._first_seq:
                self._ready[seq] = (status, payload)
        return self._ready.pop(self._recv_seq)

    def _timeout_error(self) -> DataLoaderWorkerError:
        wid, task = self._task_of[self._recv_seq]
        started = self._pool.busy[wid]  # the task it started last
        if started == self._recv_seq:
            why = ("the worker is still loading it (a slow or hung __getitem__, __getitems__ "
                   "or collate_fn)")
        elif started < 0:
            why = ("the worker has not started any task yet (still starting: importing the "
                   "dataset's module, or in worker_init_fn)")
        else:
            why = "the worker has not taken it up yet"
        return DataLoaderWorkerError(
            f"DataLoader timed out after {self._timeout} s waiting for "
            f"{_batch_text(self._recv_seq, task)} from worker {wid} ({self._pool.mode}): "
            f"{why}; raise the DataLoader's timeout or find what blocks",
            worker_id=wid, indices=task)

    def _death_error(self, wid, exitcode):
        """The error for a worker that ended, and the seq of the task it died on (or None)."""
        seq = self._pool.busy[wid]  # the task it started last
        if seq in self._task_of and seq not in self._ready:
            task = self._task_of[seq][1]
            what = f" while loading {_batch_text(seq, task)}"
        else:
            seq = task = None
            what = " between tasks" if self._pool.busy[wid] >= 0 else " before its first task"
        if self._pool.mode == "thread":
            return DataLoaderWorkerError(
                f"DataLoader worker {wid} (thread) ended unexpectedly{what}: a "
                "KeyboardInterrupt or another BaseException escaped the dataset or collate_fn",
                worker_id=wid, indices=task), seq
        how = f"with exit code {exitcode}"
        if exitcode is not None and exitcode < 0:
            with contextlib.suppress(ValueError):
                how += f" (signal {signal.Signals(-exitcode).name})"
        return DataLoaderWorkerError(
            f"DataLoader worker {wid} (process) exited unexpectedly {how}{what}. It was "
            "killed, ran out of memory, crashed in native code, or could not import its "
            "dataset in a fresh process (define it in a module, or use worker_mode='thread'); "
            "see the worker's stderr", worker_id=wid, indices=task), seq

    def _fail(self, error: DataLoaderWorkerError) -> DataLoaderWorkerError:
        """Stop the workers without waiting on one that hangs, then hand `error` back
        (persistent workers too: the next epoch starts fresh ones)."""
        self._pool.shutdown(_ABORT_JOIN_S)
        self.close()
        return error

    def __next__(self):
        while True:
            if self._recv_seq >= self._send_seq:
                self.close()
                raise StopIteration
            if _rec.ACTIVE:    # the consumer waiting on the workers (sampan.profiler)
                with _rec.span("wait", "data", seq=self._recv_seq):
                    status, payload = self._receive()
            else:
                status, payload = self._receive()
            wid, _ = self._task_of.pop(self._recv_seq)
            self._recv_seq += 1
            if status == "error":
                if self._tasks is None and payload.task != "worker_init_fn":
                    payload.task = None  # an iterable dataset's task is only its epoch
                raise self._fail(_worker_error(payload, self._recv_seq - 1))
            if status == "end":
                self._live.discard(wid)
                self._dispatch()
                continue
            self._dispatch()
            return _worker.from_wire(payload) if self._pool.mode == "process" else payload

    def close(self):
        """Stop the workers now (also happens at the end of the epoch and on garbage
        collection); persistent workers are the loader's and keep running."""
        if self._finalizer is not None:
            self._finalizer()


def _batch_text(seq: int, task) -> str:
    """``batch 3 (indices [12, 13, 14, 15])``: a batch as messages name it."""
    if task is None:  # an iterable dataset's batch: no indices
        return f"batch {seq}"
    if isinstance(task, (str, bytes)) or not hasattr(task, "__len__"):
        return f"batch {seq} (index {task!r})"
    items = [int(i) if hasattr(i, "__index__") else i for i in task]
    if len(items) <= _SHOWN_INDICES:
        return f"batch {seq} (indices {items})"
    head = ", ".join(map(str, items[:_SHOWN_INDICES]))
    return f"batch {seq} (indices [{head}, ...]: {len(items)} in all, see the error's .indices)"


def _worker_error(f: _worker._Failure, seq: int) -> DataLoaderWorkerError:
    init = isinstance(f.task, str) and f.task == "worker_init_fn"
    what = "in worker_init_fn" if init else f"while loading {_batch_text(seq, f.task)}"
    msg = (f"DataLoader worker {f.worker_id} ({f.mode}) raised {f.exc_type} {what}: "
           f"{f.message}\n\nTraceback in the worker:\n{f.traceback.rstrip()}")
    return DataLoaderWorkerError(msg, worker_id=f.worker_id, exc_type=f.exc_type,
                                 worker_traceback=f.traceback, indices=None if init else f.task)
