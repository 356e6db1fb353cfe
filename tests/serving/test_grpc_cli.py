"""`sampan serve --model-repository DIR --allow-model-control --grpc-port 0` as a real
process (with each --grpc-impl): it prints its gRPC address, answers tritonclient.grpc,
and on SIGTERM answers the gRPC calls in flight and exits 0."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_cli_flags_reach_the_server(monkeypatch):
    """--model-repository, --allow-model-control and --grpc-port (off when not given)."""
    import argparse

    from sampan.serving import cli, server
    ap = argparse.ArgumentParser()
    cli.register(ap.add_subparsers())
    seen = {}

    class Fake:
        def __init__(self, models, host, port, **kw):
            seen.update(kw)

        def serve(self, on_ready=None):
            return 0
    monkeypatch.setattr(server, "Server", Fake)
    a = ap.parse_args(["serve", "--model-repository", "r", "--allow-model-control",
                       "--grpc-port", "0", "--grpc-impl", "grpcio"])
    assert a.fn(a) == 0
    assert (seen["model_repository"], seen["allow_model_control"], seen["grpc_port"],
            seen["grpc_impl"]) == ("r", True, 0, "grpcio")
    a = ap.parse_args(["serve", "--model", "m=d"])
    a.fn(a)
    assert seen["grpc_port"] is None and seen["allow_model_control"] is False
    assert seen["grpc_impl"] is None            # the default: grpc_server.DEFAULT_IMPL


@pytest.mark.slow   # a process of its own (~8 s on a loaded 2-core machine)
@pytest.mark.parametrize("impl", ["native", "grpcio"])
def test_cli_serves_grpc_and_the_repository_and_drains_on_sigterm(tmp_path, impl):
    repo = tmp_path / "repo"
    (repo / "sleepy").mkdir(parents=True)
    (repo / "sleepy" / "config.json").write_text(json.dumps(
        {"kind": "test_sleepy", "delay": 0.3, "instance_count": 1}))
    (repo / "empty").mkdir()
    log = open(tmp_path / "stderr", "w")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-m", "tests.serving._sleepy_server",
                          "--model-repository", str(repo), "--allow-model-control",
                          "--grpc-port", "0", "--grpc-impl", impl, "--port", "0",
                          "--log-level", "warning"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        line = p.stdout.readline()
        assert line, (tmp_path / "stderr").read_text()
        ready = json.loads(line)
        assert ready["models"] == ["sleepy"] and ready["grpc"].startswith("127.0.0.1:")
        c = grpcclient.InferenceServerClient(ready["grpc"])
        idx = {m.name: m.state for m in c.get_model_repository_index().models}
        assert idx == {"sleepy": "READY", "empty": "UNAVAILABLE"}
        x = grpcclient.InferInput("x", [1, 4], "FP32")
        x.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
        got = []
        ts = [threading.Thread(target=lambda: got.append(c.infer("sleepy", [x])))
              for _ in range(2)]
        for t in ts:
            t.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _queued(ready["url"]) < 1:
            time.sleep(0.01)                    # one running (one worker), one queued
        p.send_signal(signal.SIGTERM)
        for t in ts:
            t.join(30)
        assert p.wait(30) == 0
        assert len(got) == 2
        for r in got:
            np.testing.assert_array_equal(r.as_numpy("y"), [[0, 2, 4, 6]])
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(10)
        p.stdout.close()
        log.close()


def _queued(url):
    text = httpx.get(url + "/metrics").text
    line = [ln for ln in text.splitlines() if ln.startswith('sampan_queue_depth{model="sleepy"')]
    return float(line[0].split()[-1]) if line else 0.0
