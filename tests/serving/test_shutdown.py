"""Graceful shutdown: `sampan serve` given SIGTERM with requests in flight answers every
one of them and exits 0."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def sleepy_server(tmp_path):
    d = tmp_path / "sleepy"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"kind": "test_sleepy", "delay": 0.5,
                                               "instance_count": 1}))
    log = open(tmp_path / "stderr", "w")      # a file: an unread pipe can fill up
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-m", "tests.serving._sleepy_server", "--model",
                          f"sleepy={d}", "--port", "0", "--log-level", "warning"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        line = p.stdout.readline()
        if not line:
            p.wait(30)
            pytest.fail(f"the server did not start: {(tmp_path / 'stderr').read_text()}")
        yield p, json.loads(line)["url"]
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(10)
        p.stdout.close()
        log.close()


def test_sigterm_answers_requests_in_flight_and_exits_0(sleepy_server):
    p, url = sleepy_server
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                        "data": [1.0, 2.0, 3.0, 4.0]}]}
    got = []

    def send():
        try:
            got.append(httpx.post(url + "/v2/models/sleepy/infer", json=body, timeout=30))
        except Exception as e:          # noqa: BLE001 -- the assertion shows it
            got.append(e)
    ts = [threading.Thread(target=send) for _ in range(5)]
    for t in ts:
        t.start()
    # wait until all five are accepted (queued or running) before the signal: the first
    # batch runs 0.5 s, so four queued behind it (or three, when two came in together and
    # a quarter second has passed for any late client to connect) are all still in flight;
    # a client that had not connected yet would be refused, not drained
    deadline, seen3 = time.time() + 10, None
    while time.time() < deadline:
        m = httpx.get(url + "/metrics").text
        line = [x for x in m.splitlines() if x.startswith("sampan_queue_depth")]
        depth = float(line[0].split()[-1]) if line else 0.0
        if depth >= 4:
            break
        if depth >= 3:
            seen3 = seen3 or time.time()
            if time.time() - seen3 > 0.25:
                break
        time.sleep(0.02)
    p.send_signal(signal.SIGTERM)
    for t in ts:
        t.join(30)
    assert p.wait(30) == 0
    assert len(got) == 5
    for r in got:
        assert not isinstance(r, Exception), r
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]
