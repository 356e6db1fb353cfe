"""The gRPC front end of `sampan serve` (``--grpc-port``): the KServe v2 / Triton service
``inference.GRPCInferenceService``, over the same `DataPlane` as HTTP.

    ServerLive / ServerReady / ModelReady          health
    ServerMetadata / ModelMetadata / ModelConfig   metadata (ModelConfig: Triton's fields
                                                   that the server fills)
    ModelInfer                                     typed or raw tensors (`grpc_codec.py`)
    RepositoryIndex / RepositoryModelLoad / RepositoryModelUnload   the repository API

A request travels as over HTTP: `DataPlane.infer` with the gRPC codec, so the batcher,
admission (503 -> UNAVAILABLE with ``retry-after`` in the trailing metadata), deadlines
(the call's own deadline included), metrics and logs are the same; every `RequestError`
ends the call with the status its ``grpc_code`` names and its message as details.

Two servers carry it (`front_end(impl)`, ``sampan serve --grpc-impl``): ``native``, the
default, our own HTTP/2 server on asyncio (`grpc_native.py`), and ``grpcio``, the
`GrpcFrontEnd` below. Either runs on the event loop of the HTTP front end (`Server`
starts it from uvicorn's lifespan: `start_async` / `stop_async`), so one loop carries
both front ends and the batchers' counters see one thread; `start` / `stop` run it on a
thread and loop of its own instead (`FrontEndBase`). `stop(grace)` refuses new calls,
lets the open ones finish for `grace` seconds, then cancels the rest.

    >>> # fe = GrpcFrontEnd(plane, "127.0.0.1", 0).start(); fe.port; ...; fe.stop(5)
"""
from __future__ import annotations

import asyncio

from .errors import RequestError
from .grpc_service import METHODS, SERVICE, FrontEndBase, _Service
from .ops import LOG



def _import_grpc():
    try:
        import grpc
        import grpc.aio  # noqa: F401
    except ImportError:
        raise RequestError("serving: --grpc-port needs the grpcio package "
                           "(pip install grpcio protobuf)", 500) from None
    return grpc


def _guarded(grpc, fn):
    """`fn` with its `RequestError`s (and bugs) ended as gRPC statuses."""
    async def handler(req, context):
        try:
            return await fn(req, context)
        except RequestError as err:
            code, msg = getattr(grpc.StatusCode, err.grpc_code), str(err)
            meta = tuple((k.lower(), str(v)) for k, v in err.headers.items()
                         if k.lower() == "retry-after")
        except Exception as err:  # noqa: BLE001 -- a server bug: answered INTERNAL, logged
            LOG.exception("gRPC %s failed", fn.__name__)
            code, msg, meta = grpc.StatusCode.INTERNAL, \
                f"internal error: {type(err).__name__}: {err}", ()
        await context.abort(code, msg, trailing_metadata=meta)
    return handler


def handlers(grpc, plane):
    """The generic handler of the service (every method of `_Service`)."""
    svc = _Service(plane)
    pb = svc.pb
    table = {}
    for method in METHODS:
        req_cls = getattr(pb, f"{method}Request")
        table[method] = grpc.unary_unary_rpc_method_handler(
            _guarded(grpc, getattr(svc, method)), request_deserializer=req_cls.FromString,
            response_serializer=lambda m: m.SerializeToString())
    return grpc.method_handlers_generic_handler(SERVICE, table)


class GrpcFrontEnd(FrontEndBase):
    """The gRPC server on grpcio over `plane` on `host`:`port` (0: a free port; see
    module doc)."""

    impl = "grpcio"

    def __init__(self, plane, host="127.0.0.1", port=0, max_message_bytes=64 << 20):
        super().__init__(plane, host, port, max_message_bytes)
        self._server = None

    async def start_async(self) -> "GrpcFrontEnd":
        """Serve on the running event loop (the server's, beside uvicorn); returns once
        the port is bound."""
        grpc = _import_grpc()
        self.loop = asyncio.get_running_loop()
        n = self.max_message_bytes
        # so_reuseport 0: a port another process holds is an error here, not shared
        s = grpc.aio.server(options=[("grpc.max_receive_message_length", n),
                                     ("grpc.max_send_message_length", n),
                                     ("grpc.so_reuseport", 0)])
        s.add_generic_rpc_handlers((handlers(grpc, self.plane),))
        host = f"[{self.host}]" if ":" in self.host else self.host
        try:
            port = s.add_insecure_port(f"{host}:{self.port}")
        except RuntimeError as e:           # grpcio: "Failed to bind ..."
            port, why = 0, e
        else:
            why = "no address bound"
        if port == 0:
            from .errors import ServingError
            raise ServingError(f"serving: cannot listen for gRPC on {self.address} "
                               f"(--grpc-port {self.port}: in use?): {why}")
        self.port = port
        await s.start()
        self._server = s
        return self

    async def stop_async(self, grace=None) -> None:
        """Refuse new calls, let the open ones finish within `grace` s, cancel the rest."""
        s, self._server = self._server, None
        if s is not None:
            await s.stop(grace)


IMPLS = ("native", "grpcio")
DEFAULT_IMPL = "native"


def front_end(impl=None):
    """The front-end class of `impl` (``"native"``: `grpc_native.NativeGrpcFrontEnd`, our
    own HTTP/2 server, the default; ``"grpcio"``: `GrpcFrontEnd`)."""
    impl = DEFAULT_IMPL if impl is None else impl
    if impl == "grpcio":
        return GrpcFrontEnd
    if impl == "native":
        from .grpc_native import NativeGrpcFrontEnd
        return NativeGrpcFrontEnd
    from .errors import ServingError
    raise ServingError(f"serving: unknown gRPC implementation {impl!r}; choose one of "
                       f"{list(IMPLS)}")
