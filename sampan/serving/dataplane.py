"""The data plane of `sampan serve` (as KServe's ``DataPlane``): everything a front end
shares, between the transport (HTTP/REST in `app.py`, gRPC in `grpc_server.py`) and the
models. It holds no transport type: a front end reads a request, calls one method here
and turns what comes back (or the `RequestError` raised, whose `status` it maps) into
its own answer.

    plane.entry(name, version)          the model's `Entry` (raises `ModelNotFound`, 404)
    plane.live() / plane.ready()        the process serves / every model is ready and the
                                        server is not draining
    plane.model_ready(name, version)    that model's `ready()`
    plane.server_metadata()             {"name", "version", "extensions"}
    plane.model_metadata(name, version) name, versions, platform, inputs, outputs (+ extra)
    plane.model_config(name, version)   the serving config (batching as it runs)
    plane.metrics_text()                (Prometheus text, its content type)
    await plane.infer(name, version, body, header, codec)   one inference request
    plane.start(warmup) / plane.stop(deadline)              the batchers' and models'
                                                            lifecycle
    plane.add(name, model) / plane.remove(name, timeout)    a model comes / goes (its
                                                            in-flight requests answered)
    plane.repository_index() / load_model / unload_model    the repository API
                                                            (`repository.py`)

`infer` carries a request through: find the model (404) → count it as arriving (a
batcher waiting to fill a batch waits for it) → its body (`body` is the bytes, or an
async function giving them: the front end's reader, run once the model is known) →
`codec.decode` (the request checked against the model's inputs; in a worker thread for a
bytes body over `offload_bytes`) → its own timeout (``timeout``/``timeout_ms`` parameters) →
the batcher's `submit` (rows within ``max_batch_size``, the model's `check` on its
values, then admission: 503 while shutting down or with the queue full) → the answer or
the deadline (504) → `codec.encode`. Whatever the outcome, the request is counted on the
model's metrics (``sampan_requests_total{status}``, ``sampan_request_seconds``) and,
when it failed or per-request logs are on, logged (one JSON line: id, status, batch
size, queue/compute/total ms, error); inside `sampan.profiler.profile()` its stages go
on the profiler's timeline (`timeline.py`). A server bug is answered as a 500
`RequestError`, a cancelled request (the server's shutdown ran out of time) as a 503
that closes the connection, a client that left as `ClientGone`.

A codec is any object with ``decode(model, body, header, plans) -> protocol.Decoded``
(the request's ``id``, ``inputs`` {name: array} checked against the model's inputs,
``outputs`` {name: binary?} wanted, ``params``) and ``encode(model, decoded, results) ->
answer``; `protocol` (the REST JSON/binary bodies) is the default, and the gRPC front
end passes `grpc_codec` (its protobuf messages). `plans` is a dict kept per
model for the codec's own cache (the REST codec's parsed binary headers).

    >>> # plane = DataPlane.build({"mlp": model}); plane.start()
    >>> # body, hlen = asyncio.run(plane.infer("mlp", None, request_bytes))
"""
from __future__ import annotations

import asyncio
import itertools
import time

from . import protocol
from .. import _recorder as recorder
from .errors import ModelNotFound, RequestError
from .ops import LOG, log_request
from .timeline import Stages

_ids = itertools.count(1)


class Entry:
    """A served model with its batcher and metrics."""

    def __init__(self, model, batcher, metrics):
        self.model, self.batcher, self.metrics = model, batcher, metrics
        self.plans: dict = {}     # protocol.decode's parsed request headers (see there)


def _timed_out(fut, p, model):
    """The loop's timer for a request's deadline: 504 unless its answer came first."""
    if not fut.done():
        p.cancelled = True        # a worker that has not taken it yet drops it
        fut.set_exception(RequestError(
            f"model {model!r}: the request timed out after "
            f"{1e3 * (time.perf_counter() - p.t_enq):.1f} ms", 504))


async def _in_thread(fn, *args):
    import anyio.to_thread
    return await anyio.to_thread.run_sync(fn, *args)


class DataPlane:
    """The models of one server and the operations every front end shares (module doc).

    `entries` maps a model name to its `Entry`; `metrics` is the server's
    `metrics.Metrics` (for `metrics_text`); bodies over `offload_bytes` are decoded and
    encoded in a worker thread so that a large request does not stall the event loop."""

    def __init__(self, entries: dict, server_name="sampan", version="0", metrics=None,
                 offload_bytes=256 << 10):
        self.entries = entries
        self.server_name, self.version = server_name, version
        self.metrics = metrics
        self.offload = offload_bytes
        self.draining = False     # set by `stop`: readiness answers False from then on
        self.instances = None     # workers per model added later (None: its config's)
        self.repository = None    # a repository.ModelRepository, when the server has one

    @classmethod
    def build(cls, models: dict, instances=None, server_name="sampan", version="0",
              offload_bytes=256 << 10) -> "DataPlane":
        """A data plane over `models` ({name: ServedModel}): a `Batcher` each with
        `instances` workers (default: the model config's ``instance_count``, else 2)
        and one `Metrics` registry for all."""
        from .metrics import Metrics
        plane = cls({}, server_name, version, Metrics(), offload_bytes)
        plane.instances = instances
        for name, m in models.items():
            plane.entries[name] = plane._entry(name, m)
        return plane

    def _entry(self, name, m) -> Entry:
        from .batcher import Batcher
        inst = self.instances or int((m.config or {}).get("instance_count", 2))
        mm = self.metrics.model(name, m.gauges)
        return Entry(m, Batcher(m, inst, mm), mm)

    # ------------------------------------------------------------ lifecycle
    def start(self, warmup=True) -> None:
        """Start every model's workers (warming its clones first) and background work."""
        from .jsonarrays import warm
        warm()                    # the JSON number parser compiled before any request
        for e in list(self.entries.values()):
            e.batcher.start(warmup)
            e.model.start()

    def stop(self, deadline=None) -> None:
        """Drain: readiness turns False, the workers answer what is queued (until the
        `time.monotonic()` `deadline`, when given), then every model's `stop()` runs."""
        self.draining = True
        entries = list(self.entries.values())
        for e in entries:
            e.batcher.close(None if deadline is None else
                            max(deadline - time.monotonic(), 0.01))
        for e in entries:
            e.model.stop()

    # ------------------------------------------------------------ lookup, health, metadata
    def entry(self, name, version=None) -> Entry:
        """The `Entry` of model `name` (and `version`, when given), else `ModelNotFound`."""
        e = self.entries.get(name)
        if e is None:
            raise ModelNotFound(f"unknown model {name!r}; this server serves "
                                f"{sorted(self.entries)}")
        if version is not None and version != str(e.model.version):
            raise ModelNotFound(f"model {name!r} has no version {version!r}; its versions "
                                f"are [{e.model.version!r}]")
        return e

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return not self.draining and all(e.model.ready() for e in list(self.entries.values()))

    def model_ready(self, name, version=None) -> bool:
        return bool(self.entry(name, version).model.ready())

    def server_metadata(self) -> dict:
        ext = ["binary_tensor_data"] + (["model_repository"] if self.repository else [])
        return {"name": self.server_name, "version": self.version, "extensions": ext}

    def model_metadata(self, name, version=None) -> dict:
        return protocol.metadata(self.entry(name, version).model)

    def model_config(self, name, version=None) -> dict:
        """config.json's keys (less those starting with ``_``) and the settings the
        server runs the model with."""
        e = self.entry(name, version)
        m = e.model
        cfg = {k: v for k, v in (m.config or {}).items() if not k.startswith("_")}
        cfg.update(name=m.name, max_batch_size=m.max_batch_size,
                   instance_count=e.batcher.instances, dynamic_batching_on=e.batcher.batching)
        return cfg

    def metrics_text(self):
        """(the Prometheus text page as bytes, its content type)."""
        return self.metrics.text()

    # ------------------------------------------------------------ models coming and going
    def add(self, name, model, warmup=True) -> Entry:
        """Serve `model` as `name` from now on (its workers warmed and started first); a
        model served under that name before is replaced, not stopped (see `retire`).
        Called from a worker thread (the repository's load), not the event loop."""
        e = self._entry(name, model)
        e.batcher.start(warmup)
        model.start()
        self.entries[name] = e
        return e

    def remove(self, name, timeout=None) -> Entry | None:
        """Stop serving `name`: new requests get 404 at once; returns once its in-flight
        requests are answered (within `timeout` s) and the model stopped (`retire`)."""
        e = self.entries.pop(name, None)
        if e is not None:
            self.retire(e, timeout)
        return e

    def retire(self, e: Entry, timeout=None) -> None:
        """Answer what entry `e` holds, then free it: wait for the requests still being
        read or decoded to reach its queue, let its workers answer the queue, stop the
        model. (A request that looked the entry up in the moment it left `entries` may
        still be refused with a 503 by its closed batcher; none is left unanswered.)"""
        from .repository import wait_until_idle
        t_end = None if timeout is None else time.monotonic() + timeout
        wait_until_idle(e.batcher, 1e9 if timeout is None else timeout)
        e.batcher.close(None if t_end is None else max(t_end - time.monotonic(), 0.01))
        e.model.stop()
        if self.metrics is not None and e.model.name not in self.entries:
            self.metrics.drop(e.model.name)     # (a reload's new model keeps its gauges)

    # ------------------------------------------------------------ the repository API
    def repository_index(self, ready_only=False) -> list:
        """[{"name", "version", "state", "reason"}]: the repository's index, or the models
        served when the server has no repository."""
        if self.repository is not None:
            return self.repository.index(ready_only)
        return [{"name": n, "version": str(e.model.version),
                 "state": "READY" if e.model.ready() else "UNAVAILABLE", "reason": ""}
                for n, e in sorted(self.entries.items())]

    def load_model(self, name, parameters=None) -> None:
        """Load (or reload) repository model `name` (blocking: call it from a thread)."""
        if self.repository is None:
            raise RequestError(f"model repository: cannot load {name!r}: this server has no "
                               "model repository (start it with --model-repository DIR)", 403)
        self.repository.load(name, parameters)

    def unload_model(self, name, parameters=None) -> None:
        """Unload model `name` once its in-flight requests are answered (blocking)."""
        if self.repository is None:
            raise RequestError(f"model repository: cannot unload {name!r}: this server has "
                               "no model repository (start it with --model-repository DIR)",
                               403)
        self.repository.unload(name, parameters)

    # ------------------------------------------------------------ inference
    async def infer(self, name, version, body, header=None, codec=None):
        """One inference request (see the module doc); returns ``codec.encode``'s answer
        (for `protocol`, the default codec: the body bytes and the JSON header's length,
        None when all JSON) or raises `RequestError` (a `ModelNotFound` is neither
        counted nor logged)."""
        t0 = time.perf_counter()
        e = self.entry(name, version)
        if codec is None:
            codec = protocol
        rid, p, status, err_msg = None, None, 500, None
        tr = Stages() if recorder.ACTIVE else None      # the profiler's view (timeline.py)
        b = e.batcher
        b.arriving += 1           # a worker filling a batch waits for this one
        arriving = True
        try:
            if callable(body):
                body = await body()
            if tr is not None:
                tr.mark("read")
            big = isinstance(body, (bytes, bytearray)) and len(body) > self.offload
            if big:
                dec = await _in_thread(codec.decode, e.model, body, header, e.plans)
            elif codec is protocol:     # JSON number lists parsed by the batch's worker
                dec = protocol.decode(e.model, body, header, e.plans, defer=True)
            else:
                dec = codec.decode(e.model, body, header, e.plans)
            if tr is not None:
                tr.mark("decode")
            rid = dec.id
            tmo = protocol.timeout_s(e.model, dec.params)
            b.arriving -= 1
            arriving = False
            loop = asyncio.get_running_loop()
            p, fut = b.submit(dec.inputs, loop, tmo)
            if p.deadline is not None:
                timer = loop.call_later(max(p.deadline - time.perf_counter(), 0),
                                        _timed_out, fut, p, e.model.name)
                try:
                    results = await fut
                finally:
                    timer.cancel()
            else:
                results = await fut
            if tr is not None:
                tr.waited(p)
            if big:
                out = await _in_thread(codec.encode, e.model, dec, results)
            else:
                out = codec.encode(e.model, dec, results)
            if tr is not None:
                tr.mark("encode")
            status = 200
            return out
        except RequestError as err:
            status, err_msg = err.status, str(err)
            raise
        except asyncio.CancelledError:
            # uvicorn cancels what is still open when the graceful shutdown's time runs
            # out (--shutdown-timeout): the request ends with a 503 (and its connection
            # closes after it) instead of leaving a traceback and a bare 500
            asyncio.current_task().uncancel()
            status, err_msg = 503, "the server shut down before the request finished"
            if p is not None:
                p.cancelled = True          # a worker that has not taken it drops it
            raise RequestError(err_msg, 503, {"Connection": "close"}) from None
        except Exception as err:  # noqa: BLE001 -- a server bug: answered, counted, logged
            status, err_msg = 500, f"internal error: {type(err).__name__}: {err}"
            LOG.exception("model %r: infer failed", e.model.name)
            raise RequestError(err_msg, 500) from err
        finally:
            if arriving:
                b.arriving -= 1
            dt = time.perf_counter() - t0
            e.metrics.answered(status, dt)
            q = c = None
            batch = 0
            if p is not None and p.t_start is not None and p.t_end is not None:
                q, c, batch = p.t_start - p.t_enq, p.t_end - p.t_start, p.batch
            if tr is not None:
                tr.emit(e.model.name, rid, status, batch)
            log_request(rid or f"r{next(_ids)}", e.model.name, status, batch, q, c, dt,
                        err_msg)
