"""`sampan serve`: saved programs and recommendation models behind the KServe v2 / Triton
open inference protocol (HTTP/REST), with dynamic batching, health, metrics and online
embedding updates (issue 20). The server libraries are imported only when serving.

Python API (`server.py`)::

    >>> from sampan.serving import Server
    >>> s = Server({"mlp": "models/mlp"}, host="127.0.0.1", port=0).start()
    >>> s.url                                  # 'http://127.0.0.1:43121'
    >>> import tritonclient.http as http
    >>> c = http.InferenceServerClient(s.url[len("http://"):])
    >>> x = http.InferInput("x", [1, 784], "FP32"); x.set_data_from_numpy(a)
    >>> c.infer("mlp", [x]).as_numpy("output_0")
    >>> s.stop()                               # graceful: answers what it accepted

`Server(models, host, port, *, repository=None, workers=None, overrides=None,
max_body_bytes=64 MiB, log_level="warning", shutdown_timeout=30, read_timeout=60,
log_requests=False)`: `models` maps a name to a model directory (see `model.py` for its
config.json), to a custom model's class as ``"pkg.module:Class"`` (`custom.py`) or to a
`ServedModel`; `repository` adds every
subdirectory of a folder as a model; `overrides` replaces config.json keys for every
model (``{"max_batch_size": 32, "dynamic_batching": {"max_queue_delay_us": 500}}``;
``"dynamic_batching": None`` turns batching off). `start()` serves from a background
thread, `stop()` shuts down (requests still open after `shutdown_timeout` seconds are
cancelled and their connections closed), `serve()` serves in the calling thread until
SIGTERM; a request body of which nothing arrives for `read_timeout` seconds gets a 408;
`log_requests` writes a log line per answered request (failed ones are always logged).
Command line: ``sampan serve --model mlp=models/mlp --port 8000`` (`cli.py`).

gRPC (`grpc_server.py`): ``Server(..., grpc_port=0)`` (``--grpc-port``) also serves the
KServe v2 / Triton gRPC service ``inference.GRPCInferenceService`` on
``s.grpc_address``, over the same data plane: ``tritonclient.grpc`` connects as to
Triton. Repository (`repository.py`): ``Server(model_repository=DIR,
allow_model_control=True)`` (``--model-repository DIR --allow-model-control``) serves
every folder of DIR and answers the repository API (index, load, unload) over both.

Layers: `server.py` (uvicorn, lifecycle) over `app.py` (the HTTP front end: routes, bodies,
headers, status codes) and `grpc_server.py` (the gRPC front end; its codec
`grpc_codec.py`, its messages `proto/`) over `dataplane.py` (`DataPlane`: model lookup, readiness,
metadata, infer with admission and deadlines, metrics and logs; what a gRPC front end
would share) over `batcher.py` (queues, workers, batches) and the models (`model.py`;
kinds in `program.py`, `rec.py` and `custom.py`, the user's Python classes). `protocol.py`
is the v2 REST codec and `v1.py` the v1 predict codec (TF Serving / KServe v1), both
over `jsoncodec.py` (orjson, with the standard library's results); `errors.py` the
errors (`RequestError` carries the status), `metrics.py` the Prometheus metrics,
`timeline.py` a request's stages on the profiler timeline, `padding.py` the batch
buckets.
"""

EXPORTS: list = []  # names bound on `sampan` itself (none: use sampan.serving.*)

from .dataplane import DataPlane  # noqa: E402  (imports no server library either)
from .errors import RequestError  # noqa: E402
from .model import ServedModel, ServingError, TensorSpec, load_model, register_kind  # noqa
from .server import Server  # noqa: E402  (imports no server library until it starts)

__all__ = ["DataPlane", "RequestError", "Server", "ServedModel", "ServingError",
           "TensorSpec", "load_model", "register_kind"]
