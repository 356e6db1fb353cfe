"""The ASGI app (starlette): the open inference protocol's HTTP/REST routes over the
models of one server, plus ``/metrics``.

    GET  /v2/health/live                       200 while the process serves
    GET  /v2/health/ready                      200 when every model is ready (503 else)
    GET  /v2                                   server metadata
    GET  /v2/models/{name}[/versions/{v}]      model metadata
    GET  /v2/models/{name}[/versions/{v}]/ready
    GET  /v2/models/{name}[/versions/{v}]/config   the model's serving config
    POST /v2/models/{name}[/versions/{v}]/infer    JSON or binary tensors
    GET  /metrics                              Prometheus text format

The handlers only parse, queue and encode; models run in the batchers' worker threads.
Bodies above `offload_bytes` are parsed and encoded in a thread too, so a large request
does not stall the loop for the others.
"""
from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import time
import zlib

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.routing import Route

from . import protocol
from .batcher import RequestError
from .ops import log_request

_ids = itertools.count(1)


class Entry:
    """A served model with its batcher and metrics."""

    def __init__(self, model, batcher, metrics):
        self.model, self.batcher, self.metrics = model, batcher, metrics


def _json(obj, status=200, headers=None):
    return Response(json.dumps(obj, separators=(",", ":")), status,
                    headers=headers, media_type="application/json")


def _error(msg, status, headers=None):
    return _json({"error": msg}, status, headers)


async def _read_body(request, limit):
    n = request.headers.get("content-length")
    if n is not None and n.isdigit() and int(n) > limit:
        raise RequestError(f"the request body has {n} bytes, more than the server's "
                           f"limit of {limit} (max_body_bytes)", 400)
    chunks, size = [], 0
    async for c in request.stream():
        size += len(c)
        if size > limit:
            raise RequestError(f"the request body is larger than the server's limit of "
                               f"{limit} bytes (max_body_bytes)", 400)
        chunks.append(c)
    body = b"".join(chunks)
    enc = request.headers.get("content-encoding")
    if enc in ("gzip", "deflate"):
        try:
            d = zlib.decompressobj(wbits=31 if enc == "gzip" else 15)
            body = d.decompress(body, limit)
            if d.unconsumed_tail:
                raise RequestError(f"the decompressed request body is larger than the "
                                   f"server's limit of {limit} bytes (max_body_bytes)", 400)
        except (zlib.error, gzip.BadGzipFile) as e:
            raise RequestError(f"the {enc} request body cannot be decompressed: {e}",
                               400) from None
    elif enc not in (None, "identity"):
        raise RequestError(f"unsupported Content-Encoding {enc!r}; expected gzip or deflate",
                           400)
    return body


def make_app(entries: dict, server_name="sampan", version="0", max_body_bytes=64 << 20,
             offload_bytes=256 << 10, metrics=None, state=None, on_startup=(),
             on_shutdown=()):
    """The Starlette app over `entries` ({name: Entry}); `state.draining` (when given)
    makes readiness report 503 while the server shuts down."""

    def entry(request):
        name = request.path_params["name"]
        e = entries.get(name)
        if e is None:
            raise RequestError(f"unknown model {name!r}; this server serves "
                               f"{sorted(entries)}", 404)
        v = request.path_params.get("version")
        if v is not None and v != str(e.model.version):
            raise RequestError(f"model {name!r} has no version {v!r}; its versions are "
                               f"[{e.model.version!r}]", 404)
        return e

    def guarded(fn):
        async def handler(request):
            try:
                return await fn(request)
            except RequestError as err:
                return _error(str(err), err.status, err.headers)
        return handler

    async def live(request):
        return Response(status_code=200)

    async def ready(request):
        ok = not getattr(state, "draining", False) and all(
            e.model.ready() for e in entries.values())
        return Response(status_code=200 if ok else 503)

    async def server_meta(request):
        return _json({"name": server_name, "version": version,
                      "extensions": ["binary_tensor_data"]})

    async def model_meta(request):
        return _json(protocol.metadata(entry(request).model))

    async def model_ready(request):
        e = entry(request)
        return Response(status_code=200 if e.model.ready() else 400)

    async def model_config(request):
        e = entry(request)
        m = e.model
        cfg = {k: v for k, v in (m.config or {}).items() if not k.startswith("_")}
        cfg.update(name=m.name, max_batch_size=m.max_batch_size,
                   instance_count=e.batcher.instances, dynamic_batching_on=e.batcher.batching)
        return _json(cfg)

    async def infer(request):
        e = entry(request)
        t0 = time.perf_counter()
        rid, p, status = None, None, 500
        err_msg = None
        b = e.batcher
        b.arriving += 1           # a worker filling a batch waits for this one
        arriving = True
        try:
            body = await _read_body(request, max_body_bytes)
            hl = request.headers.get(protocol.HEADER)
            big = len(body) > offload_bytes
            if big:
                dec = await run_in_threadpool(protocol.decode, e.model, body, hl)
            else:
                dec = protocol.decode(e.model, body, hl)
            rid = dec.id
            tmo = protocol.timeout_s(e.model, dec.params)
            b.arriving -= 1
            arriving = False
            p, fut = b.submit(dec.inputs, asyncio.get_running_loop(), tmo)
            if p.deadline is not None:
                left = p.deadline - time.perf_counter()
                try:
                    results = await asyncio.wait_for(asyncio.shield(fut), max(left, 0))
                except asyncio.TimeoutError:
                    p.cancelled = True
                    raise RequestError(f"model {e.model.name!r}: the request timed out "
                                       f"after {1e3 * (time.perf_counter() - p.t_enq):.1f} "
                                       "ms", 504) from None
            else:
                results = await fut
            if big:
                out, hlen = await run_in_threadpool(protocol.encode, e.model, dec, results)
            else:
                out, hlen = protocol.encode(e.model, dec, results)
            headers = {} if hlen is None else {"Inference-Header-Content-Length": str(hlen)}
            status = 200
            mt = "application/json" if hlen is None else "application/octet-stream"
            resp = Response(out, 200, headers=headers, media_type=mt)
        except RequestError as err:
            status, err_msg = err.status, str(err)
            resp = _error(err_msg, err.status, err.headers)
        finally:
            if arriving:
                b.arriving -= 1
        dt = time.perf_counter() - t0
        e.metrics.answered(status, dt)
        q = c = None
        batch = 0
        if p is not None and p.t_start is not None:
            q, c, batch = p.t_start - p.t_enq, p.t_end - p.t_start, p.batch
        log_request(rid or f"r{next(_ids)}", e.model.name, status, batch, q, c, dt, err_msg)
        return resp

    async def metrics_page(request):
        body, ctype = metrics.text()
        return Response(body, 200, headers={"Content-Type": ctype})

    # infer first: starlette tries the routes in order, a regex each (24 us a request
    # when infer came last)
    routes = [Route(b + "/infer", guarded(infer), methods=["POST"]) for b in (
        "/v2/models/{name}", "/v2/models/{name}/versions/{version}")]
    routes += [Route("/v2/health/live", live), Route("/v2/health/ready", ready),
               Route("/v2", server_meta), Route("/metrics", metrics_page)]
    for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes += [Route(base, guarded(model_meta)),
                   Route(base + "/ready", guarded(model_ready)),
                   Route(base + "/config", guarded(model_config))]

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        for fn in on_startup:
            await run_in_threadpool(fn)
        try:
            yield
        finally:
            for fn in on_shutdown:
                await run_in_threadpool(fn)
    return Starlette(routes=routes, lifespan=lifespan)
