"""What a DataLoader worker (thread or process) runs, and what it sends back.

Protocol: the main side puts ``(seq, task)`` on a worker's own index queue (``None``
means stop); the worker answers ``(worker_id, seq, status, payload)`` on the shared
result queue. ``status`` is "ok" (payload: the batch), "end" (an iterable dataset's
worker ran dry) or "error" (payload: a `_Failure`). Process workers pickle the reply
themselves, so a batch that cannot be pickled is reported instead of vanishing inside
the queue's feeder thread.
"""
from __future__ import annotations

import contextlib
import pickle
import queue
import random
import threading
import traceback
from dataclasses import dataclass

import numpy as np

from .. import _recorder as _rec

_POLL_S = 0.2
_local = threading.local()


@dataclass(frozen=True)
class WorkerInfo:
    """Which worker is running: `id` in `range(num_workers)`, its `seed` and `dataset` copy."""

    id: int
    num_workers: int
    seed: int
    dataset: object
    mode: str


def get_worker_info():
    """The `WorkerInfo` of the calling worker, or None in the main process.

    Example::

        >>> class Shards(IterableDataset):
        ...     def __iter__(self):
        ...         info = get_worker_info()
        ...         start, step = (0, 1) if info is None else (info.id, info.num_workers)
        ...         return iter(range(start, 100, step))
    """
    return getattr(_local, "info", None)


@dataclass
class _Failure:
    """An exception raised in a worker, kept as text so it survives pickling."""

    worker_id: int
    mode: str
    exc_type: str
    message: str
    traceback: str
    task: object


class _End:
    """Stand-in for StopIteration from an iterable dataset."""


def collate(fn, samples):
    """`fn(samples)`, as a "collate" span while profiling (thread workers and the main
    thread; process workers record nothing: the profile lives in the main process)."""
    if _rec.ACTIVE:
        with _rec.span("collate", "data", samples=len(samples)
                       if hasattr(samples, "__len__") else 1):
            return fn(samples)
    return fn(samples)


def fetch(fetcher, task, worker_id=None):
    """`fetcher.fetch(task)`, as a "fetch" span while profiling."""
    if _rec.ACTIVE:
        with _rec.span("fetch", "data", worker=worker_id):
            return fetcher.fetch(task)
    return fetcher.fetch(task)


class MapFetcher:
    """Loads one task (a list of indices, or one index) from a map-style dataset."""

    def __init__(self, dataset, collate_fn, batched: bool):
        self.dataset, self.collate_fn, self.batched = dataset, collate_fn, batched

    def fetch(self, task):
        if not self.batched:
            return collate(self.collate_fn, self.dataset[task])
        getitems = getattr(self.dataset, "__getitems__", None)
        samples = getitems(task) if getitems else [self.dataset[i] for i in task]
        return collate(self.collate_fn, samples)


class IterFetcher:
    """Pulls the next batch (or sample) from its own iterator over an iterable dataset."""

    def __init__(self, dataset, collate_fn, batch_size, drop_last: bool):
        self.dataset, self.collate_fn = dataset, collate_fn
        self.batch_size, self.drop_last = batch_size, drop_last
        self._it = None
        self._done = False
        self._epoch = None

    def fetch(self, task=None):
        if task is not None and task != self._epoch:  # a new epoch: restart the stream
            self._epoch, self._it, self._done = task, None, False
        if self._done:
            return _End
        if self._it is None:
            self._it = iter(self.dataset)
        if self.batch_size is None:
            try:
                return collate(self.collate_fn, next(self._it))
            except StopIteration:
                self._done = True
                return _End
        samples = []
        for sample in self._it:
            samples.append(sample)
            if len(samples) == self.batch_size:
                break
        if len(samples) < self.batch_size:
            self._done = True
            if not samples or self.drop_last:
                return _End
        return collate(self.collate_fn, samples)


# ------------------------------------------------------------------ crossing processes
@dataclass
class _WireTensor:
    array: np.ndarray
    requires_grad: bool


def to_wire(obj):
    """Replace sampan Tensors by plain records, so batches pickle whatever Tensor holds."""
    from sampan.tensor import Tensor

    if isinstance(obj, Tensor):
        return _WireTensor(np.asarray(obj.numpy()), bool(obj.requires_grad))
    if type(obj) is dict:
        return {k: to_wire(v) for k, v in obj.items()}
    if type(obj) is list:
        return [to_wire(v) for v in obj]
    if type(obj) is tuple:
        return tuple(to_wire(v) for v in obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_wire(v) for v in obj))
    return obj


def from_wire(obj):
    """Undo `to_wire` in the main process."""
    if isinstance(obj, _WireTensor):
        from sampan.tensor import Tensor

        return Tensor(obj.array, requires_grad=obj.requires_grad)
    if type(obj) is dict:
        return {k: from_wire(v) for k, v in obj.items()}
    if type(obj) is list:
        return [from_wire(v) for v in obj]
    if type(obj) is tuple:
        return tuple(from_wire(v) for v in obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(from_wire(v) for v in obj))
    return obj


def _failure(worker_id, mode, exc, task) -> _Failure:
    return _Failure(worker_id, mode, type(exc).__name__, str(exc), traceback.format_exc(), task)


class _Sender:
    """A process worker's replies, written to its own pipe by a thread of its own.

    Each worker has a pipe of its own (not one queue shared by all, whose write lock a
    worker that dies while writing takes with it, stalling every other worker), and
    the main loop never blocks on a full pipe: it goes on loading the next task while
    the thread writes. A write the main side no longer reads (its end is closed at
    shutdown) ends the thread.
    """

    def __init__(self, conn):
        self._conn = conn
        self._box = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="sampan-data-sender")
        self._thread.start()

    def put(self, msg: bytes):
        self._box.put(msg)

    def _run(self):
        while (msg := self._box.get()) is not None:
            try:
                self._conn.send_bytes(msg)
            except OSError:  # the main side closed its end: nothing more is read
                return

    def close(self, patience: float = 5.0):
        """Flush what is queued (bounded: the main side may have stopped reading)."""
        self._box.put(None)
        self._thread.join(patience)
        with contextlib.suppress(OSError):
            self._conn.close()


def worker_loop(fetcher, index_queue, result_queue, done_event, worker_id, num_workers,
                seed, worker_init_fn, mode, busy):
    """Body of one worker: answer tasks until told to stop or the parent goes away.

    Before each task the worker writes its sequence number into ``busy[worker_id]``
    (shared memory for processes), so the main side can name the batch a dead worker
    was loading.
    """
    is_process = mode == "process"
    parent = None
    if is_process:
        import multiprocessing

        parent = multiprocessing.parent_process()
        # each process owns its global RNGs; seed them so random augmentations repeat
        np.random.seed(seed % 2**32)
        random.seed(seed)
    _local.info = WorkerInfo(worker_id, num_workers, seed, fetcher.dataset, mode)
    init_error = None
    if worker_init_fn is not None:
        try:
            worker_init_fn(worker_id)
        except Exception as e:  # noqa: BLE001 - any failure is reported to the main side
            init_error = _failure(worker_id, mode, e, "worker_init_fn")

    outbox = _Sender(result_queue) if is_process else result_queue

    def send(seq, status, payload, task=None):
        msg = (worker_id, seq, status, payload)
        if is_process:
            try:
                msg = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as e:  # noqa: BLE001 - an unpicklable batch is reported
                msg = pickle.dumps((worker_id, seq, "error", _failure(worker_id, mode, e, task)))
        outbox.put(msg)

    try:
        while not done_event.is_set():
            try:
                item = index_queue.get(timeout=_POLL_S)
            except queue.Empty:
                if parent is not None and not parent.is_alive():
                    return
                continue
            if item is None or done_event.is_set():
                return
            seq, task = item
            busy[worker_id] = seq
            if init_error is not None:
                send(seq, "error", init_error)
                continue
            try:
                batch = fetch(fetcher, task, worker_id)
            except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's, with traceback
                # a sys.exit() in the dataset would end the worker silently; report it
                send(seq, "error", _failure(worker_id, mode, e, task))
                continue
            if batch is _End:
                send(seq, "end", None)
            else:
                send(seq, "ok", to_wire(batch) if is_process else batch, task)
    except KeyboardInterrupt:
        pass
    finally:
        _local.info = None
        if is_process:
            outbox.close()
