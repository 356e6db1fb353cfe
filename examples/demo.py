"""`make demo`: the platform's main job end to end on embedded defaults.

1. train a CNN on scikit-learn's digits eagerly (progress bar, periodic checkpoints);
2. save the weights (atomic, checksummed), reload them into a fresh model, re-check accuracy;
3. jit-compile the model, save it as a self-contained program, load it in a fresh process
   (no model code there) and check it gives the same accuracy; write the graph picture;
4. train a short DLRM on the synthetic click stream and show AUC rising (when sampan.rec
   is present);
5. serve the CNN through a Predictor (sampan.inference), fp32 and, where sampan.quant is
   present, int8 after post-training quantisation: accuracy and batch-1 latency;
6. `sampan serve` for a few seconds on 127.0.0.1 (when sampan.serving is present): the CNN
   program and a small DLRM, queried with the real tritonclient (HTTP, and one gRPC
   request), the DLRM's embeddings updated from delta exports while it serves.
7. train the CNN data-parallel on 2 ranks (`sampan launch -n 2`) for one epoch: both
   ranks print the same parameter checksum.
8. profile one training epoch of the CNN: out/trace.json (open it in ui.perfetto.dev), the
   model summary, the busiest ops and the advisor's findings.
9. train the DLRM with its table on 2 Ray shard actors, kill one, and watch training carry
   on with the restored shard.
10. control flow: a briefly trained char-GPT decoded by beam search under `sampan.jit`,
   the whole decode one `sampan.while_loop` node (early stop at the end of the line),
   equal to the Python-loop beam search.
11. edge: the CNN as a dependency-free C library (`sampan deploy --target c`) run by its C
   driver, accuracy and batch-1 latency beside the Predictor's; where Chromium is
   installed, the web target's page (the wasm build) rendered headless, with its answer.
Outputs go to ./out/."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import sampan  # noqa: E402
from digits_cnn import DigitsCNN, evaluate, train  # noqa: E402
from digits_common import loaders  # noqa: E402

OUT = os.path.join(os.getcwd(), "out")


def step(msg):
    print(f"\n== {msg}", flush=True)


def main():
    os.makedirs(OUT, exist_ok=True)
    step("1. train the digits CNN eagerly")
    ckpt_dir = tempfile.mkdtemp(prefix="sampan-ckpt-")
    model, acc, secs = train(checkpoint_dir=ckpt_dir)
    print(f"test accuracy {acc:.4f} after {secs:.1f} s (target >= 0.97)")

    step("2. save, reload into a fresh model, re-evaluate")
    path = os.path.join(OUT, "digits_cnn.ckpt")
    sampan.save(model.state_dict(), path)
    fresh = DigitsCNN()
    fresh.load_state_dict(sampan.load(path))
    _, test_loader = loaders()
    acc2 = evaluate(fresh, test_loader)
    print(f"saved {path} ({os.path.getsize(path)} bytes); reloaded accuracy {acc2:.4f}")
    assert acc2 == acc, "reloaded model disagrees with the trained one"

    step("3. jit-compile, save the program, load it in a fresh process")
    model.eval()
    xs = np.concatenate([x.numpy() for x, _ in test_loader])
    ys = np.concatenate([y.numpy() for _, y in test_loader])
    compiled = sampan.jit(model)
    with sampan.no_grad():
        jit_pred = compiled(sampan.tensor(xs)).numpy().argmax(-1)
    print(f"jit accuracy {np.mean(jit_pred == ys):.4f}")
    prog = os.path.join(OUT, "digits_cnn.program")
    sampan.jit.save(model, prog, (sampan.tensor(xs),))
    np.save(os.path.join(OUT, "digits_test_x.npy"), xs)
    np.save(os.path.join(OUT, "digits_test_y.npy"), ys)
    code = textwrap.dedent(f"""
        import numpy as np, sampan
        m = sampan.jit.load({prog!r})
        x = np.load({os.path.join(OUT, 'digits_test_x.npy')!r})
        y = np.load({os.path.join(OUT, 'digits_test_y.npy')!r})
        print(float(np.mean(m(sampan.tensor(x)).numpy().argmax(-1) == y)))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    if r.returncode:
        raise SystemExit(r.stderr)
    acc3 = float(r.stdout.strip().splitlines()[-1])
    print(f"fresh process, program only: accuracy {acc3:.4f}")
    assert abs(acc3 - acc) < 1e-9, "the saved program disagrees with the eager model"
    from sampan.ir.viz import render
    print(render(sampan.jit.load(prog).graph, os.path.join(OUT, "digits_cnn.svg")))

    step("4. recommendation: DLRM on the synthetic click stream (raw 64-bit ids)")
    import rec_dlrm
    rec_dlrm.main(["--quick"])

    step("5. serve the CNN through a Predictor: accuracy and batch-1 latency")
    serve(model, xs, ys)

    step("6. sampan serve: the CNN and a DLRM over HTTP, queried with tritonclient")
    serve_http(os.path.join(OUT, "digits_cnn_served.program"), xs, ys)

    data_parallel()

    step("8. profile one training epoch: trace, summary, advisor")
    profile_epoch()

    step("9. parameter servers on Ray: 2 shard actors, one killed mid-training")
    import rec_ray_ps
    rec_ray_ps.main([])

    step("10. control flow: a jitted beam-search decode of a char-GPT (one while_loop)")
    beam_decode()

    edge(xs, ys)


def beam_decode(steps=30):
    """A small char-GPT (1 block, width 32, context 16) trained for `steps` steps, then
    decoded greedily and by beam search to the end of a line, each decode one jitted
    `while_loop` (examples/char_gpt.py); a few seconds in all."""
    import time
    import char_gpt
    t = time.perf_counter()
    model, stoi, itos, first, last = char_gpt.train(
        steps, block=16, batch=16, log=lambda *a: None, d_model=32, n_head=2, n_layer=1)
    print(f"char-GPT: {steps} training steps, loss {first:.2f} -> {last:.2f} "
          f"({time.perf_counter() - t:.1f} s)")
    char_gpt.decode(model, stoi, itos, "Beautiful is ", max_new=30, k=3, block=16)


def edge(xs, ys):
    """The served CNN program (step 5, symbolic batch) as a C library: built with the
    system cc, run from its driver `model_run` on the whole test set (accuracy) and at batch
    1 (p50 of 2000 calls, timed by the driver) beside the Predictor; then, where Chromium
    and the npm packages are installed, its web page rendered headless (out/digits_web.png)."""
    import shutil
    import time
    step("11. edge: the CNN as a C library and a web page (sampan deploy --target c / web)")
    t0 = time.perf_counter()
    served = os.path.join(OUT, "digits_cnn_served.program")
    try:
        from sampan.deploy import web
        from sampan.deploy.c import generate_c
    except ImportError as e:
        print(f"edge: not available ({e})")
        return
    if shutil.which("cc") is None or shutil.which("make") is None:
        print("edge: no C compiler (cc) or make here")
        return
    c_dir = os.path.join(OUT, "digits_cnn_c")
    g = generate_c(served, c_dir, max_batch=len(xs))
    subprocess.run(["make", "-s", "-j2", "-C", c_dir], check=True)   # libmodel.so, model_run
    x = np.ascontiguousarray(xs, dtype="<f4")
    x.tofile(os.path.join(c_dir, "test_x.bin"))
    x[:1].tofile(os.path.join(c_dir, "one_x.bin"))
    run = os.path.join(c_dir, "model_run")
    subprocess.run([run, "test_x.bin", "test_y.bin", "-b", str(len(x))], cwd=c_dir, check=True)
    logits = np.fromfile(os.path.join(c_dir, "test_y.bin"), "<f4").reshape(len(x), -1)
    acc = float(np.mean(logits.argmax(-1) == ys))
    r = subprocess.run([run, "one_x.bin", "one_y.bin", "-b", "1", "-t", "2000"], cwd=c_dir,
                       check=True, capture_output=True, text=True)
    c_p50 = float(r.stdout.split("p50_us")[1].split()[0])
    from sampan import inference
    p = inference.create_predictor(inference.Config(served))
    p.get_input_handle(p.get_input_names()[0]).copy_from_cpu(x)
    p.run()
    ref = p.get_output_handle(p.get_output_names()[0]).copy_to_cpu()
    h, o, ts = p.get_input_handle(p.get_input_names()[0]), p.get_output_handle(
        p.get_output_names()[0]), []
    for i in range(-100, 1000):
        t = time.perf_counter()
        h.copy_from_cpu(x[:1])
        p.run()
        o.copy_to_cpu()
        if i >= 0:
            ts.append(time.perf_counter() - t)
    so = os.path.getsize(os.path.join(c_dir, "libmodel.so"))
    print(f"C library ({len(g.ops)} ops, kernels {', '.join(g.kernels)}; libmodel.so "
          f"{so / 1024:.0f} KiB): accuracy {acc:.4f}, batch-1 p50 {c_p50:.1f} us (driver); "
          f"Predictor: accuracy {float(np.mean(ref.argmax(-1) == ys)):.4f}, batch-1 p50 "
          f"{np.percentile(ts, 50) * 1e6:.1f} us; max |C - Predictor| "
          f"{float(np.abs(logits - ref).max()):.2e}")
    reason = ("no Chromium (apt-get install chromium)" if web.chromium() is None else
              None if web.has_package("playwright-core") else "no playwright-core (npm)")
    try:
        from sampan.deploy import wasm
        wasm.zig()
    except Exception as e:
        reason = reason or str(e)
    if reason:
        print(f"web page: skipped ({reason})")
        return
    site = os.path.join(OUT, "digits_web")
    onnx = False
    if web.has_package("onnxruntime-web"):
        onnx = os.path.join(OUT, "digits_cnn.onnx")
        _export(served, onnx, web.WEB_OPSET)
    built = web.build_web(served, site, c_dir=c_dir, prefix=g.prefix, sample=x[:1],
                          onnx=onnx, title="sampan: digits CNN (draw a digit)")
    shot = os.path.join(OUT, "digits_web.png")
    res = web.run_headless(site, screenshot=shot)
    ans = res["answer"]
    print(f"web page ({built.report()}) in headless Chromium {res.get('browser', '')}: "
          f"answer {ans['sampan']} (true label {int(ys[0])}), onnxruntime-web {ans['ort']}; "
          f"screenshot {shot}; open it with: python -m sampan.deploy.web {site}")
    print(f"edge step: {time.perf_counter() - t0:.1f} s")


def _export(program, path, opset):
    from sampan.onnx.export import save_model, saved_to_model
    save_model(saved_to_model(program, opset=opset), path)


def data_parallel():
    """The digits CNN for one epoch on 2 ranks through `sampan launch` (MPI); both ranks
    print their parameter checksum, which must be the same."""
    import re
    import time
    step("7. data parallel: the digits CNN on 2 ranks through `sampan launch`")
    from digits_dp import save_digits
    script = os.path.join(HERE, "digits_dp.py")
    data = os.path.join(OUT, "digits_split.npz")
    save_digits(data)            # the ranks skip importing scikit-learn
    cmd = [sys.executable, "-c", "import sys; from sampan.cli import main; sys.exit(main())",
           "launch", "-n", "2", script, "--data", data]
    print("$ sampan launch -n 2 examples/digits_dp.py")
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("rank ")]
    print("\n".join(sorted(lines)))
    if r.returncode:
        raise SystemExit(f"sampan launch failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    sums = {m.group(1) for ln in lines for m in [re.search(r"checksum (\w+)", ln)] if m}
    assert len(lines) == 2 and len(sums) == 1, "the ranks' parameters differ"
    print(f"both ranks hold identical parameters ({time.perf_counter() - t:.1f} s)")


def profile_epoch():
    """One eager epoch of a fresh CNN under `sampan.profiler.profile`, its batches loaded by
    two worker threads: writes out/trace.json and prints the model summary, the top ops
    and the advisor's findings."""
    import time

    from digits_common import digits

    from sampan.data import DataLoader
    from sampan.profiler import profile, record
    from sampan.train import Trainer
    sampan.manual_seed(0)
    train_set, _ = digits(seed=0)
    loader = DataLoader(train_set, batch_size=32, shuffle=True, seed=0, num_workers=2)
    model = DigitsCNN()
    opt = sampan.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    trainer = Trainer(model, opt, sampan.cross_entropy, loader)
    sampan.summary(model, train_set[:32][0])
    t = time.perf_counter()
    with profile() as prof, record("epoch"):
        trainer.fit(1)
    secs = time.perf_counter() - t
    path = prof.export_chrome_trace(os.path.join(OUT, "trace.json"))
    print(f"one epoch ({len(loader)} steps) profiled in {secs:.1f} s: {len(prof.events)} "
          f"events -> {path} (open it in https://ui.perfetto.dev)")
    print(prof.key_averages().table(sort_by="self_time", row_limit=8))
    findings = prof.advise()
    print(f"advisor: {len(findings)} finding(s)")
    for f in findings:
        print(f)


def serve(model, xs, ys, calls=2000):
    """The CNN saved with a symbolic batch, behind `sampan.inference` Predictors: fp32,
    and int8 (`sampan.quant.quantize_program`, calibrated on 8 batches of test images)
    when this sampan has sampan.quant. Prints accuracy and batch-1 latency p50/p99."""
    import time

    from sampan import inference
    served = os.path.join(OUT, "digits_cnn_served.program")
    sampan.jit.save(model, served, (sampan.tensor(xs[:2]),), dynamic={"x": {0: "batch"}})
    programs = [("fp32", served)]
    try:
        from sampan import quant
    except ImportError:
        quant = None
    # an editable install may find sampan.quant in another checkout: only this one's counts
    if quant is None or not os.path.realpath(quant.__file__).startswith(
            os.path.realpath(os.path.dirname(sampan.__file__)) + os.sep):
        print("int8: not available (sampan.quant is not in this sampan)")
    else:
        cal = [xs[i:i + 32] for i in range(0, 256, 32)]
        programs.append(("int8", quant.quantize_program(
            served, cal, os.path.join(OUT, "digits_cnn_int8.program"))))
    x1 = np.ascontiguousarray(xs[:1])
    p50 = {}
    for label, path in programs:
        p = inference.create_predictor(inference.Config(path))
        h = p.get_input_handle(p.get_input_names()[0])
        out = p.get_output_handle(p.get_output_names()[0])
        h.copy_from_cpu(xs)
        p.run()
        acc = float(np.mean(out.copy_to_cpu().argmax(-1) == ys))
        one = p.clone()             # its own executor for batch 1
        h1 = one.get_input_handle(one.get_input_names()[0])
        o1 = one.get_output_handle(one.get_output_names()[0])
        ts = np.empty(calls)
        for i in range(-200, calls):            # the first 200 calls warm up
            t = time.perf_counter()
            h1.copy_from_cpu(x1)
            one.run()
            o1.copy_to_cpu()
            if i >= 0:
                ts[i] = time.perf_counter() - t
        p50[label] = float(np.percentile(ts, 50))
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        print(f"Predictor {label}: accuracy {acc:.4f}, batch-1 latency p50 "
              f"{np.percentile(ts, 50) * 1e6:.1f} us, p99 {np.percentile(ts, 99) * 1e6:.1f} us "
              f"over {calls} calls; program {size / 1024:.0f} KiB")
    if "int8" in p50:
        print(f"Predictor int8 / fp32 at batch 1: {p50['fp32'] / p50['int8']:.2f}x faster "
              "(p50; int8 activations stay int8 from layer to layer)")


def serve_http(cnn_program, xs, ys):
    """Serve the CNN program and a freshly trained small DLRM on 127.0.0.1 (a free port)
    for a few seconds, query both with tritonclient, then move the DLRM's spare delta
    exports into its watched directory and query again at the new snapshot."""
    import shutil
    import time
    try:
        from tritonclient import http

        from sampan.serving import Server
        from sampan.serving.rec import demo_inputs, export_demo_dlrm
    except ImportError as e:
        print(f"serving: not available ({e})")
        return
    try:
        from tritonclient import grpc as grpcclient    # the gRPC front end too, when present
    except ImportError:
        grpcclient = None
    ctr = os.path.join(OUT, "serving", "ctr")
    shutil.rmtree(ctr, ignore_errors=True)
    t0 = time.perf_counter()
    export_demo_dlrm(ctr)
    # warmup=False: each batch size compiles on first use, not all of them up front
    with Server({"digits": cnn_program, "ctr": ctr}, host="127.0.0.1", port=0,
                warmup=False, grpc_port=0 if grpcclient else None) as server:
        print(f"serving digits and ctr at {server.url}"
              + (f" and gRPC {server.grpc_address}" if grpcclient else ""))
        client = http.InferenceServerClient(server.url[len("http://"):])
        x = http.InferInput("x", [8, *xs.shape[1:]], "FP32")
        x.set_data_from_numpy(xs[:8], binary_data=True)
        pred = client.infer("digits", [x]).as_numpy("output_0").argmax(-1)
        print(f"digits: predicted {pred.tolist()}, labels {ys[:8].tolist()}")
        if grpcclient is not None:          # one request over gRPC: the same answer
            g = grpcclient.InferenceServerClient(server.grpc_address)
            gx = grpcclient.InferInput("x", [8, *xs.shape[1:]], "FP32")
            gx.set_data_from_numpy(xs[:8])
            gpred = g.infer("digits", [gx]).as_numpy("output_0").argmax(-1)
            g.close()
            print(f"digits over gRPC: predicted {gpred.tolist()}")
            assert (gpred == pred).all(), "gRPC and HTTP disagree"
        req = demo_inputs(4)

        def ask():
            ins = [http.InferInput(k, list(v.shape), "INT64" if v.dtype.kind == "i" else "FP32")
                   for k, v in req.items()]
            for i, v in zip(ins, req.values()):
                i.set_data_from_numpy(v)
            p = client.infer("ctr", ins).as_numpy("probability")[:, 0]
            seq = client.get_model_metadata("ctr")["snapshot_sequence"]
            print(f"ctr at snapshot {seq}: click probabilities "
                  + " ".join(f"{v:.4f}" for v in p))
            return seq

        seq = ask()
        spare = os.path.join(ctr, "spare_deltas")
        names = sorted(os.listdir(spare))
        for name in names:  # in order, each renamed into place whole
            os.replace(os.path.join(spare, name), os.path.join(ctr, "deltas", name))
        deadline = time.monotonic() + 5
        while client.get_model_metadata("ctr")["snapshot_sequence"] < seq + len(names) and (
                time.monotonic() < deadline):
            time.sleep(0.05)
        ask()
        client.close()
    print(f"server stopped ({time.perf_counter() - t0:.1f} s with the DLRM's training)")


if __name__ == "__main__":
    main()
