"""`Server`: the models in a data plane (`dataplane.py`: their batchers, metrics, logs) and
the HTTP front end over it (`app.py`) under uvicorn, in this process.

    >>> from sampan.serving import Server
    >>> with Server({"mlp": "models/mlp"}, port=0) as s:     # port 0: a free port
    ...     print(s.url)                                      # http://127.0.0.1:PORT
    ...     # tritonclient.http.InferenceServerClient(s.url[len("http://"):]) ...

`start()` loads every model (errors raise here, naming the model), warms it, starts its
worker threads and runs uvicorn in a background thread; `stop()` shuts down gracefully:
uvicorn stops accepting, the requests already accepted are answered, then the workers
drain their queues and the models' `stop()` runs. The shutdown is bounded: requests
still open after `shutdown_timeout` seconds (default 30, as Triton's
``--exit-timeout-secs``) are cancelled and their connections closed, and a request body
of which nothing arrives for `read_timeout` seconds (default 60) is answered 408, so a
stalled client holds neither a request nor the shutdown. `serve()` does the same in the calling
(main) thread until SIGTERM/SIGINT: that is `sampan serve`.

With `grpc_port` (0: a free one) the gRPC front end (`grpc_server.py`; `grpc_impl`
``"native"``, the default, or ``"grpcio"``) serves the same
data plane on uvicorn's event loop, started after the models and stopped before they drain;
with `model_repository` every folder of that directory is loaded (`repository.py`: one
that fails is listed in the index with its reason) and, with `allow_model_control`,
loaded and unloaded while serving.

Settings: per model from its directory's ``config.json`` (see `model.py`), overridden by
`overrides` (``{"max_batch_size": 32, "dynamic_batching": {...}, "instance_count": 2}``
for every model, as the CLI flags do; ``"dynamic_batching": None`` turns batching off).
"""
from __future__ import annotations

import os
import socket
import threading
import time

from .model import ServedModel, ServingError, load_model, read_config

MAX_BODY_BYTES = 64 << 20
SHUTDOWN_TIMEOUT = 30.0   # s a graceful shutdown waits for open requests (Triton's default)
READ_TIMEOUT = 60.0       # s a request body may go without a byte arriving (nginx's default)


def repository_models(directory) -> dict:
    """{name: dir} for each subdirectory of a model repository (hidden ones skipped)."""
    if not os.path.isdir(directory):
        raise ServingError(f"serving: model repository {directory!r} is not a directory")
    return {d: os.path.join(directory, d) for d in sorted(os.listdir(directory))
            if not d.startswith(".") and os.path.isdir(os.path.join(directory, d))}


def _merge(cfg: dict, overrides: dict) -> dict:
    out = dict(cfg)
    for k, v in (overrides or {}).items():
        if k == "dynamic_batching" and isinstance(v, dict):
            base = out.get("dynamic_batching")
            out[k] = dict(base if isinstance(base, dict) else {}, **v)
        else:
            out[k] = v
    if out.get("dynamic_batching") is None:
        out.pop("dynamic_batching", None)
        if "dynamic_batching" in (overrides or {}):
            out["_batching_off"] = True     # a custom class's default must not turn it on
    return out


def _load(name, where, overrides, code_root=None):
    if isinstance(where, ServedModel):
        if overrides:
            where.config = _merge(where.config or {}, overrides)
            if "max_batch_size" in overrides:
                where.max_batch_size = int(overrides["max_batch_size"])
        return where
    directory = os.fspath(where)
    if not os.path.isdir(directory):
        from . import custom
        if custom.is_class_ref(directory):      # --model name=pkg.module:Class
            return custom.from_class_ref(name, directory, _merge({}, overrides))
    if not overrides:
        return load_model(name, directory, code_root=code_root)
    return load_model(name, directory, _merge(read_config(directory), overrides),
                      code_root=code_root)


def _have(module):
    """`module` when it can be imported, else None."""
    import importlib.util
    return module if importlib.util.find_spec(module) is not None else None


class Server:
    """The server over `models` ({name: model directory or ServedModel}); see module doc.

    Example: ``s = Server({"mlp": "m/"}).start(); ...; s.stop()``"""

    def __init__(self, models=None, host="127.0.0.1", port=0, *, repository=None,
                 workers=None, overrides=None, max_body_bytes=MAX_BODY_BYTES,
                 log_level="warning", warmup=True, shutdown_timeout=SHUTDOWN_TIMEOUT,
                 read_timeout=READ_TIMEOUT, grpc_port=None, model_repository=None,
                 allow_model_control=False, log_requests=False, grpc_impl=None):
        self.specs = dict(models or {})
        self.code_roots: dict = {}      # model name -> the repository its code may run from
        self.grpc_port = None if grpc_port is None else int(grpc_port)
        self.grpc = None          # the gRPC front end, once serving (grpc_server.py)
        self.grpc_impl = grpc_impl      # None: grpc_server.DEFAULT_IMPL
        self.model_repository = model_repository
        self.allow_model_control = bool(allow_model_control)
        self._startup_error = None
        if repository is not None:
            for n, d in repository_models(repository).items():
                if n not in self.specs:
                    self.specs[n], self.code_roots[n] = d, os.fspath(repository)
        if not self.specs and model_repository is None:
            raise ServingError("serving: no models to serve (give --model name=dir or "
                               "--repository DIR)")
        self.host, self.port = host, int(port)
        self.workers = workers
        self.overrides = dict(overrides or {})
        self.max_body_bytes = int(max_body_bytes)
        self.log_level = log_level
        self.log_requests = bool(log_requests)    # a log line per answered request
        self.warmup = warmup
        for what, v in (("shutdown_timeout", shutdown_timeout), ("read_timeout", read_timeout)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not v > 0):
                raise ServingError(f"serving: {what} must be a positive number of seconds "
                                   f"or None; got {v!r}")
        self.shutdown_timeout = None if shutdown_timeout is None else float(shutdown_timeout)
        self.read_timeout = None if read_timeout is None else float(read_timeout)
        self._t_shutdown = None
        self.entries: dict = {}
        self._uv = None
        self._thread = None
        self._sock = None
        self.plane = None         # the DataPlane, once built

    # ------------------------------------------------------------ setup
    def _build(self):
        from .app import make_app
        from .dataplane import DataPlane
        from .ops import setup_logging
        setup_logging(self.log_level, requests=self.log_requests)
        import sampan
        models = {name: _load(name, where, self.overrides, self.code_roots.get(name))
                  for name, where in self.specs.items()}
        repo = None
        if self.model_repository is not None:
            from .repository import ModelRepository
            repo = ModelRepository(self.model_repository, self.allow_model_control,
                                   self.overrides, _merge)
            for name, m in repo.load_all().items():
                models.setdefault(name, m)
        self.plane = DataPlane.build(models, self.workers, "sampan",
                                     getattr(sampan, "__version__", "0"))
        if repo is not None:
            self.plane.repository, repo.plane = repo, self.plane
        self.entries, self.metrics = self.plane.entries, self.plane.metrics
        return make_app(self.plane, self.max_body_bytes,
                        on_startup=[self._start_models, self._start_grpc],
                        on_shutdown=[self._stop_grpc, self._drain],
                        read_timeout=self.read_timeout)

    def _start_models(self):
        self.plane.start(self.warmup)

    async def _start_grpc(self):
        # on uvicorn's loop, after the models started: one loop for both front ends
        if self.grpc_port is None:
            return
        from .grpc_server import front_end
        try:
            self.grpc = await front_end(self.grpc_impl)(
                self.plane, self.host, self.grpc_port, self.max_body_bytes).start_async()
        except Exception as e:
            self._startup_error = e             # start() names it
            raise
        self.grpc_port = self.grpc.port

    async def _stop_grpc(self):
        # its open calls finish within what is left of the shutdown timeout
        if self.grpc is not None:
            left = None
            if self.shutdown_timeout is not None:
                left = max((self._t_shutdown or time.monotonic()) + self.shutdown_timeout
                           - time.monotonic(), 0.1)
            await self.grpc.stop_async(left)

    def _drain(self):
        # the workers answer what is queued within what is left of the shutdown timeout
        # (plus a second); a model still running after that is left to the process exit
        end = None
        if self.shutdown_timeout is not None:
            end = (self._t_shutdown or time.monotonic()) + self.shutdown_timeout + 1.0
        self.plane.stop(end)
        from .ops import flush_logging
        flush_logging()

    def _config(self, app):
        import uvicorn
        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say
        # they are TCP, and without it a response written as headers + body waits for the
        # client's delayed ACK (40 ms a request)
        s = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET,
                          socket.SOCK_STREAM, socket.IPPROTO_TCP)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, self.port))
        s.listen(2048)
        s.set_inheritable(True)
        self._sock = s
        self.port = s.getsockname()[1]
        # httptools (with one write per answer, see wire.py) and uvloop when installed
        # (the serve extra has both; h11 and the asyncio loop only as a fallback); no
        # proxy-headers middleware (the server reads no client address) and no
        # "server:" header on every answer
        from .wire import protocol_class
        cfg = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                             log_level=self.log_level,
                             timeout_graceful_shutdown=self.shutdown_timeout,
                             backlog=2048, http=protocol_class() or "auto",
                             loop=_have("uvloop") or "auto", proxy_headers=False,
                             server_header=False)
        self._uv = uv = uvicorn.Server(cfg)
        orig = uv.shutdown

        async def shutdown(sockets=None):
            # uvicorn waits for open requests up to timeout_graceful_shutdown, then
            # cancels them; the connections still open after that are closed here
            self._t_shutdown = time.monotonic()
            try:
                await orig(sockets=sockets)
            finally:
                for conn in list(uv.server_state.connections):
                    tr = getattr(conn, "transport", None)
                    if tr is not None and not tr.is_closing():
                        tr.close()
        uv.shutdown = shutdown
        return uv

    @property
    def grpc_address(self) -> str | None:
        """``host:port`` of the gRPC front end (None when it is off)."""
        return None if self.grpc is None else self.grpc.address

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # ------------------------------------------------------------ running
    def start(self, timeout=120.0) -> "Server":
        """Serve in a background thread; returns once the server accepts requests."""
        uv = self._config(self._build())
        err = []

        def run():
            try:
                uv.run(sockets=[self._sock])
            except BaseException as e:      # noqa: BLE001 -- reported by start()
                err.append(e)
        self._thread = threading.Thread(target=run, name="sampan-serve", daemon=True)
        self._thread.start()
        ev, t_end = threading.Event(), time.monotonic() + timeout
        while not uv.started and self._thread.is_alive() and time.monotonic() < t_end:
            ev.wait(0.01)
        if not uv.started:
            uv.should_exit = True
            why = self._startup_error or (err[0] if err else "?")
            raise ServingError(f"serving: the server did not start: {why}")
        return self

    def stop(self, timeout=60.0) -> None:
        """Graceful shutdown (see module doc); returns when the server thread has ended."""
        if self._uv is not None and self._thread is not None:
            self._uv.should_exit = True
            self._thread.join(timeout)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def serve(self, on_ready=None) -> int:
        """Serve in this thread until SIGTERM or SIGINT, then drain and return 0."""
        import signal
        uv = self._config(self._build())
        # uvicorn re-raises the signal it caught after its shutdown: a handler that ignores
        # it lets the command return 0 after the drain instead of dying by the signal
        prev = signal.signal(signal.SIGTERM, lambda *a: None)
        if on_ready is not None:
            orig = uv.startup

            async def startup(sockets=None):
                await orig(sockets=sockets)
                on_ready(self)
            uv.startup = startup
        try:
            uv.run(sockets=[self._sock])
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, prev)
            self._sock.close()
        return 0 if uv.started else 1       # 1: startup failed (the log says why)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
