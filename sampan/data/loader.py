"""DataLoader: batches from a dataset, optionally loaded ahead by worker threads/processes.

Batches always come out in the sampler's order: task k goes to worker ``k % n`` and
the main side reorders replies by sequence number, keeping at most
``prefetch_factor * num_workers`` tasks in flight. Workers are shut down when an epoch
ends, when a worker fails, and when the iterator is dropped (a `break`, garbage
collection), through a `weakref.finalize` that holds no reference to the iterator.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import queue
import threading
import time
import weakref

from sampan.errors import SampanError, SampanValueError

from . import _worker
from .collate import default_collate, default_convert
from .dataset import IterableDataset
from .sampler import BatchSampler, RandomSampler, SequentialSampler

__all__ = ["DataLoader", "DataLoaderWorkerError"]

_JOIN_S = 2.0


class DataLoaderWorkerError(SampanError, RuntimeError):
    """A DataLoader worker failed; the message carries the worker's own traceback."""

    def __init__(self, message, worker_id=None, exc_type=None, worker_traceback=None):
        super().__init__(message)
        self.worker_id = worker_id
        self.exc_type = exc_type
        self.worker_traceback = worker_traceback


class DataLoader:
    """Iterate over `dataset` in batches, optionally loading ahead with workers.

    `shuffle=True` uses a `RandomSampler` seeded with `seed`: with a seed, the same
    seed gives the same batches in the same order whatever `num_workers` and
    `worker_mode` ("thread" or "process"). Process workers use `mp_context`
    ("forkserver" by default where available, else "spawn"), so the dataset and
    `collate_fn` must be picklable. `timeout` > 0 bounds the wait for one batch.

    Example::

        >>> loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, seed=0,
        ...                     num_workers=2)
        >>> for xb, yb in loader: ...
    """

    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None,
                 drop_last=False, collate_fn=None, num_workers=0, worker_mode="thread",
                 prefetch_factor=2, seed=None, timeout=0.0, worker_init_fn=None,
                 mp_context=None):
        def bad(msg):
            return SampanValueError(f"DataLoader: {msg}")

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
                sampler = RandomSampler(dataset, seed=seed) if shuffle else \
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
        return _WorkerIter(self)


class _SingleIter:
    """Loads each batch in the calling thread."""

    def __init__(self, loader: DataLoader):
        self._fetcher = loader._fetcher()
        self._tasks = loader._tasks()

    def __iter__(self):
        return self

    def __next__(self):
        if self._tasks is None:
            batch = self._fetcher.fetch()
            if batch is _worker._End:
                raise StopIteration
            return batch
        return self._fetcher.fetch(next(self._tasks))


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
            self.results = ctx.Queue()
            self.index_queues = [ctx.Queue() for _ in range(n)]
            make = ctx.Process
        else:
            self.done = threading.Event()
            self.results = queue.Queue()
            self.index_queues = [queue.Queue() for _ in range(n)]
            make = threading.Thread
        self.workers = []
        self.closed = False
        try:
            for wid in range(n):
                args = (loader._fetcher(), self.index_queues[wid], self.results, self.done, wid, n,
                        base_seed + wid, loader.worker_init_fn, self.mode)
                w = make(target=_worker.worker_loop, args=args, daemon=True,
                         name=f"sampan-data-worker-{wid}")
                w.start()
                self.workers.append(w)
        except Exception as e:
            self.shutdown()
            if self.mode == "process" and isinstance(e, (pickle.PicklingError, AttributeError,
                                                         TypeError)):
                raise DataLoaderWorkerError(
                    "DataLoader: cannot start process workers: the dataset, collate_fn and "
                    f"worker_init_fn must be picklable ({type(e).__name__}: {e}); define them "
                    "at module level, or use worker_mode='thread'") from e
            raise

    def dead_worker(self):
        """(id, exit code) of a process worker that died without being told to, else None."""
        if self.mode != "process":
            return None
        for wid, w in enumerate(self.workers):
            if w.exitcode is not None and not self.done.is_set():
                return wid, w.exitcode
        return None

    def shutdown(self):
        if self.closed:
            return
        self.closed = True
        self.done.set()
        for q in self.index_queues:
            with contextlib.suppress(OSError, ValueError):  # a closed queue: worker gone
                q.put(None)
        deadline = time.monotonic() + _JOIN_S
        for w in self.workers:
            w.join(max(0.0, deadline - time.monotonic()))
        if self.mode == "process":
            for w in self.workers:
                if w.is_alive():
                    w.terminate()
                    w.join(_JOIN_S)
            for q in [*self.index_queues, self.results]:
                q.cancel_join_thread()
                q.close()


class _WorkerIter:
    """Hands tasks to workers round-robin and yields their batches in task order."""

    def __init__(self, loader: DataLoader):
        import numpy as np

        self._loader = loader
        self._tasks = loader._tasks()
        self._n = loader.num_workers
        self._max_inflight = loader.prefetch_factor * self._n
        self._timeout = loader.timeout
        if loader.seed is not None:
            base_seed = int(loader.seed) * 1000 + getattr(loader.sampler, "epoch", 0)
        else:
            base_seed = int(np.random.default_rng().integers(0, 2**31))
        self._pool = _Pool(loader, base_seed)
        self._finalizer = weakref.finalize(self, _Pool.shutdown, self._pool)
        self._send_seq = 0
        self._recv_seq = 0
        self._task_of = {}  # seq -> (worker id, task), for error messages
        self._ready = {}  # seq -> reply that arrived early
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
        else:
            try:
                task = next(self._tasks)
            except StopIteration:
                self._exhausted = True
                return False
            wid = self._send_seq % self._n
        self._task_of[self._send_seq] = (wid, task)
        self._pool.index_queues[wid].put((self._send_seq, task))
        self._send_seq += 1
        return True

    def _receive(self):
        """Block until the reply for `self._recv_seq` is here and return it."""
        started = time.monotonic()
        while self._recv_seq not in self._ready:
            try:
                msg = self._pool.results.get(timeout=_worker._POLL_S)
            except queue.Empty:
                dead = self._pool.dead_worker()
                if dead is not None:
                    self.close()
                    raise DataLoaderWorkerError(
                        f"DataLoader worker {dead[0]} (process) exited unexpectedly with exit "
                        f"code {dead[1]} (killed, out of memory, a crash in native code, or "
                        "its dataset could not be imported in a fresh process: define it in "
                        "a module, or use worker_mode='thread'); see the worker's stderr",
                        worker_id=dead[0]) from None
                if self._timeout and time.monotonic() - started > self._timeout:
                    self.close()
                    raise DataLoaderWorkerError(
                        f"DataLoader timed out after {self._timeout} s waiting for batch "
                        f"{self._recv_seq} from worker {self._task_of[self._recv_seq][0]}"
                    ) from None
                continue
            if self._pool.mode == "process":
                try:
                    msg = pickle.loads(msg)
                except Exception as e:
                    self.close()
                    raise DataLoaderWorkerError(
                        f"DataLoader: cannot unpickle a batch from a process worker ({e})") from e
            _, seq, status, payload = msg
            self._ready[seq] = (status, payload)
        return self._ready.pop(self._recv_seq)

    def __next__(self):
        while True:
            if self._recv_seq >= self._send_seq:
                self.close()
                raise StopIteration
            status, payload = self._receive()
            wid, _ = self._task_of.pop(self._recv_seq)
            self._recv_seq += 1
            if status == "error":
                self.close()
                raise _worker_error(payload, self._recv_seq - 1)
            if status == "end":
                self._live.discard(wid)
                self._dispatch()
                continue
            self._dispatch()
            return _worker.from_wire(payload) if self._pool.mode == "process" else payload

    def close(self):
        """Stop the workers now (also happens at the end of the epoch and on garbage collection)."""
        self._finalizer()


def _worker_error(f: _worker._Failure, seq: int) -> DataLoaderWorkerError:
    what = "in worker_init_fn" if f.task == "worker_init_fn" else f"while loading batch {seq}"
    if isinstance(f.task, list) and len(f.task) <= 16:
        what += f" (indices {f.task})"
    elif f.task is not None and not isinstance(f.task, (str, list)):
        what += f" (index {f.task})"
    msg = (f"DataLoader worker {f.worker_id} ({f.mode}) raised {f.exc_type} {what}: "
           f"{f.message}\n\nTraceback in the worker:\n{f.traceback.rstrip()}")
    return DataLoaderWorkerError(msg, worker_id=f.worker_id, exc_type=f.exc_type,
                                 worker_traceback=f.traceback)
