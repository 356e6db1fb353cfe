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
A body of which nothing arrives for ``read_timeout`` seconds is answered 408 and its
connection closed, so a stalled client holds no request (nor a shutdown) forever.
Bodies above `offload_bytes` are parsed and encoded in a thread too, so a large request
does not stall the loop for the others.

The infer route is a raw ASGI callable (`Infer`), reached before starlette's middleware
and router: it reads the body messages, answers with one ``http.response.start`` and
one ``http.response.body``, and builds no Request/Response objects. Under load those
objects, the middleware stack and the route regexes cost about as much event-loop CPU
as everything else a request needs; the other routes are rare and stay in starlette.
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
from .ops import LOG, log_request

_ids = itertools.count(1)


class Entry:
    """A served model with its batcher and metrics."""

    def __init__(self, model, batcher, metrics):
        self.model, self.batcher, self.metrics = model, batcher, metrics
        self.plans: dict = {}     # protocol.decode's parsed request headers (see there)


def _json(obj, status=200, headers=None):
    return Response(json.dumps(obj, separators=(",", ":")), status,
                    headers=headers, media_type="application/json")


def _error(msg, status, headers=None):
    return _json({"error": msg}, status, headers)


def _header(scope, *names):
    """The first value (latin-1 str, or None) of each header in `names` (lower-case)."""
    want = {n.encode(): i for i, n in enumerate(names)}
    out = [None] * len(names)
    for k, v in scope["headers"]:
        i = want.get(k)
        if i is not None and out[i] is None:
            out[i] = v.decode("latin-1")
    return out


class _Disconnected(Exception):
    """The client went away before its request body arrived (nobody to answer)."""


class _ReadTimer:
    """Cancels the reading task once no part of its body arrived for `timeout` seconds
    (one loop timer per request, moved on only when it fires early)."""
    __slots__ = ("task", "timeout", "last", "fired", "handle", "loop")

    def __init__(self, timeout):
        self.loop = asyncio.get_running_loop()
        self.task, self.timeout = asyncio.current_task(), timeout
        self.last, self.fired = self.loop.time(), False
        self.handle = self.loop.call_at(self.last + timeout, self._fire)

    def _fire(self):
        due = self.last + self.timeout
        if self.loop.time() < due:                  # a chunk came meanwhile
            self.handle = self.loop.call_at(due, self._fire)
            return
        self.fired = True
        self.task.cancel()


async def _read_body(receive, length, enc, limit, timeout=None):
    if length is not None and length.isascii() and length.isdigit() and int(length) > limit:
        raise RequestError(f"the request body has {length} bytes, more than the server's "
                           f"limit of {limit} (max_body_bytes)", 400)
    body, chunks, size = b"", None, 0
    timer = _ReadTimer(timeout) if timeout else None
    try:
        while True:
            msg = await receive()
            if timer is not None:
                timer.last = timer.loop.time()
            if msg["type"] != "http.request":
                raise _Disconnected
            c = msg.get("body", b"")
            if c:
                size += len(c)
                if size > limit:
                    raise RequestError(f"the request body is larger than the server's "
                                       f"limit of {limit} bytes (max_body_bytes)", 400)
                if not body:
                    body = c
                else:
                    chunks = chunks or [body]
                    chunks.append(c)
            if not msg.get("more_body", False):
                break
    except asyncio.CancelledError:
        if timer is None or not timer.fired:
            raise                                   # the server's own cancel (shutdown)
        timer.task.uncancel()
        raise RequestError(f"the request body did not arrive: nothing of it came for "
                           f"{timeout:g} s (read_timeout; {size} bytes read)", 408,
                           {"Connection": "close"}) from None
    finally:
        if timer is not None:
            timer.handle.cancel()
    if chunks:
        body = b"".join(chunks)
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
    return bytes(body)


_JSON, _OCTETS = b"application/json", b"application/octet-stream"


async def _respond(send, status, body, ctype, headers=None):
    h = [(b"content-type", ctype), (b"content-length", b"%d" % len(body))]
    for k, v in (headers or {}).items():
        h.append((k.lower().encode("latin-1"), str(v).encode("latin-1")))
    await send({"type": "http.response.start", "status": status, "headers": h})
    await send({"type": "http.response.body", "body": body})


def _timed_out(fut, p, model):
    """The loop's timer for a request's deadline: 504 unless its answer came first."""
    if not fut.done():
        p.cancelled = True        # a worker that has not taken it yet drops it
        fut.set_exception(RequestError(
            f"model {model!r}: the request timed out after "
            f"{1e3 * (time.perf_counter() - p.t_enq):.1f} ms", 504))


def infer_path(path):
    """(name, version) of an infer path ``/v2/models/{name}[/versions/{v}]/infer``, else
    None. Example: ``infer_path("/v2/models/mlp/infer") == ("mlp", None)``"""
    if not (path.startswith("/v2/models/") and path.endswith("/infer")):
        return None
    parts = path[11:-6].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


class Infer:
    """``POST /v2/models/{name}[/versions/{v}]/infer`` as a raw ASGI callable (see the
    module doc): read, decode, queue on the model's batcher, await, encode, answer."""

    def __init__(self, entries, max_body_bytes, offload_bytes, read_timeout=None):
        self.entries, self.limit, self.offload = entries, max_body_bytes, offload_bytes
        self.read_timeout = read_timeout

    async def __call__(self, scope, receive, send, name=None, version=None):
        if name is None:                    # reached through starlette's router
            pp = scope.get("path_params") or {}
            name, version = pp.get("name"), pp.get("version")
        t0 = time.perf_counter()
        e = self.entries.get(name)
        if e is None or (version is not None and version != str(e.model.version)):
            msg = (f"unknown model {name!r}; this server serves {sorted(self.entries)}"
                   if e is None else f"model {name!r} has no version {version!r}; its "
                   f"versions are [{e.model.version!r}]")
            await _respond(send, 404, _error_body(msg), _JSON)
            return
        rid, p, status, err_msg = None, None, 500, None
        b = e.batcher
        b.arriving += 1           # a worker filling a batch waits for this one
        arriving = True
        try:
            length, enc, hl = _header(scope, "content-length", "content-encoding",
                                      protocol.HEADER)
            body = await _read_body(receive, length, enc, self.limit, self.read_timeout)
            big = len(body) > self.offload
            if big:
                dec = await run_in_threadpool(protocol.decode, e.model, body, hl, e.plans)
            else:
                dec = protocol.decode(e.model, body, hl, e.plans)
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
            if big:
                out, hlen = await run_in_threadpool(protocol.encode, e.model, dec, results)
            else:
                out, hlen = protocol.encode(e.model, dec, results)
            status = 200
            if hlen is None:
                await _respond(send, 200, out, _JSON)
            else:
                await _respond(send, 200, out, _OCTETS,
                               {"Inference-Header-Content-Length": hlen})
        except RequestError as err:
            status, err_msg = err.status, str(err)
            await _respond(send, err.status, _error_body(err_msg), _JSON, err.headers)
        except _Disconnected:
            status, err_msg = 499, "the client closed the connection"
        except Exception as err:  # noqa: BLE001 -- a server bug: answered, counted, logged
            status, err_msg = 500, f"internal error: {type(err).__name__}: {err}"
            LOG.exception("model %r: infer failed", e.model.name)
            try:
                await _respond(send, 500, _error_body(err_msg), _JSON)
            except Exception:  # noqa: BLE001 -- the response had already started
                pass
        except asyncio.CancelledError:
            # uvicorn cancels what is still open when the graceful shutdown's time runs
            # out (--shutdown-timeout): answer 503 and end the request (the connection
            # closes after it) instead of leaving uvicorn a traceback and a bare 500
            asyncio.current_task().uncancel()
            status, err_msg = 503, "the server shut down before the request finished"
            if p is not None:
                p.cancelled = True          # a worker that has not taken it drops it
            try:
                await _respond(send, 503, _error_body(err_msg), _JSON,
                               {"Connection": "close"})
            except Exception:  # noqa: BLE001 -- the connection may be gone
                pass
        finally:
            if arriving:
                b.arriving -= 1
            dt = time.perf_counter() - t0
            e.metrics.answered(status, dt)
            q = c = None
            batch = 0
            if p is not None and p.t_start is not None and p.t_end is not None:
                q, c, batch = p.t_start - p.t_enq, p.t_end - p.t_start, p.batch
            log_request(rid or f"r{next(_ids)}", e.model.name, status, batch, q, c, dt,
                        err_msg)


def _error_body(msg):
    return json.dumps({"error": msg}, separators=(",", ":")).encode()


def make_app(entries: dict, server_name="sampan", version="0", max_body_bytes=64 << 20,
             offload_bytes=256 << 10, metrics=None, state=None, on_startup=(),
             on_shutdown=(), read_timeout=None):
    """The ASGI app over `entries` ({name: Entry}): infer POSTs to `Infer`, the rest to
    a Starlette app (``app.starlette``); `state.draining` (when given) makes readiness
    report 503 while the server shuts down; an infer body of which nothing arrives for
    `read_timeout` seconds is answered 408 (None: no limit)."""

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

    async def metrics_page(request):
        body, ctype = metrics.text()
        return Response(body, 200, headers={"Content-Type": ctype})

    infer = Infer(entries, max_body_bytes, offload_bytes, read_timeout)
    # the infer routes stay in the router for what `app` below does not take (a GET
    # answers 405 there); POSTs reach `infer` directly
    routes = [Route(b + "/infer", infer, methods=["POST"]) for b in (
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
    star = Starlette(routes=routes, lifespan=lifespan)

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            where = infer_path(scope["path"])
            if where is not None:
                await infer(scope, receive, send, *where)
                return
        await star(scope, receive, send)
    app.starlette = star
    return app
