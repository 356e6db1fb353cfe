"""A tiny run of benchmarks/w5_inference.py's code path (the MLP, a few training steps, a
few calls): every JSON line it prints has the fields WORKLOADS.md asks for, each system's
accuracy, and the ratio lines pair sampan with its peers. Timings are not asserted."""
import json
import os
import sys

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


def test_w5_inference_smoke(capsys):
    sys.path.insert(0, os.path.abspath(BENCH))
    try:
        import w5_inference
        rc = w5_inference.main(["--models", "MLP", "--calls", "20", "--iters64", "2",
                                "--blocks", "2", "--pause", "0", "--mlp-steps", "3",
                                "--train", "256", "--test", "100"])
    finally:
        sys.path.remove(os.path.abspath(BENCH))
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    recs = [json.loads(line) for line in out if line.startswith("{")]
    comments = [line for line in out if line.startswith("#")]
    assert all(line.startswith(("{", "#")) for line in out if line.strip()), out
    timed = [r for r in recs if r["metric"] in ("batch1_latency_us_p50", "batch1_latency_us_p99",
                                                "batch64_samples_per_s")]
    systems = {(r["system"], r["mode"]) for r in timed}
    assert {("sampan", "predictor_numba"), ("sampan", "predictor_numpy"),
            ("onnxruntime", "fp32"), ("pytorch", "eager")} <= systems
    for r in timed:
        for k in ("workload", "system", "mode", "metric", "value", "min", "max", "model",
                  "cpu", "avx512", "blas", "accuracy", "max_abs_err_vs_eager"):
            assert k in r, (k, r)
        assert r["workload"] == "W5" and r["model"] == "MLP"
        assert r["min"] <= r["value"] <= r["max"] and r["value"] > 0
        assert 0.0 <= r["accuracy"] <= 1.0
    # the fp32 systems compute the same logits, so their accuracies agree
    acc = {(r["system"], r["mode"]): r["accuracy"] for r in timed if "int8" not in r["mode"]}
    assert len(set(acc.values())) == 1, acc
    ratios = {(r["system"], r["metric"]) for r in recs if r["metric"].endswith("_ratio")}
    for peer in ("onnxruntime_fp32", "pytorch_eager"):
        assert (f"sampan_predictor_numba/{peer}", "batch1_p50_ratio") in ratios
        assert (f"sampan_predictor_numba/{peer}", "batch64_throughput_ratio") in ratios
    # int8: rows where sampan.quant is in this sampan, else a line saying it is not
    if not any("int8" in m for _, m in systems):
        assert any("int8" in c for c in comments), comments
    # the onnxruntime runtime of the Predictor: a row, or a line saying why not
    if ("sampan", "predictor_onnxruntime") not in systems:
        assert any("'onnxruntime'" in c for c in comments), comments
