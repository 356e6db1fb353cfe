"""The Prometheus metrics of `sampan serve`, all in one place: one CollectorRegistry per
server (never the global one), one `ModelMetrics` a model, which the data plane (requests
answered, their time) and the batcher (queue depth, batches, queue and compute time)
update.

Metrics (label ``model``; requests also ``status``, the HTTP status code)::

    sampan_requests_total            infer requests answered
    sampan_request_failures_total    those answered with a status other than 200
    sampan_queue_depth               requests waiting in the model's queue
    sampan_batch_size                rows per batch run (histogram)
    sampan_batch_requests            requests per batch run (histogram; > 1: batched)
    sampan_queue_seconds             time a request waited before its batch ran
    sampan_compute_seconds           time a batch ran in the model
    sampan_request_seconds           time from the body being read to the answer
    sampan_model_<key>               each number a model reports in `ServedModel.gauges()`,
                                     read at every scrape (a served DLRM: snapshot_sequence,
                                     applied_deltas, refused_deltas, held_deltas)
    process_*, python_info           the process's CPU seconds, resident memory, open
                                     files, start time (prometheus_client's collectors)
"""
from __future__ import annotations

import logging
import re

LOG = logging.getLogger("sampan.serving")

_LAT = (.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ModelMetrics:
    """The children of the server's metrics bound to one model (cheap to update)."""

    def __init__(self, m, model):
        self._m, self._model = m, model
        self.queue_depth = m.depth.labels(model)
        self.batch_size = m.batch.labels(model)
        self.batch_requests = m.batch_requests.labels(model)
        self.queue = m.queue.labels(model)
        self.compute = m.compute.labels(model)
        self.total = m.total.labels(model)
        self._by_status: dict = {}

    def answered(self, status: int, seconds: float | None):
        c = self._by_status.get(status)
        if c is None:
            c = self._by_status[status] = (
                self._m.requests.labels(self._model, str(status)),
                self._m.failures.labels(self._model, str(status)) if status != 200 else None)
        c[0].inc()
        if c[1] is not None:
            c[1].inc()
        if seconds is not None:
            self.total.observe(seconds)


class Metrics:
    """Every metric of one server in its own registry; `text()` is the /metrics page."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        r = self.registry = CollectorRegistry()
        self.requests = Counter("sampan_requests", "Inference requests answered",
                                ["model", "status"], registry=r)
        self.failures = Counter("sampan_request_failures",
                                "Inference requests answered with an error status",
                                ["model", "status"], registry=r)
        self.depth = Gauge("sampan_queue_depth", "Requests waiting in the model's queue",
                           ["model"], registry=r)
        self.batch = Histogram("sampan_batch_size", "Rows per batch run", ["model"],
                               buckets=_BATCH, registry=r)
        self.batch_requests = Histogram("sampan_batch_requests", "Requests per batch run",
                                        ["model"], buckets=_BATCH, registry=r)
        self.queue = Histogram("sampan_queue_seconds", "Time a request waited in the queue",
                               ["model"], buckets=_LAT, registry=r)
        self.compute = Histogram("sampan_compute_seconds", "Time a batch ran in the model",
                                 ["model"], buckets=_LAT, registry=r)
        self.total = Histogram("sampan_request_seconds",
                               "Time from the request body read to the answer", ["model"],
                               buckets=_LAT, registry=r)

        self._gauges: dict = {}       # model name -> its gauges() callable
        r.register(_ModelGauges(self._gauges))
        # the process's CPU seconds, memory, open fds (process_*; read from /proc, so
        # Linux only) and the Python version (python_info), as every Prometheus client
        from prometheus_client import PlatformCollector, ProcessCollector
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)

    def model(self, name, gauges=None) -> ModelMetrics:
        """The metrics of model `name`; `gauges` (a callable returning {key: number})
        is read at every scrape into ``sampan_model_<key>``."""
        if gauges is not None:
            self._gauges[name] = gauges
        return ModelMetrics(self, name)

    def drop(self, name) -> None:
        """Stop reading the gauges of model `name` (it was unloaded)."""
        self._gauges.pop(name, None)

    def text(self):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


_METRIC_KEY = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*$")


class _ModelGauges:
    """A prometheus collector over the models' `gauges()`, read at scrape time."""

    def __init__(self, sources):
        self._sources = sources

    def describe(self):
        return []          # the keys are known only at scrape time

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily
        fams: dict = {}
        for model, fn in list(self._sources.items()):
            try:
                values = fn() or {}
            except Exception:  # noqa: BLE001 -- a model's bug must not break /metrics
                LOG.exception("model %r: gauges() failed", model)
                continue
            for k, v in values.items():
                if not (isinstance(k, str) and _METRIC_KEY.match(k)) or isinstance(
                        v, bool) or not isinstance(v, (int, float)):
                    continue
                f = fams.get(k)
                if f is None:
                    f = fams[k] = GaugeMetricFamily(f"sampan_model_{k}",
                                                    f"{k}, as the model reports it",
                                                    labels=["model"])
                f.add_metric([model], float(v))
        yield from fams.values()
