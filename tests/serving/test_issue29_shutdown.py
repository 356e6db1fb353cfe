"""Issue 29, item 6: a client that sends headers and part of a body can neither keep
`sampan serve` alive after SIGTERM (the graceful shutdown is bounded by
--shutdown-timeout, then what is left is closed) nor hold a request forever (body reads
time out after --read-timeout with a 408). The real command runs in a subprocess on
127.0.0.1 and the client is a raw socket."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def serve(tmp_path):
    """Start ``sampan serve`` (the test kind "test_sleepy") with extra flags; yields
    a function that starts it and returns (process, host, port)."""
    procs, logs = [], []

    def start(*flags):
        d = tmp_path / "sleepy"
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(json.dumps({"kind": "test_sleepy", "delay": 0.01,
                                                   "instance_count": 1}))
        log = open(tmp_path / f"stderr{len(logs)}", "w")
        logs.append(log)
        env = dict(os.environ,
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.Popen([sys.executable, "-m", "tests.serving._sleepy_server",
                              "--model", f"sleepy={d}", "--host", "127.0.0.1", "--port", "0",
                              "--log-level", "warning", *flags],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        procs.append(p)
        line = p.stdout.readline()
        if not line:
            p.wait(30)
            pytest.fail(f"the server did not start: {(tmp_path / 'stderr0').read_text()}")
        url = json.loads(line)["url"]
        host, port = url[len("http://"):].rsplit(":", 1)
        return p, host, int(port)

    try:
        yield start
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
            p.stdout.close()
        for log in logs:
            log.close()


def _stall(host, port, body_len=200, sent=20):
    """A connection that sends the headers and `sent` bytes of a `body_len` body."""
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(b"POST /v2/models/sleepy/infer HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % body_len + b'{"inputs": [' + b" " * (sent - 12))
    return s


def test_sigterm_with_a_stalled_client_exits_within_the_shutdown_timeout(serve):
    p, host, port = serve("--shutdown-timeout", "1", "--read-timeout", "60")
    stalled = [_stall(host, port) for _ in range(2)]
    try:
        r = httpx.post(f"http://{host}:{port}/v2/models/sleepy/infer", timeout=10, json={
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                        "data": [1, 2, 3, 4]}]})
        assert r.status_code == 200                 # the others are still answered
        time.sleep(0.3)     # the server reads the stalled headers (or closes them unread)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail("sampan serve was still running 15 s after SIGTERM with a "
                        "--shutdown-timeout of 1 s")
        took = time.monotonic() - t0
        assert rc == 0 and took < 8, (rc, took)
        for s in stalled:          # each was told 503, and its connection closed
            s.settimeout(5)
            data = b""
            try:
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            except ConnectionResetError:
                pass
            assert data == b"" or data.startswith(b"HTTP/1.1 503"), data
    finally:
        for s in stalled:
            s.close()


def test_a_stalled_body_read_times_out_with_408(serve):
    p, host, port = serve("--read-timeout", "0.5")
    s = _stall(host, port)
    try:
        s.settimeout(10)
        t0 = time.monotonic()
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        assert data.startswith(b"HTTP/1.1 408"), data
        assert time.monotonic() - t0 < 5
        assert b"did not arrive" in data or s.recv(4096).find(b"did not arrive") >= 0
    finally:
        s.close()
    m = httpx.get(f"http://{host}:{port}/metrics", timeout=10).text
    assert 'sampan_request_failures_total{model="sleepy",status="408"} 1.0' in m, m
    p.send_signal(signal.SIGTERM)
    assert p.wait(15) == 0
