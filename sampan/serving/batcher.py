"""Dynamic batching: a bounded queue per model and worker threads, one model clone each.

The event loop calls `Batcher.submit` (a few microseconds under one lock) and awaits the
asyncio future it returns; a worker thread forms a batch, runs it and hands every future
its answer through `loop.call_soon_threadsafe`, so no model code ever runs on the loop.
The hand-off costs one wake-up each way per batch, not per request: `submit` queues
and, once per turn of the event loop, one callback wakes the worker that forms the next
batch (a notify per request woke it, and made it contend for the GIL with the loop,
for every request of a burst the loop was still reading; a queue holding a full batch
or half its size wakes it at once); the answers of a batch go back in one
`call_soon_threadsafe` per loop.

How long a worker waits for a batch to fill: ``delay_policy`` "arriving" (the default)
waits, up to ``max_queue_delay_us``, only while requests are on their way (accepted by
the server, being read or parsed, not yet queued); with none arriving it dispatches at
once, so a lone client pays no delay (the queue still fills while the workers run, which
is where batches form under load). "fixed" always waits up to the delay (Triton's rule).

A batch: the oldest queued request and every later one whose inputs are compatible with
it (same names, dtypes and non-batch dims), taken in order up to ``max_batch_size`` rows.
A worker dispatches at once when the rows reach ``max_batch_size`` (or the largest of
``preferred_batch_sizes``), otherwise it waits until ``max_queue_delay_us`` after the
oldest request was queued and dispatches what it has. One worker forms a batch at a time
while the others run theirs. Batching off (no ``dynamic_batching`` in the config, or
``max_batch_size`` 0): each request runs alone, in arrival order.

Rounding down (``"round_down": true`` in ``dynamic_batching``; off by default): a model
that pads a batch up to one of a few sizes (`batch_sizes`: the program and DLRM kinds'
buckets) has the rows it pads computed like real ones (a MiniLM batch of 20 runs as 24
rows). With it on, while more requests are on their way (arriving, queued beyond the
batch, or another worker running a batch, whose clients send again when answered) a
batch is cut to the oldest requests that fit the largest of those sizes it covers
(20 -> 16) and the rest lead the next batch; a lone burst is padded as before. Off by
default because, measured (MiniLM at c=64, benchmarks/serving.py), the cut requests
left behind start the next batch early and small, which is cut again: batches fell
from ~23 to ~14 requests and the server's CPU a request rose (11.8 -> 14.4 ms).

Batches across lengths (``"pad_axis": {"axis": 1, "inputs": [...], "outputs": [...]}``
in ``dynamic_batching``; off by default): the named inputs (default: every input whose
declared shape is dynamic along that axis) may differ in their size along `axis` and
still share a batch; each request's are padded with zeros along it to the batch's longest (an
attention mask padded with zeros marks the padding, which the model ignores and
``trim_to_mask`` cuts off again), and each named output (default: none) that has the
axis is cut back to its request's own length. ``"step": k`` pads to the next multiple
of k instead (fewer distinct lengths for a program to compile); with ``"group": true``
only requests whose lengths round up to the same multiple share a batch (padding at most
k - 1 columns a row, where padding to the longest of 9..40 tokens made a batch compute
~1.6x the tokens). A request whose padded inputs disagree in length is refused (400).

A full queue (``max_queue_size`` requests) refuses at `submit` (the server answers 503);
a request whose deadline passes while queued is dropped unrun (504).

One client cannot fail another: `submit` first runs the model's `check` on the request's
values (ids inside their tables, ...) and refuses a bad one with a 400 of its own; a
batch that still fails is run again one request at a time, so each request gets its own
answer or an error about its own values, never one quoting another request's data.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque

import numpy as np

from .errors import RequestError, ServingError  # noqa: F401  (RequestError: an old home)
from .jsonarrays import resolve, resolve_all
from .timeline import batch_span

log = logging.getLogger("sampan.serving")


class Pending:
    """One queued request: its inputs, compatibility key, rows and timing."""
    __slots__ = ("inputs", "key", "rows", "fut", "loop", "t_enq", "deadline", "cancelled",
                 "t_start", "t_end", "batch")

    def __init__(self, inputs, key, rows, fut, loop, deadline):
        self.inputs, self.key, self.rows = inputs, key, rows
        self.fut, self.loop, self.deadline = fut, loop, deadline
        self.t_enq = time.perf_counter()
        self.cancelled = False
        self.t_start = self.t_end = None
        self.batch = 0


def _answer(items):
    """On the event loop: resolve futures with (result | exception)."""
    for fut, ok, value in items:
        if not fut.done():
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)


class Batcher:
    """The queue and workers of one served model (see module doc)."""

    def __init__(self, model, instances=1, metrics=None):
        cfg = model.config or {}
        db = cfg.get("dynamic_batching")
        self.model = model
        self.batching = bool(db is not None and db is not False and model.max_batch_size > 0)
        db = db if isinstance(db, dict) else {}
        self.max_rows = int(model.max_batch_size) if self.batching else 0
        self.delay = float(db.get("max_queue_delay_us", 100)) / 1e6
        pref = [int(p) for p in db.get("preferred_batch_sizes") or ()]
        self.dispatch_rows = min([self.max_rows] + ([max(pref)] if pref else []))
        rd = db.get("round_down", False)
        if not isinstance(rd, bool):
            raise ServingError(f"serving: model {model.name!r}: round_down must be true or "
                               f"false; got {rd!r}")
        sizes = getattr(model, "batch_sizes", None)
        sizes = sizes() if (rd and self.batching and sizes is not None) else None
        self._sizes = sorted(sizes) if sizes else None
        self.policy = db.get("delay_policy", "arriving")
        if self.policy not in ("arriving", "fixed"):
            raise ServingError(f"serving: model {model.name!r}: delay_policy must be "
                               f"'arriving' or 'fixed'; got {self.policy!r}")
        self.arriving = 0         # requests being read/parsed, not yet queued (loop side)
        self.max_queue = int(db.get("max_queue_size", cfg.get("max_queue_size", 256)))
        # queued requests at which `submit` wakes a worker at once rather than at the end
        # of the loop turn: a full batch, or half the queue (a long burst of reads must
        # not fill a short queue and answer 503s while the workers sleep)
        self._wake_now = max(1, min(self.dispatch_rows, self.max_queue // 2)
                             if self.batching else self.max_queue // 2)
        self.timeout = db.get("timeout_ms", cfg.get("timeout_ms"))
        self.instances = max(1, int(instances))
        self.metrics = metrics
        self._q: deque = deque()
        self._cond = threading.Condition()
        self._form = threading.Lock()
        self._closing = False
        self._wake_loop = None        # the loop a `_wake` is scheduled on (loop side)
        self._threads: list = []
        self._busy = 0            # workers running a batch (counted for round_down only)
        self.batches = 0          # batches run (any size)
        self.batched = 0          # batches of more than one request
        self.retried = 0          # failed batches run again one request at a time
        cv = getattr(model, "checks_values", None)
        self._resolve_first = True if cv is None else bool(cv())
        self._pad = _pad_axis(model, db.get("pad_axis")) if self.batching else None

    # ------------------------------------------------------------ lifecycle
    def start(self, warmup=True):
        """Make the clones (the first is the model itself), warm them, start the threads."""
        clones = [self.model] + [self.model.clone() for _ in range(self.instances - 1)]
        if warmup:
            for c in clones:
                w = getattr(c, "warmup", None)
                if w is not None:
                    w()
        for i, c in enumerate(clones):
            t = threading.Thread(target=self._work, args=(c,), daemon=True,
                                 name=f"sampan-serve-{self.model.name}-{i}")
            t.start()
            self._threads.append(t)

    def close(self, timeout=None):
        """Refuse new requests, let the workers answer every queued one, join them."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout)

    def depth(self) -> int:
        return len(self._q)

    # ------------------------------------------------------------ event-loop side
    def submit(self, inputs, loop, timeout_s=None):
        """Queue a request; returns (Pending, asyncio future of its outputs dict)."""
        rows = 0
        if self.model.max_batch_size > 0:
            rows = next(iter(inputs.values())).shape[0]
            if self.batching and rows > self.max_rows:
                raise RequestError(f"model {self.model.name!r}: a request of {rows} rows is "
                                   f"larger than max_batch_size {self.max_rows}")
        if self._resolve_first:           # the check reads values the worker would parse
            inputs = resolve(inputs)
        try:
            self.model.check(inputs)      # its values, before it can fail a batch
        except RequestError:
            raise
        except ServingError as e:
            raise RequestError(str(e), 400) from None
        if self._pad is None:
            key = tuple((k, a.dtype.str, a.shape[1:]) for k, a in sorted(inputs.items()))
        else:
            key = self._pad_key(inputs)
        fut = loop.create_future()
        if timeout_s is None and self.timeout is not None:
            timeout_s = float(self.timeout) / 1e3
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        p = Pending(inputs, key, rows, fut, loop, deadline)
        with self._cond:
            if self._closing:
                raise RequestError(f"model {self.model.name!r}: the server is shutting down",
                                   503, {"Retry-After": "1"})
            if len(self._q) >= self.max_queue:
                raise RequestError(f"model {self.model.name!r}: the queue is full "
                                   f"({self.max_queue} requests waiting); retry later",
                                   503, {"Retry-After": "1"})
            self._q.append(p)
            if len(self._q) >= self._wake_now:
                self._cond.notify()
        if self._wake_loop is not loop:     # per loop: one that ended with a wake still
            self._wake_loop = loop          # pending does not hold back another's
            loop.call_soon(self._wake)
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._q))
        return p, fut

    def _pad_key(self, inputs):
        """The compatibility key with the padded inputs' `axis` left out (their length
        checked alike)."""
        axis, names, _, step, group = self._pad
        key, length = [], None
        for k, a in sorted(inputs.items()):
            shape = a.shape[1:]
            if k in names and len(a.shape) > axis:
                n = a.shape[axis]
                if length is not None and n != length[1]:
                    raise RequestError(
                        f"model {self.model.name!r}: inputs {length[0]!r} and {k!r} must "
                        f"have the same size along axis {axis} (pad_axis); got "
                        f"{length[1]} and {n}")
                length = length or (k, n)
                shape = shape[:axis - 1] + (-(-n // step) if group else None,) + shape[axis:]
            key.append((k, a.dtype.str, shape))
        return tuple(key)

    def _wake(self):
        """On the loop, after the requests this turn queued: wake the forming worker once
        (the other workers wait for `_form`, which it releases with a batch taken)."""
        self._wake_loop = None
        with self._cond:
            self._cond.notify()

    # ------------------------------------------------------------ worker side
    def _drop_expired(self, now, out):
        """Remove cancelled and past-deadline requests from the queue (lock held)."""
        q = self._q
        if not any(p.cancelled or (p.deadline is not None and p.deadline <= now) for p in q):
            return
        keep = deque()
        for p in q:
            if p.cancelled or (p.deadline is not None and p.deadline <= now):
                out.append(p)
            else:
                keep.append(p)
        self._q = keep

    def _next_batch(self):
        """The next batch to run ([] once closing and drained), plus expired requests."""
        expired: list = []
        with self._form, self._cond:
            while True:
                self._drop_expired(time.perf_counter(), expired)
                if self._q:
                    break
                if self._closing:
                    return [], expired
                self._cond.wait()
            if not self.batching:
                return [self._q.popleft()], expired
            while True:
                first = self._q[0]
                picked, rows = [], 0
                for p in self._q:
                    if p.key == first.key and rows + p.rows <= self.max_rows:
                        picked.append(p)
                        rows += p.rows
                        if rows >= self.max_rows:
                            break
                left = first.t_enq + self.delay - time.perf_counter()
                if (rows >= self.dispatch_rows or left <= 0 or self._closing
                        or (self.policy == "arriving" and self.arriving <= 0)):
                    break
                self._cond.wait(left)
                self._drop_expired(time.perf_counter(), expired)
                if not self._q:
                    return [], expired
            if self._sizes is not None:
                picked = self._round_down(picked, rows)
            ids = {id(p) for p in picked}
            self._q = deque(p for p in self._q if id(p) not in ids)
            if self._sizes is not None:
                self._busy += 1
            return picked, expired

    def _round_down(self, picked, rows):
        """`picked` cut to the oldest requests that fit the largest batch size <= `rows`,
        when others are on their way to join the next batch (lock held; module doc)."""
        if rows in self._sizes or len(picked) < 2:
            return picked
        if not (self.arriving > 0 or len(self._q) > len(picked) or self._busy > 0):
            return picked              # nothing behind them: pad, do not leave them alone
        down = max((b for b in self._sizes if b <= rows), default=0)
        kept, r = [], 0
        for p in picked:
            if r + p.rows > down:
                break
            kept.append(p)
            r += p.rows
        return kept or picked

    def _work(self, model):
        while True:
            batch, expired = self._next_batch()
            if expired:
                self._expire(expired)
            if self.metrics is not None:
                self.metrics.queue_depth.set(len(self._q))
            if not batch:
                if self._closing and not self._q:
                    return
                continue
            if self._sizes is None:
                self._run(model, batch)
                continue
            try:
                self._run(model, batch)
            finally:
                with self._cond:
                    self._busy -= 1

    def _expire(self, reqs):
        by_loop: dict = {}
        for p in reqs:
            err = RequestError(f"model {self.model.name!r}: the request timed out after "
                               f"waiting {1e3 * (time.perf_counter() - p.t_enq):.1f} ms in "
                               "the queue; it was not run", 504)
            by_loop.setdefault(p.loop, []).append((p.fut, False, err))
        for loop, items in by_loop.items():
            _call(loop, items)

    def _values(self, batch):
        """The batch with its requests' JSON number lists parsed (`jsonarrays`: all in
        one call, the GIL released); a request whose values are refused leaves the
        batch, with its answer: (requests to run, answers)."""
        try:
            got = resolve_all([p.inputs for p in batch])
        except Exception as e:  # noqa: BLE001 -- a server bug: every request's 500
            err = RequestError(f"model {self.model.name!r}: decoding the request failed: "
                               f"{type(e).__name__}: {e}", 500)
            return [], [(p, (p.fut, False, err)) for p in batch]
        run, answers = [], []
        for p, inputs in zip(batch, got):
            if isinstance(inputs, Exception):
                answers.append((p, (p.fut, False, inputs)))
            else:
                p.inputs = inputs
                run.append(p)
        return run, answers

    def _run(self, model, batch):
        t0 = time.perf_counter()
        for p in batch:
            p.t_start = t0
            p.batch = len(batch)
        todo, answers = self._values(batch)
        if not todo:
            items = []
        elif len(todo) == 1 and (self._pad is None or self._pad[3] == 1):
            items = [self._alone(model, todo[0])]   # (pad_axis.step pads a lone one too)
        else:
            try:
                names = todo[0].inputs.keys()
                if self._pad is None:
                    joined = {k: np.concatenate([p.inputs[k] for p in todo]) for k in names}
                    lengths = None
                else:
                    joined, lengths = self._padded(todo, names)
                res = model.infer(joined)
                total = sum(p.rows for p in todo)
                items, at = [], 0
                for i, p in enumerate(todo):
                    out = {k: _rows(k, v, at, p.rows, total, self.model.name)
                           for k, v in res.items()}
                    if lengths is not None:
                        out = self._unpadded(out, lengths[i], lengths[-1])
                    items.append((p.fut, True, out))
                    at += p.rows
            except Exception as e:  # noqa: BLE001 -- one request's values may be the cause
                # The batch's error may quote any request's values, and one bad request
                # must not fail the others: run each alone, so each gets its own answer
                # or an error about its own data.
                log.warning("model %r: a batch of %d requests failed (%s); running them "
                            "one by one", self.model.name, len(todo), type(e).__name__)
                self.retried += 1
                items = [self._alone(model, p) for p in todo]
        t1 = time.perf_counter()
        for p in batch:
            p.t_end = t1
        batch_span(self.model.name, len(batch), sum(p.rows for p in batch), t0, t1)
        self.batches += 1
        self.batched += len(batch) > 1
        if self.metrics is not None:
            self.metrics.batch_size.observe(sum(max(p.rows, 1) for p in batch))
            self.metrics.batch_requests.observe(len(batch))
            self.metrics.compute.observe(t1 - t0)
            for p in batch:
                self.metrics.queue.observe(t0 - p.t_enq)
        by_loop: dict = {}
        for p, it in list(zip(todo, items)) + answers:
            by_loop.setdefault(p.loop, []).append(it)
        for loop, its in by_loop.items():
            _call(loop, its)

    def _padded(self, todo, names):
        """The batch's inputs, the padded ones zero-padded along `axis` to the longest
        request's; plus each request's length and, last, the padded length."""
        axis, pad, _, step, _ = self._pad
        padded = [k for k in names if k in pad and todo[0].inputs[k].ndim > axis]
        if not padded:
            return {k: np.concatenate([p.inputs[k] for p in todo]) for k in names}, None
        lengths = [p.inputs[padded[0]].shape[axis] for p in todo]
        top = -(-max(lengths) // step) * step
        joined = {}
        for k in names:
            if k not in padded:
                joined[k] = np.concatenate([p.inputs[k] for p in todo])
                continue
            first = todo[0].inputs[k]
            shape = list(first.shape)
            shape[0], shape[axis] = sum(p.rows for p in todo), top
            out = np.zeros(shape, first.dtype)
            at = 0
            for p in todo:
                a = p.inputs[k]
                idx = [slice(at, at + a.shape[0])] + [slice(None)] * (a.ndim - 1)
                idx[axis] = slice(0, a.shape[axis])
                out[tuple(idx)] = a
                at += a.shape[0]
            joined[k] = out
        return joined, lengths + [top]

    def _unpadded(self, out, length, top):
        """One request's outputs with the named padded outputs cut back to `length`
        along `axis` (an output without that axis, or not named, is left as it is)."""
        axis, _, outs = self._pad[:3]
        for k in outs:
            a = out.get(k)
            if a is None or np.ndim(a) <= axis:
                continue
            if a.shape[axis] != top:
                raise RequestError(
                    f"model {self.model.name!r}: output {k!r} has {a.shape[axis]} along "
                    f"axis {axis}, not the batch's padded length {top} (pad_axis.outputs)",
                    500)
            idx = [slice(None)] * a.ndim
            idx[axis] = slice(0, length)
            out[k] = a[tuple(idx)]
        return out

    def _alone(self, model, p):
        """(future, ok, outputs | error) of running one request by itself."""
        try:
            return p.fut, True, model.infer(p.inputs)
        except RequestError as e:
            return p.fut, False, e
        except Exception as e:  # noqa: BLE001 -- answered as the request's 500
            return p.fut, False, RequestError(
                f"model {self.model.name!r}: inference failed: {type(e).__name__}: {e}", 500)


def _pad_axis(model, cfg):
    """(axis, padded input names, cut output names) of ``dynamic_batching.pad_axis``, or
    None when it is absent or false; a malformed one is a `ServingError` naming it."""
    if cfg is None or cfg is False:
        return None
    where = f"serving: model {model.name!r}: dynamic_batching.pad_axis"
    if not isinstance(cfg, dict):
        raise ServingError(f"{where} must be an object {{\"axis\": 1, \"inputs\": [...], "
                           f"\"outputs\": [...]}}; got {cfg!r}")
    unknown = set(cfg) - {"axis", "inputs", "outputs", "step", "group"}
    if unknown:
        raise ServingError(f"{where}: unknown keys {sorted(unknown)}; expected axis, "
                           "inputs, outputs, step, group")
    axis = cfg.get("axis", 1)
    if not isinstance(axis, int) or isinstance(axis, bool) or axis < 1:
        raise ServingError(f"{where}.axis must be an int >= 1 (0 is the batch dim); "
                           f"got {axis!r}")
    step = cfg.get("step", 1)
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ServingError(f"{where}.step must be an int >= 1; got {step!r}")
    group = cfg.get("group", False)
    if not isinstance(group, bool):
        raise ServingError(f"{where}.group must be true or false; got {group!r}")
    ins = {t.name: t for t in model.inputs}
    outs = {t.name for t in model.outputs}
    names = cfg.get("inputs")
    if names is None:
        names = [n for n, t in ins.items()          # the inputs dynamic along it
                 if len(t.shape) > axis and t.shape[axis] in (-1, None)]
    for what, given, known in (("inputs", names, set(ins)),
                               ("outputs", cfg.get("outputs", []), outs)):
        if not isinstance(given, list) or not all(isinstance(n, str) for n in given):
            raise ServingError(f"{where}.{what} must be a list of names; got {given!r}")
        bad = sorted(set(given) - known)
        if bad:
            raise ServingError(f"{where}.{what}: {bad} are not {what} of the model; it has "
                               f"{sorted(known)}")
    if not names:
        raise ServingError(f"{where}: no input has axis {axis}")
    return axis, frozenset(names), tuple(cfg.get("outputs", [])), step, group


def _call(loop, items):
    try:
        loop.call_soon_threadsafe(_answer, items)
    except RuntimeError:      # the loop is closed: nobody waits for these answers any more
        pass


def _rows(name, v, at, n, total, model):
    a = np.asarray(v)
    if a.ndim == 0 or a.shape[0] != total:
        raise RequestError(f"model {model!r}: output {name!r} has shape {list(a.shape)}, "
                           f"which does not have the batch's {total} rows first, so the "
                           "batch cannot be split back", 500)
    return a[at:at + n]
