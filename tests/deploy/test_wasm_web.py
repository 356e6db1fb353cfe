"""issue 35: the wasm and web targets of `sampan deploy`, run for real.

The W5 MLP, LeNet and a MiniLM-shaped encoder (fp32), and LeNet in int8 (sampan.quant's
post-training quantisation, where the C target has int8 kernels) are generated as C
(`sampan.deploy.c`), compiled to model.wasm with zig cc (wasm32-wasi, SIMD128), and run by
model.mjs in Node (with the loader's own WASI shim and with Node's node:wasi) and in a real
headless Chromium (Debian's chromium driven by npm's playwright-core, the page served from
127.0.0.1 by the test), every output equal to the Predictor's: within 1e-5 relative in
float32, bit for bit in int8;
the page's onnxruntime-web (the same model's ONNX export) agrees too, and the page shows
the right answer. Each part skips with its reason when zig, node, Chromium or the npm
packages are missing (`make test` installs them)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

import numpy as np
import pytest

import sampan
from sampan import nn

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("ziglang") is None,
                       reason="zig is missing: pip install ziglang (sampan[edge])"),
    pytest.mark.skipif(shutil.which("node") is None, reason="Node.js (node) is missing"),
]

cgen = pytest.importorskip("sampan.deploy.c", reason="the C target is not in this tree")
from sampan.deploy import DeployError, wasm, web  # noqa: E402

RTOL = 1e-5


def mlp():
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10))


def lenet():
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                         nn.Linear(84, 10))


def encoder():
    """A MiniLM-shaped sentence encoder (BERT, 2 layers, hidden 32), as in test_c_target."""
    from sampan.models import bert
    from sampan.models._config import BertConfig
    cfg = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=32)
    return bert.SentenceEncoder(bert.BertModel(cfg)).eval()


def _has_int8():
    from sampan.deploy.c import steps
    return "quantize" in steps.covered_ops() and importlib.util.find_spec("sampan.quant")


HAS_INT8 = bool(_has_int8())
NAMES = ["mlp", "lenet", "minilm"] + (["lenet_int8"] if HAS_INT8 else [])


def inputs_of(name, rng, b):
    if name == "minilm":
        mask = np.ones((b, 12), np.int64)
        mask[:, 9:] = 0
        return [rng.integers(0, 60, (b, 12)).astype(np.int64), mask]
    return [rng.random((b, 784) if name == "mlp" else (b, 1, 28, 28), dtype=np.float32)]


def predictor_out(path, xs):
    import sampan.inference as inf
    p = inf.create_predictor(inf.Config(path))
    return np.asarray(p.run([np.require(x, requirements="C") for x in xs])[0])


def assert_close(got, want, rtol=RTOL, what=""):
    """float32 within `rtol` of the largest |want|; int8 programs bit for bit."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if "int8" in what:
        assert got.dtype == want.dtype and np.array_equal(got, want), f"{what}: not bit-equal"
        return
    err = np.abs(got.astype(np.float64) - want) / max(float(np.abs(want).max()), 1e-30)
    assert err.max() <= rtol, f"{what}: max relative error {err.max():.3g} > {rtol}"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{name: (program, web folder, inputs of batch 3, the Predictor's output on them)}:
    generated, compiled and run by the Predictor once."""
    root = tmp_path_factory.mktemp("wasm_web")
    rng = np.random.default_rng(0)
    out = {}
    for name in ("mlp", "lenet", "minilm") + (("lenet_int8",) if HAS_INT8 else ()):
        sampan.manual_seed(1)
        xs = inputs_of(name, rng, 3)
        ex = tuple(sampan.tensor(x[:2]) for x in xs)
        if name == "lenet_int8":      # sampan.quant's post-training int8 of the LeNet above
            from sampan import quant
            cal = [rng.random((4, 1, 28, 28), dtype=np.float32) for _ in range(2)]
            prog = quant.quantize_program(out["lenet"][0], cal, str(root / f"{name}.sampan"))
            c_opts = {}
        elif name == "minilm":
            net = encoder()
            prog = sampan.jit.save(net, str(root / f"{name}.sampan"), ex, dynamic=net.dynamic)
            c_opts = {"sizes": {"seq": 12}, "max_batch": 4}
        else:
            net = mlp() if name == "mlp" else lenet()
            prog = sampan.jit.save(net, str(root / f"{name}.sampan"), ex,
                                   dynamic={"x": {0: "batch"}})
            c_opts = {}
        c_dir = str(root / f"{name}_c")
        g = cgen.generate_c(prog, c_dir, **c_opts)
        site = str(root / f"{name}_web")
        # the comparison's ONNX, exported here (build_web's own export, through the `sampan
        # onnx export` command, is test_web_exports_the_onnx_itself: slow)
        onnx = web.has_package("onnxruntime-web")
        if name == "lenet_int8":
            onnx = False        # the page compares fp32 models with onnxruntime-web
        elif onnx:
            from sampan.onnx.export import save_model, saved_to_model
            onnx = str(root / f"{name}.onnx")
            save_model(saved_to_model(prog, opset=web.WEB_OPSET), onnx)
        b = web.build_web(prog, site, c_dir=c_dir, prefix=g.prefix,
                          sample=tuple(x[:1] for x in xs), onnx=onnx)
        assert b.wasm_warnings == "", f"zig cc -Wall -Wextra warned on {name}: {b.wasm_warnings}"
        out[name] = (prog, site, xs, predictor_out(prog, xs))
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["shim", "wasi"])
def test_node_equals_predictor(models, name, mode):
    _, site, xs, want = models[name]
    for batch in (1, 3):
        r = wasm.run_node(site, [x[:batch] for x in xs], wasi=(mode == "wasi"))
        assert_close(r["outputs"][0], want[:batch], what=f"{name} in Node ({mode}), batch {batch}")


def test_folder_and_sizes(models):
    site = models["lenet"][1]
    names = set(os.listdir(site))
    assert {"index.html", "page.mjs", "page.json", "model.mjs", "model.wasm", "weights.bin",
            "input0.bin"} <= names
    # generated code + runtime of LeNet: model.wasm (kernels, buffers, the bits of libc) is
    # far under the 100 KiB
    assert os.path.getsize(os.path.join(site, "model.wasm")) < 100 * 1024
    with open(os.path.join(site, "model.wasm"), "rb") as f:
        assert f.read(4) == b"\0asm"


def test_loader_refuses_bad_input_and_corrupt_weights(models, tmp_path):
    _, site, (x,), _ = models["mlp"]
    with pytest.raises(DeployError, match=r"input x has 5 elements, expected a positive "
                                          r"multiple of 784"):
        wasm.run_node(site, [np.zeros(5, np.float32)])
    # the loader itself, called from JS with the wrong array type and input name
    script = tmp_path / "t.mjs"
    script.write_text(
        "import { load } from './site/model.mjs';\n"
        "const m = await load('site/model.wasm', 'site/weights.bin');\n"
        "for (const bad of [[new Int32Array(784)], {y: new Float32Array(784)}]) {\n"
        "  try { m.run(bad); console.log('no error'); } catch (e) { console.log(e.message); }\n"
        "}\n")
    shutil.copytree(site, tmp_path / "site")
    r = subprocess.run([wasm.node(), str(script)], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "input x must be a Float32Array (float32), got Int32Array" in lines[0]
    assert "run() is missing input x; expected x" in lines[1]
    bad = tmp_path / "bad"
    shutil.copytree(site, bad)
    raw = bytearray((bad / "weights.bin").read_bytes())
    raw[len(raw) // 2] ^= 0x40
    (bad / "weights.bin").write_bytes(bytes(raw))
    with pytest.raises(DeployError, match="failed in Node") as e:
        wasm.run_node(str(bad), [x[:1]])
    assert "weights" in str(e.value).lower()


def test_build_wasm_names_missing_c_files(tmp_path):
    with pytest.raises(DeployError, match=r"has no model\.c"):
        wasm.build_wasm(str(tmp_path), str(tmp_path / "out"))


def _no_browser():
    if web.chromium() is None:
        return "Chromium is missing (apt-get install chromium)"
    if not web.has_package("playwright-core"):
        return "npm's playwright-core is missing (make test installs it into build/node)"
    return None


NO_BROWSER = _no_browser()


@pytest.fixture(scope="module")
def chromium_runs(models, tmp_path_factory):
    """Every model's page in one headless Chromium: outputs on batch 2, onnxruntime-web's
    too, a screenshot, and the drawing pad's Run where the input is an image."""
    shots = tmp_path_factory.mktemp("shots")
    names = list(models)
    res = web.run_pages([dict(folder=models[n][1], inputs=[x[:2] for x in models[n][2]],
                              ort=True, screenshot=str(shots / f"{n}.png"),
                              click_run=(n != "minilm")) for n in names])
    return {n: (r, str(shots / f"{n}.png")) for n, r in zip(names, res)}


@pytest.mark.skipif(NO_BROWSER is not None, reason=NO_BROWSER or "")
@pytest.mark.parametrize("name", NAMES)
def test_chromium_equals_predictor(models, chromium_runs, name):
    want = models[name][3]
    r, shot = chromium_runs[name]
    assert_close(r["sampan"]["outputs"][0], want[:2], what=f"{name} in Chromium")
    assert r["isolated"], "the page is not cross-origin isolated (its clock would be coarse)"
    assert os.path.getsize(shot) > 1000
    if name != "minilm":
        # the page ran the input it was given (input0.bin = x[:1]) and shows its answer;
        # the drawing pad shows that input, and its Run (the pad averaged back down to
        # the input's pixels, 8-bit grey) gives the same answer
        assert r["answer"]["sampan"] == str(int(np.argmax(want[0])))
        assert r["drawn"]["sampan"] == r["answer"]["sampan"]
    if web.has_package("onnxruntime-web") and name != "lenet_int8":
        assert r["ort"] is not None, "the page did not set up onnxruntime-web"
        assert_close(r["ort"]["outputs"][0], want[:2], rtol=1e-4,
                     what=f"{name}'s ONNX export in onnxruntime-web")
        assert r["answer"]["ort"] == r["answer"]["sampan"]


def test_cli_targets_wasm_and_web(models, tmp_path, capsys):
    from sampan.cli import main
    prog, _, (x,), want = models["lenet"]
    np.save(tmp_path / "x.npy", x[:1])
    assert main(["deploy", prog, "--target", "wasm", "-o", str(tmp_path / "w"),
                 "--prefix", "lenet"]) == 0
    assert "model.wasm" in capsys.readouterr().out
    r = wasm.run_node(str(tmp_path / "w"), [x])
    assert_close(r["outputs"][0], want, what="lenet via the CLI's wasm")
    assert main(["deploy", prog, "--target", "web", "-o", str(tmp_path / "site"), "--no-onnx",
                 "--sample", str(tmp_path / "x.npy")]) == 0
    names = set(os.listdir(tmp_path / "site"))
    assert {"index.html", "model.wasm", "input0.bin"} <= names and "model.onnx" not in names


@pytest.mark.slow   # zig builds its wasm32-wasi libc once more, for the flags without SIMD128
def test_without_simd_the_same_numbers(models, tmp_path):
    _, site, xs, want = models["lenet"]
    b = wasm.build_wasm(os.path.join(os.path.dirname(site), "lenet_c"), str(tmp_path / "w"),
                        simd=False)
    assert not b.simd and "SIMD" not in b.report()
    assert_close(wasm.run_node(str(tmp_path / "w"), xs)["outputs"][0], want,
                 what="lenet without SIMD128")


@pytest.mark.slow   # a second Python process for `sampan onnx export`
@pytest.mark.skipif(not web.has_package("onnxruntime-web"), reason="no onnxruntime-web (npm)")
def test_web_exports_the_onnx_itself(models, tmp_path):
    prog, site, _, _ = models["mlp"]
    b = web.build_web(prog, str(tmp_path / "site"), c_dir=os.path.join(os.path.dirname(site),
                      "mlp_c"), onnx=True)
    import onnx
    m = onnx.load(str(tmp_path / "site" / "model.onnx"))
    assert m.opset_import[0].version == web.WEB_OPSET and b.onnx_bytes > 0
    assert sorted(os.listdir(tmp_path / "site" / "ort")) == sorted(web.ORT_FILES)
