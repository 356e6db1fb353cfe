"""What a request costs the server (issue 32): per-request log lines only with
``--log-requests`` (failed requests always logged), the process_* metrics beside the
sampan_* ones, and one request's time on the profiler's timeline split into read,
decode, queue, compute, answer and encode."""
import io
import json
import logging
import sys

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

import sampan.profiler
from sampan.serving import Server
from sampan.serving import ops
from sampan.serving.ops import flush_logging

REF = "tests.serving._custom_classes:Affine"
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
BAD = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}


def _lines(monkeypatch, **kw):
    monkeypatch.setattr(ops, "_log_requests", ops._log_requests)   # restored after
    buf = io.StringIO()
    logs = [logging.getLogger(n) for n in ("sampan.serving", "uvicorn", "uvicorn.error")]
    saved = [(lg.handlers[:], lg.level, lg.propagate) for lg in logs]
    try:
        with monkeypatch.context() as m:
            m.setattr(sys, "stderr", buf)       # the server's log stream, as it starts
            s = Server({"affine": REF}, log_level="info", **kw)
            s.start()
        try:
            for body in (X, X, BAD):
                httpx.post(f"{s.url}/v2/models/affine/infer", json=body)
            flush_logging()
        finally:
            s.stop()
    finally:
        for lg, (h, lvl, prop) in zip(logs, saved):
            lg.handlers[:], lg.level, lg.propagate = h, lvl, prop
    return [r for r in map(json.loads, buf.getvalue().splitlines()) if r["msg"] == "infer"]


def test_request_logs_are_off_by_default_and_errors_are_always_logged(monkeypatch):
    off = _lines(monkeypatch)
    assert [r["status"] for r in off] == [400]
    assert "does not fit" in off[0]["error"] and off[0]["level"] == "warning"
    on = _lines(monkeypatch, log_requests=True)
    assert [r["status"] for r in on] == [200, 200, 400]
    import argparse

    from sampan.serving import cli
    sub = argparse.ArgumentParser().add_subparsers()
    cli.register(sub)
    p = sub.choices["serve"]
    assert p.parse_args(["--log-requests"]).log_requests is True
    assert p.parse_args([]).log_requests is False


def test_process_metrics_beside_the_sampan_ones():
    with Server({"affine": REF}) as s:
        httpx.post(f"{s.url}/v2/models/affine/infer", json=X)
        fams = {f.name: f for f in text_string_to_metric_families(
            httpx.get(f"{s.url}/metrics").text)}
    for name in ("process_cpu_seconds", "process_resident_memory_bytes",
                 "process_open_fds", "python_info", "sampan_requests"):
        assert name in fams, name
    cpu = fams["process_cpu_seconds"].samples[0].value
    assert cpu > 0


def test_one_requests_time_on_the_profiler_timeline():
    with Server({"affine": REF}) as s:
        httpx.post(f"{s.url}/v2/models/affine/infer", json=X)       # warm
        with sampan.profiler.profile() as prof:
            r = httpx.post(f"{s.url}/v2/models/affine/infer",
                           json=dict(X, id="rq-1"))
        assert r.status_code == 200
    ev = [e for e in prof.events if e.cat == "serving"]
    req = [e for e in ev if e.name == "request"]
    assert len(req) == 1 and req[0].args == {"model": "affine", "id": "rq-1",
                                             "status": 200, "batch": 1}
    stages = sorted((e for e in ev if e.tid == req[0].tid and e.name != "request"),
                    key=lambda e: e.ts)
    assert [e.name for e in stages] == ["read", "decode", "queue", "compute", "answer",
                                        "encode"]
    r0 = req[0]
    for a, b in zip(stages, stages[1:]):
        assert a.ts + a.dur <= b.ts + 1000          # in order (1 us of clock rounding)
    assert r0.ts <= stages[0].ts and stages[-1].end <= r0.end
    assert stages[3].args == {"batch": 1}
    batch = [e for e in ev if e.name == "batch"]
    assert len(batch) == 1 and batch[0].tid != r0.tid
    assert batch[0].args == {"model": "affine", "requests": 1, "rows": 1}
    assert abs(batch[0].ts - stages[3].ts) < 2000   # the same run, two views
    assert all(e.dur >= 0 for e in ev)
    assert np.isfinite([e.dur for e in ev]).all()
