"""The ASGI app (starlette): the open inference protocol's HTTP/REST routes over the
models of one server, plus ``/metrics``.

    GET  /v2/health/live                       200 while the process serves
    GET  /v2/health/ready                      200 when every model is ready (503 else)
    GET  /v2                                   server metadata
    GET  /v2/models/{name}[/versions/{v}]      model metadata
    GET  /v2/models/{name}[/versions/{v}]/ready
    GET  /v2/models/{name}[/versions/{v}]/config   the model's serving config
    POST /v2/models/{name}[/versions/{v}]/infer    JSON or binary tensors
    POST /v1/models/{name}[/versions/{v}]:predict  v1 REST predict (TF Serving, KServe v1;
                                                   `v1.py`)
    GET  /v1/models, /v1/models/{name}         KServe v1 model list and readiness
    GET  /metrics                              Prometheus text format
    POST /v2/repository/index                  the model repository's index ({"ready"?})
    POST /v2/repository/models/{name}/load     (re)load a repository model ({"parameters"?})
    POST /v2/repository/models/{name}/unload   unload it once its open requests are answered

This is the HTTP front end only: routes, reading bodies, headers, status codes and JSON
error bodies. What a request does (model lookup, readiness, metadata, decode, admission,
deadlines, metrics, logs) is the data plane's (`dataplane.py`), which a gRPC front end
would share; models run in the batchers' worker threads. A body of which nothing arrives
for ``read_timeout`` seconds is answered 408 and its connection closed, so a stalled
client holds no request (nor a shutdown) forever.

The infer route is a raw ASGI callable (`Infer`), reached before starlette's middleware
and router: it reads the body messages, answers with one ``http.response.start`` and
one ``http.response.body``, and builds no Request/Response objects. Under load those
objects, the middleware stack and the route regexes cost about as much event-loop CPU
as everything else a request needs; the other routes are rare and stay in starlette.
"""
from __future__ import annotations

import asyncio
import functools
import gzip
import json
import zlib

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.routing import Route

from . import jsoncodec, protocol, v1
from .dataplane import Entry  # noqa: F401  (its old home)
from .errors import ClientGone, RequestError


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
                raise ClientGone
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


def infer_path(path):
    """(name, version) of an infer path ``/v2/models/{name}[/versions/{v}]/infer``, else
    None. Example: ``infer_path("/v2/models/mlp/infer") == ("mlp", None)``"""
    return protocol.model_path(path, "/v2/models/", "/infer")


class Infer:
    """``POST /v2/models/{name}[/versions/{v}]/infer`` as a raw ASGI callable (see the
    module doc): the data plane's `infer` with this request's body reader and headers,
    and one answer from what it returns or raises."""

    def __init__(self, plane, max_body_bytes, read_timeout=None, codec=None):
        self.plane, self.limit, self.read_timeout = plane, max_body_bytes, read_timeout
        self.codec = codec                  # None: the v2 REST codec (protocol)

    async def __call__(self, scope, receive, send, name=None, version=None):
        if name is None:                    # reached through starlette's router
            pp = scope.get("path_params") or {}
            name, version = pp.get("name"), pp.get("version")
        length, enc, hl = _header(scope, "content-length", "content-encoding",
                                  protocol.HEADER)
        read = functools.partial(_read_body, receive, length, enc, self.limit,
                                 self.read_timeout)
        try:
            out, hlen = await self.plane.infer(name, version, read, hl, self.codec)
        except ClientGone:
            return                          # nobody to answer
        except RequestError as err:
            try:
                await _respond(send, err.status, _error_body(str(err)), _JSON, err.headers)
            except Exception:  # noqa: BLE001 -- the connection may be gone
                if err.status < 500:
                    raise
            return
        try:
            if hlen is None:
                await _respond(send, 200, out, _JSON)
            else:
                await _respond(send, 200, out, _OCTETS,
                               {"Inference-Header-Content-Length": hlen})
        except asyncio.CancelledError:
            # the shutdown's time ran out while the answer was written (flow control):
            # its connection is closed after it (server.py), there is nothing more to say
            asyncio.current_task().uncancel()


def _error_body(msg):
    return jsoncodec.dumps({"error": msg})


def make_app(plane, max_body_bytes=64 << 20, on_startup=(), on_shutdown=(),
             read_timeout=None):
    """The ASGI app over data plane `plane`: infer POSTs to `Infer`, the rest to a
    Starlette app (``app.starlette``); readiness reports 503 once ``plane.draining``
    (the server shuts down); an infer body of which nothing arrives for `read_timeout`
    seconds is answered 408 (None: no limit)."""

    def guarded(fn):
        async def handler(request):
            try:
                return await fn(request)
            except RequestError as err:
                return _error(str(err), err.status, err.headers)
        return handler

    def where(request):
        return request.path_params["name"], request.path_params.get("version")

    async def live(request):
        return Response(status_code=200 if plane.live() else 503)

    async def ready(request):
        return Response(status_code=200 if plane.ready() else 503)

    async def server_meta(request):
        return _json(plane.server_metadata())

    async def model_meta(request):
        return _json(plane.model_metadata(*where(request)))

    async def model_ready(request):
        return Response(status_code=200 if plane.model_ready(*where(request)) else 400)

    async def model_config(request):
        return _json(plane.model_config(*where(request)))

    async def repo_body(request):
        body = await request.body()
        try:
            j = json.loads(body) if body.strip() else {}
        except (ValueError, UnicodeDecodeError) as e:
            raise RequestError(f"the request body is not valid JSON: {e}", 400) from None
        if not isinstance(j, dict):
            raise RequestError(f"the request body must be a JSON object; got "
                               f"{type(j).__name__}", 400)
        return j

    async def repo_index(request):
        return _json(plane.repository_index(bool((await repo_body(request)).get("ready"))))

    def repo_call(fn):
        async def call(request):
            params = (await repo_body(request)).get("parameters") or {}
            if not isinstance(params, dict):
                raise RequestError("'parameters' must be an object", 400)
            await run_in_threadpool(fn, request.path_params["name"], params)
            return Response(status_code=200)
        return call

    async def metrics_page(request):
        body, ctype = plane.metrics_text()
        return Response(body, 200, headers={"Content-Type": ctype})

    infer = Infer(plane, max_body_bytes, read_timeout)
    predict = Infer(plane, max_body_bytes, read_timeout, codec=v1)

    async def v1_models(request):
        return _json(v1.models_list(plane))

    async def v1_model(request):
        return _json(v1.model_status(plane, *where(request)))
    # the infer routes stay in the router for what `app` below does not take (a GET
    # answers 405 there); POSTs reach `infer` directly
    routes = [Route(b + "/infer", infer, methods=["POST"]) for b in (
        "/v2/models/{name}", "/v2/models/{name}/versions/{version}")]
    routes += [Route("/v2/health/live", live), Route("/v2/health/ready", ready),
               Route("/v2", server_meta), Route("/metrics", metrics_page),
               Route("/v2/repository/index", guarded(repo_index), methods=["POST"]),
               Route("/v2/repository/models/{name}/load", guarded(repo_call(plane.load_model)),
                     methods=["POST"]),
               Route("/v2/repository/models/{name}/unload",
                     guarded(repo_call(plane.unload_model)), methods=["POST"])]
    routes += [Route("/v1/models", v1_models), Route("/v1/models/{name}", guarded(v1_model))]
    for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes += [Route(base, guarded(model_meta)),
                   Route(base + "/ready", guarded(model_ready)),
                   Route(base + "/config", guarded(model_config))]

    from contextlib import asynccontextmanager

    import inspect

    async def call(fn):         # a coroutine function runs on the loop (the gRPC server)
        if inspect.iscoroutinefunction(fn):
            await fn()
        else:
            await run_in_threadpool(fn)

    @asynccontextmanager
    async def lifespan(app):
        for fn in on_startup:
            await call(fn)
        try:
            yield
        finally:
            for fn in on_shutdown:
                await call(fn)
    star = Starlette(routes=routes, lifespan=lifespan)

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            where = infer_path(scope["path"])
            if where is not None:
                await infer(scope, receive, send, *where)
                return
            where = v1.predict_path(scope["path"])
            if where is not None:
                await predict(scope, receive, send, *where)
                return
        await star(scope, receive, send)
    app.starlette = star
    return app
