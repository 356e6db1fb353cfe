"""The KServe v2 / Triton gRPC service `inference.GRPCInferenceService` as plain async
handlers over the `DataPlane`, for both gRPC front ends (`grpc_server.py` on grpcio,
`grpc_native.py` on our own HTTP/2 server): each handler takes the request message and a
context (only ``context.time_remaining()`` is asked: the call's deadline) and returns
the answer message or raises `RequestError` (its ``grpc_code`` is the call's status).
`FrontEndBase` holds what the front ends share: the address and serving from a thread
and loop of their own.

    >>> # resp = await _Service(plane).ModelInfer(req, context)
"""
from __future__ import annotations

import asyncio
import threading

from . import grpc_codec
from .errors import ModelNotFound

SERVICE = "inference.GRPCInferenceService"
METHODS = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
           "ModelConfig", "ModelInfer", "RepositoryIndex", "RepositoryModelLoad",
           "RepositoryModelUnload")


def _version(v):
    return v or None


class _Service:
    """The handlers: each maps one message to data-plane calls and back."""

    def __init__(self, plane):
        self.plane = plane
        from .proto import inference_pb2
        self.pb = inference_pb2

    async def ServerLive(self, req, context):
        return self.pb.ServerLiveResponse(live=self.plane.live())

    async def ServerReady(self, req, context):
        return self.pb.ServerReadyResponse(ready=self.plane.ready())

    async def ModelReady(self, req, context):
        try:
            ready = self.plane.model_ready(req.name, _version(req.version))
        except ModelNotFound:
            # a repository model that is not loaded (failed, unloaded) is known: not ready
            if not any(m["name"] == req.name for m in self.plane.repository_index()) or \
                    self.plane.repository is None:
                raise
            ready = False
        return self.pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, req, context):
        m = self.plane.server_metadata()
        return self.pb.ServerMetadataResponse(name=m["name"], version=str(m["version"]),
                                              extensions=m.get("extensions", []))

    async def ModelMetadata(self, req, context):
        m = self.plane.model_metadata(req.name, _version(req.version))
        r = self.pb.ModelMetadataResponse(name=m["name"], versions=m["versions"],
                                          platform=m["platform"])
        for field in ("inputs", "outputs"):
            for t in m[field]:
                getattr(r, field).add(name=t["name"], datatype=t["datatype"],
                                      shape=t["shape"])
        return r

    async def ModelConfig(self, req, context):
        return self.pb.ModelConfigResponse(config=model_config(
            self.pb, self.plane, req.name, _version(req.version)))

    async def ModelInfer(self, req, context):
        return await self.plane.infer(req.model_name, _version(req.model_version), req,
                                      context.time_remaining(), codec=grpc_codec)

    async def RepositoryIndex(self, req, context):
        r = self.pb.RepositoryIndexResponse()
        for m in self.plane.repository_index(req.ready):
            r.models.add(**m)
        return r

    async def RepositoryModelLoad(self, req, context):
        await asyncio.to_thread(self.plane.load_model, req.model_name,
                                grpc_codec.params_of(req.parameters))
        return self.pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, req, context):
        await asyncio.to_thread(self.plane.unload_model, req.model_name,
                                grpc_codec.params_of(req.parameters))
        return self.pb.RepositoryModelUnloadResponse()


def _datatype_enum(pb, datatype):
    name = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
    return pb.DataType.Value(name) if name in pb.DataType.keys() else pb.TYPE_INVALID


def model_config(pb, plane, name, version):
    """Triton's `ModelConfig` of a served model, from `DataPlane.model_config` (the dims
    leave out the batch dim when the model batches, as Triton's do)."""
    e = plane.entry(name, version)
    m, cfg = e.model, plane.model_config(name, version)
    mbs = int(cfg.get("max_batch_size") or 0)
    mc = pb.ModelConfig(name=m.name, platform=m.platform, max_batch_size=mbs,
                        backend=str(cfg.get("kind", "")))
    for specs, field in ((m.inputs, mc.input), (m.outputs, mc.output)):
        for s in specs:
            dims = list(s.shape[1:] if mbs > 0 else s.shape)
            field.add(name=s.name, data_type=_datatype_enum(pb, s.datatype), dims=dims)
    mc.instance_group.add(name=m.name, count=int(cfg.get("instance_count", 1)))
    db = cfg.get("dynamic_batching")
    if cfg.get("dynamic_batching_on"):
        db = db if isinstance(db, dict) else {}
        mc.dynamic_batching.preferred_batch_size.extend(
            int(p) for p in db.get("preferred_batch_sizes") or ())
        mc.dynamic_batching.max_queue_delay_microseconds = int(
            db.get("max_queue_delay_us", 100))
    return mc


class FrontEndBase:
    """What both gRPC front ends share: the address, and serving from a thread and loop
    of their own (`start` / `stop`) around their `start_async` / `stop_async`."""

    impl = None

    def __init__(self, plane, host="127.0.0.1", port=0, max_message_bytes=64 << 20):
        self.plane, self.host, self.port = plane, host, int(port)
        self.max_message_bytes = int(max_message_bytes)
        self._loop = self._thread = None
        self.loop = None          # the event loop it serves on, once started
        self._ready = threading.Event()
        self._error = self._stopping = None
        self._grace = None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def start_async(self):
        raise NotImplementedError

    async def stop_async(self, grace=None) -> None:
        raise NotImplementedError

    async def _serve(self):
        await self.start_async()
        self._stopping = asyncio.Event()
        self._ready.set()
        await self._stopping.wait()
        await self.stop_async(self._grace)

    def _run(self):
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as e:  # noqa: BLE001 -- reported by start()
            self._error = e
            self._ready.set()
        finally:
            loop.close()

    def start(self, timeout=30.0) -> "FrontEndBase":
        """Serve from a background thread with its own event loop (for a data plane with
        no other front end); returns once the port is bound."""
        from .errors import ServingError
        self._thread = threading.Thread(target=self._run, name="sampan-grpc", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise ServingError(f"serving: the gRPC server did not start on {self.address}: "
                               f"{self._error or 'timed out'}")
        return self

    def stop(self, grace=None) -> None:
        """Refuse new calls, finish open ones within `grace` s, end the thread."""
        if self._thread is None or self._loop is None:
            return
        self._grace = grace
        try:
            self._loop.call_soon_threadsafe(self._stopping.set)
        except RuntimeError:            # the loop ended meanwhile
            pass
        if self._thread is not None:
            self._thread.join(None if grace is None else grace + 10)
        self._thread = None
