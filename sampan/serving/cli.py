"""``sampan serve``: serve model directories over the open inference protocol.

    sampan serve --model mlp=models/mlp [--model ...] [--repository DIR]
                 [--model-repository DIR [--allow-model-control]] [--grpc-port PORT]
                 [--grpc-impl native|grpcio]
                 [--host 127.0.0.1] [--port 8000] [--workers N] [--max-batch-size N]
                 [--max-queue-delay-us US] [--preferred-batch-sizes 8,32]
                 [--max-queue-size N] [--timeout-ms MS] [--no-batching]
                 [--max-body-bytes N] [--read-timeout S] [--shutdown-timeout S]
                 [--log-level info] [--log-requests]

Flags override every model's config.json. Once it listens it prints one JSON line,
``{"event": "listening", "url": ...}``, on stdout; logs are JSON lines on stderr.
SIGTERM (or Ctrl-C) stops accepting, answers every accepted request and exits 0; what
is still open after --shutdown-timeout seconds is cancelled and its connection closed.
"""
from __future__ import annotations

import json
import sys


def _model_arg(s):
    name, sep, d = s.partition("=")
    if not sep or not name or not d:
        raise ValueError(f"--model takes name=dir or name=pkg.module:Class; got {s!r}")
    return name, d


def _sizes(s):
    return [int(x) for x in s.split(",") if x.strip()]


def _seconds(s):
    v = float(s)
    if not v >= 0 or v == float("inf"):
        raise ValueError(f"expected a number of seconds >= 0; got {s!r}")
    return v


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve models over the KServe v2 / Triton protocol",
                       description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", default=[], type=_model_arg,
                   metavar="NAME=DIR",
                   help="a model directory, or a custom model's class as "
                        "NAME=pkg.module:Class (repeatable)")
    p.add_argument("--repository", help="a folder whose subdirectories are models")
    p.add_argument("--model-repository", metavar="DIR",
                   help="serve every model folder of DIR through the repository API: one "
                        "that fails to load is listed with its reason (repository.py)")
    p.add_argument("--allow-model-control", action="store_true",
                   help="allow the repository API's load and unload calls")
    p.add_argument("--grpc-port", type=int, metavar="PORT",
                   help="also serve the KServe v2 / Triton gRPC protocol on PORT (0: any "
                        "free port; off when not given)")
    p.add_argument("--grpc-impl", choices=("native", "grpcio"), default=None,
                   help="the gRPC server: native (our own HTTP/2 server on the event loop, "
                        "the default) or grpcio")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port")
    p.add_argument("--workers", type=int, help="worker threads per model (instance_count)")
    p.add_argument("--max-batch-size", type=int)
    p.add_argument("--max-queue-delay-us", type=int)
    p.add_argument("--preferred-batch-sizes", type=_sizes)
    p.add_argument("--max-queue-size", type=int)
    p.add_argument("--timeout-ms", type=float, help="default per-request timeout")
    p.add_argument("--batching", dest="batching", action="store_true", default=None,
                   help="turn dynamic batching on (with config.json's or default settings)")
    p.add_argument("--no-batching", dest="batching", action="store_false",
                   help="run each request alone")
    p.add_argument("--max-body-bytes", type=int, default=64 << 20)
    p.add_argument("--read-timeout", type=_seconds, default=60.0, metavar="S",
                   help="answer 408 and close the connection when nothing of a request "
                        "body arrives for S seconds (default 60; 0: no limit)")
    p.add_argument("--shutdown-timeout", type=_seconds, default=30.0, metavar="S",
                   help="on SIGTERM, wait at most S seconds for open requests, then cancel "
                        "them and close their connections (default 30, as Triton's "
                        "--exit-timeout-secs; 0: wait for ever)")
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-requests", action="store_true",
                   help="log a JSON line per answered request (default: only failed "
                        "requests are logged; each line costs server CPU)")
    p.set_defaults(fn=run)


def overrides_of(a) -> dict:
    """The config.json keys the flags override."""
    o: dict = {}
    if a.max_batch_size is not None:
        o["max_batch_size"] = a.max_batch_size
    db = {k: v for k, v in (("max_queue_delay_us", a.max_queue_delay_us),
                            ("preferred_batch_sizes", a.preferred_batch_sizes),
                            ("max_queue_size", a.max_queue_size),
                            ("timeout_ms", a.timeout_ms)) if v is not None}
    if a.batching is False:
        o["dynamic_batching"] = None
        for k in ("max_queue_size", "timeout_ms"):   # still apply without batching
            if k in db:
                o[k] = db[k]
    elif db or a.batching:
        o["dynamic_batching"] = db
    if a.workers is not None:
        o["instance_count"] = a.workers
    return o


def run(a) -> int:
    import faulthandler
    import signal

    from .model import ServingError
    if hasattr(signal, "SIGUSR1"):     # `kill -USR1 <pid>`: every thread's stack on stderr
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    from .server import Server
    try:
        s = Server(dict(a.model), a.host, a.port, repository=a.repository,
                   overrides=overrides_of(a), max_body_bytes=a.max_body_bytes,
                   log_level=a.log_level, log_requests=a.log_requests,
                   read_timeout=a.read_timeout or None,
                   shutdown_timeout=a.shutdown_timeout or None, grpc_port=a.grpc_port,
                   grpc_impl=a.grpc_impl,
                   model_repository=a.model_repository,
                   allow_model_control=a.allow_model_control)

        def ready(srv):
            line = {"event": "listening", "url": srv.url, "models": sorted(srv.entries)}
            if srv.grpc_address is not None:
                line["grpc"] = srv.grpc_address
            print(json.dumps(line), flush=True)
        return s.serve(on_ready=ready)
    except ServingError as e:
        print(f"sampan serve: {e}", file=sys.stderr)
        return 2
