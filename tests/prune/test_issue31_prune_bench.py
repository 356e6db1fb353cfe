"""Issue 31, `make bench`: a tiny run of benchmarks/w5_prune.py (a few training steps, a few
timed calls) prints, after its tables, one JSON line per (model, batch) and the pruning
lines the issue's target reads (50% channels' batch-1 speed-up over dense, target 1.3x,
and each pruned model's accuracy loss in points, target <= 1), each with the machine it ran
on. Timings are not asserted. Slow (`make test-slow`): 26 s on a new 2-core machine, the
suite's longest test, for output that only `make bench` reads."""
import json
import os
import sys

import pytest

BENCH = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


@pytest.mark.slow
def test_w5_prune_prints_its_lines_with_the_machine(capsys):
    sys.path.insert(0, BENCH)
    try:
        import w5_prune
        w5_prune.main(["--steps", "2", "--finetune", "2", "--repeats", "8",
                       "--train", "200", "--test", "64"])
    finally:
        sys.path.remove(BENCH)
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()
            if line.startswith("{")]
    assert all(r["machine"]["cpu"] for r in recs)
    got = {(r["mode"], r["metric"]): r for r in recs}
    models = ("dense", "magnitude 50%", "channels 50%")
    for m in models:
        for b in (1, 64):
            r = got[(m, f"batch{b}_latency_us_p50")]
            assert r["workload"] == "W5" and r["value"] > 0 and 0 <= r["accuracy"] <= 1
    assert got[("channels 50%", "batch1_latency_us_p50")]["params"] < \
        got[("dense", "batch1_latency_us_p50")]["params"]
    speed = got[("channels 50%", "batch1_speedup_p50")]
    assert speed["target"] == 1.3
    want = (got[("dense", "batch1_latency_us_p50")]["value"]
            / got[("channels 50%", "batch1_latency_us_p50")]["value"])
    assert abs(speed["value"] - want) <= 1e-3 * want + 1e-4
    for m in models[1:]:
        loss = got[(m, "accuracy_loss_points")]
        acc = {k: got[(k, "batch1_latency_us_p50")]["accuracy"] for k in ("dense", m)}
        assert loss["target"] == 1.0
        assert abs(loss["value"] - 100 * (acc["dense"] - acc[m])) < 1e-3
        assert (m, "batch64_speedup_p50") in got
