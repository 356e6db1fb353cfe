"""Operations: structured JSON logs (one object per line, through `logging`) and the
per-request log line. The Prometheus metrics are in `metrics.py` (`Metrics` and
`ModelMetrics` are importable from here too).
"""
from __future__ import annotations

import json
import logging
import logging.handlers
import queue
import time

from .metrics import Metrics, ModelMetrics  # noqa: F401  (their old home)

LOG = logging.getLogger("sampan.serving")


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message and the record's `fields`."""

    def format(self, record):
        rec = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
               + f".{int(record.msecs):03d}Z", "level": record.levelname.lower(),
               "logger": record.name, "msg": record.getMessage()}
        rec.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            rec["exc"] = self.formatException(record.exc_info)
        return json.dumps(rec, default=str)


class _DroppingQueueHandler(logging.handlers.QueueHandler):
    """Hands records to the writer thread; drops them (counted) when its queue is full,
    so a slow or blocked stderr never stalls the event loop."""

    dropped = 0

    def enqueue(self, record):
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            type(self).dropped += 1

    def prepare(self, record):
        return record          # formatted by the writer thread (JsonFormatter reads fields)


_listener = None
_log_requests = True      # a line per answered request (`setup_logging(requests=...)`)


def setup_logging(level="info", stream=None, backlog=10000, requests=True):
    """Send `sampan.serving` (and uvicorn's own) logs to `stream` as JSON lines, written
    by a background thread from a bounded queue (a full queue drops lines, never blocks:
    a server whose stderr is a pipe nobody reads stalled on its 64 KiB buffer).
    `requests`: log every answered request too (False: only the failed ones; the
    server's default, ``sampan serve --log-requests`` turns it on)."""
    global _listener, _log_requests
    _log_requests = bool(requests)
    h = logging.StreamHandler(stream)
    h.setFormatter(JsonFormatter())
    if _listener is not None:
        _listener.stop()
    q: queue.Queue = queue.Queue(backlog)
    _listener = logging.handlers.QueueListener(q, h)
    _listener.start()
    qh = _DroppingQueueHandler(q)
    lvl = getattr(logging, str(level).upper(), logging.INFO)
    for name in ("sampan.serving", "uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [qh]
        lg.setLevel(lvl)
        lg.propagate = False


def flush_logging():
    """Write every queued log line (at shutdown, and for tests)."""
    global _listener
    if _listener is not None:
        _listener.stop()
        _listener.start()


def log_request(rid, model, status, batch, queue_s, compute_s, total_s, error=None):
    """The per-request log line (INFO, when request logs are on; a failure at WARNING,
    always)."""
    if status == 200:
        if not _log_requests:
            return
        lvl = logging.INFO
    else:
        lvl = logging.WARNING
    if not LOG.isEnabledFor(lvl):
        return
    f = {"request_id": rid, "model": model, "status": status, "batch_size": batch,
         "queue_ms": None if queue_s is None else round(queue_s * 1e3, 3),
         "compute_ms": None if compute_s is None else round(compute_s * 1e3, 3),
         "total_ms": round(total_s * 1e3, 3)}
    if error:
        f["error"] = error
    LOG.log(lvl, "infer", extra={"fields": f})
