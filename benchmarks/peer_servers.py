"""The peers of the serving benchmark (benchmarks/serving_peers.py): MLServer 1.7.1 and
KServe 0.21.0's ModelServer, each in a virtual environment of its own that `setup`
creates (their pins conflict with each other and with sampan's), serving an ONNX file
through onnxruntime on 127.0.0.1.

    setup(root)                    the two environments (pip, once; a marker file records
                                   the versions, so a second call does nothing)
    PeerServer(kind, root, models) one server process: kind "mlserver" or "kserve",
                                   `models` {name: (onnx path, batching on?)}

MLServer runs a tiny custom runtime (`ONNX_RUNTIME` below: an `MLModel` calling
onnxruntime, MLServer's NumpyCodec for the tensors) with its adaptive batching on for a
model that batches (``max_batch_size`` 64, ``max_batch_time`` 500 us, as sampan's
``max_queue_delay_us``) and ``parallel_workers`` 0 (inference in the server process, as
sampan's worker threads; MLServer's default of one worker process adds an IPC hop).
KServe's ModelServer serves a ``kserve.Model`` calling onnxruntime; the Python
ModelServer has no batcher of its own (KServe batches in its Go agent sidecar, which is
not part of a local ModelServer), so its model runs each request alone. Both get one
onnxruntime thread per session, as sampan's workers run one BLAS thread each.

The server scripts are written from the strings below into the peer's folder (they are
this repository's code, not read from anywhere else).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

PINS = {"mlserver": ["mlserver==1.7.1", "onnxruntime"],
        "kserve": ["kserve==0.21.0", "onnxruntime"]}
DEFAULT_ROOT = os.path.join(os.path.expanduser("~"), ".cache", "sampan-bench")

ONNX_RUNTIME = '''
import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceResponse


class OnnxRuntime(MLModel):
    """An ONNX file run by onnxruntime (one thread), tensors through NumpyCodec."""

    async def load(self):
        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        self.sess = ort.InferenceSession(self.settings.parameters.uri, so,
                                         providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.sess.get_outputs()]
        return True

    async def predict(self, payload):
        feeds = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        outs = self.sess.run(self.names, feeds)
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=[
            NumpyCodec.encode_output(n, np.asarray(a)) for n, a in zip(self.names, outs)])
'''

KSERVE_SERVER = '''
import json
import sys

import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferResponse, Model, ModelServer

DT = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64",
      np.dtype(np.float64): "FP64", np.dtype(np.int32): "INT32"}


class OnnxModel(Model):
    """An ONNX file run by onnxruntime (one thread)."""

    def __init__(self, name, path):
        super().__init__(name)
        self.path = path
        self.load()

    def load(self):
        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        self.sess = ort.InferenceSession(self.path, so, providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.sess.get_outputs()]
        self.ready = True
        return True

    def predict(self, payload, headers=None, response_headers=None):
        feeds = {i.name: i.as_numpy() for i in payload.inputs}
        outs = self.sess.run(self.names, feeds)
        res = []
        binary = bool((payload.parameters or {}).get("binary_data_output", False))
        for n, a in zip(self.names, outs):
            o = InferOutput(name=n, shape=list(a.shape), datatype=DT[a.dtype])
            o.set_data_from_numpy(a, binary_data=binary)
            res.append(o)
        return InferResponse(model_name=self.name, infer_outputs=res,
                             response_id=payload.id or "")


def loopback_only():
    """KServe's RESTServer binds 0.0.0.0; the benchmark's servers bind 127.0.0.1."""
    import kserve.protocol.rest.server as rest

    class Config(rest.uvicorn.Config):
        def __init__(self, *a, **kw):
            kw["host"] = "127.0.0.1"
            super().__init__(*a, **kw)

    class Uvicorn:
        def __getattr__(self, name):
            return Config if name == "Config" else getattr(rest.uvicorn_mod, name)
    rest.uvicorn_mod = rest.uvicorn
    rest.uvicorn = Uvicorn()


if __name__ == "__main__":
    import os
    spec = json.loads(os.environ["SAMPAN_PEER_SPEC"])
    del sys.argv[1:]
    loopback_only()
    models = [OnnxModel(n, p) for n, p in spec["models"].items()]
    server = ModelServer(http_port=spec["http_port"], grpc_port=spec["grpc_port"],
                         enable_grpc=False, workers=1, enable_latency_logging=False)
    import logging
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)   # no line a request
    server.start(models)
'''


def _python():
    """An interpreter for the peers' environments: this one when MLServer supports it
    (3.9-3.12), else python3.12 / python3.11 on PATH."""
    if (3, 9) <= sys.version_info[:2] <= (3, 12):
        return sys.executable
    import shutil
    for name in ("python3.12", "python3.11", "python3.10"):
        p = shutil.which(name)
        if p:
            return p
    raise RuntimeError("peers: MLServer 1.7 needs Python 3.9-3.12; none found on PATH")


def env_python(root, kind):
    return os.path.join(root, kind, "bin", "python")


def setup(root=DEFAULT_ROOT, log=print) -> dict:
    """Create (once) the two peer environments under `root`; returns {kind: python}."""
    out = {}
    for kind, pins in PINS.items():
        d = os.path.join(root, kind)
        marker = os.path.join(d, "sampan-peer.json")
        py = env_python(root, kind)
        try:
            with open(marker) as f:
                ok = json.load(f).get("pins") == pins
        except (OSError, ValueError):
            ok = False
        if not ok:
            log(f"# peers: creating {d} ({' '.join(pins)}; pip, a few minutes once)")
            subprocess.run([_python(), "-m", "venv", d], check=True)
            subprocess.run([py, "-m", "pip", "install", "-q", *pins], check=True)
            vers = subprocess.run(
                [py, "-c", f"import importlib.metadata as m; print(m.version({kind!r}))"],
                check=True, capture_output=True, text=True).stdout.strip()
            tmp = marker + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"pins": pins, "version": vers}, f)
            os.replace(tmp, marker)
        out[kind] = py
    return out


def installed_version(root, kind):
    """The version the setup step recorded for peer `kind` (None: not set up)."""
    try:
        with open(os.path.join(root, kind, "sampan-peer.json")) as f:
            return json.load(f).get("version")
    except (OSError, ValueError):
        return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_tree_cpu_s(pid) -> float:
    """CPU seconds of `pid` and of its descendants so far (every thread's schedstat)."""
    kids: dict = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(p))
    total, todo = 0, [pid]
    while todo:
        q = todo.pop()
        todo.extend(kids.get(q, ()))
        try:
            for t in os.listdir(f"/proc/{q}/task"):
                with open(f"/proc/{q}/task/{t}/schedstat") as f:
                    total += int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


class PeerServer:
    """One peer server process (module doc); `url`, `cpu_s()`, `stop()`."""

    def __init__(self, kind, root, models, timeout=120.0):
        self.kind = kind
        self.folder = tempfile.mkdtemp(prefix=f"sampan-peer-{kind}-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        py = env_python(root, kind)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   KSERVE_LOGLEVEL="WARNING")
        if kind == "mlserver":
            cmd = self._mlserver(py, models)
        elif kind == "kserve":
            cmd = self._kserve(py, models)
        else:
            raise ValueError(f"peers: unknown peer {kind!r}; expected mlserver or kserve")
        env.update(getattr(self, "env_extra", {}))
        self.log = open(os.path.join(self.folder, "server.log"), "w+")
        self.p = subprocess.Popen(cmd, cwd=self.folder, env=env, stdout=self.log,
                                  stderr=subprocess.STDOUT)
        self._wait_ready(list(models), timeout)

    def _mlserver(self, py, models):
        with open(os.path.join(self.folder, "peer_runtimes.py"), "w") as f:
            f.write(ONNX_RUNTIME)
        with open(os.path.join(self.folder, "settings.json"), "w") as f:
            json.dump({"host": "127.0.0.1", "http_port": self.port,
                       "grpc_port": free_port(), "metrics_port": free_port(),
                       "parallel_workers": 0, "debug": False}, f)
        for name, (path, batching) in models.items():
            d = os.path.join(self.folder, name)
            os.makedirs(d)
            ms = {"name": name, "implementation": "peer_runtimes.OnnxRuntime",
                  "parameters": {"uri": os.path.abspath(path)}}
            if batching:
                ms.update(max_batch_size=64, max_batch_time=0.0005)
            with open(os.path.join(d, "model-settings.json"), "w") as f:
                json.dump(ms, f)
        mls = os.path.join(os.path.dirname(py), "mlserver")
        return [mls, "start", self.folder]

    def _kserve(self, py, models):
        script = os.path.join(self.folder, "kserve_server.py")
        with open(script, "w") as f:
            f.write(KSERVE_SERVER)
        spec = {"http_port": self.port, "grpc_port": free_port(),
                "models": {n: os.path.abspath(p) for n, (p, _) in models.items()}}
        self.env_extra = {"SAMPAN_PEER_SPEC": json.dumps(spec)}
        return [py, script]

    def _wait_ready(self, names, timeout):
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            if self.p.poll() is not None:
                break
            try:
                if all(urllib.request.urlopen(f"{self.url}/v2/models/{n}/ready",
                                              timeout=2).status == 200 for n in names):
                    return
            except OSError:
                pass
            time.sleep(0.3)
        self.log.seek(0)
        tail = self.log.read()[-3000:]
        self.stop()
        raise RuntimeError(f"peers: {self.kind} did not become ready on {self.url}: {tail}")

    def cpu_s(self):
        return process_tree_cpu_s(self.p.pid)

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()
        import shutil
        shutil.rmtree(self.folder, ignore_errors=True)
        return self.p.returncode
