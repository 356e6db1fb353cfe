// The page of `sampan deploy --target web`: runs model.wasm (through model.mjs) and, when the
// folder has model.onnx and the vendored onnxruntime-web, the same model's ONNX export, on
// the input it was given (input.bin) or one drawn on the canvas; shows each answer and its
// batch-1 latency. page.json (data written by sampan) says the input's name, dtype and
// shape, whether it is an image to draw, and the pixel range. Tests and benchmarks call
// window.sampan.{run, time} and window.sampanOrt.{run, time} (headless Chromium).
import { load } from "./model.mjs";

const $ = (id) => document.getElementById(id);
const TYPED = { float32: Float32Array, float64: Float64Array, int8: Int8Array, uint8: Uint8Array,
                int16: Int16Array, int32: Int32Array, int64: BigInt64Array };
// plain numbers (from a test, page.evaluate) as the descriptor's typed array, and back
const typed = (T, v) => (T === BigInt64Array ? BigInt64Array.from(v, (n) => BigInt(n)) : new T(v));
const plain = (a) => Array.from(a, Number);

function p50(xs) { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; }

// per-call microseconds of `reps` samples, each sample long enough for the timer's
// resolution (~2 ms); at most `budgetMs` in all (the page's own display), at least 3 samples
function timeCalls(fn, reps, budgetMs = Infinity) {
  let t0 = performance.now(), n = 0;
  while ((performance.now() - t0 < 20 && n < 50) || n < 2) { fn(); n++; }
  const per = (performance.now() - t0) / n;
  const inner = Math.max(1, Math.ceil(2 / per));
  reps = Math.max(3, Math.min(reps, Math.floor(budgetMs / (per * inner))));
  const us = [];
  for (let r = 0; r < reps; r++) {
    const t = performance.now();
    for (let i = 0; i < inner; i++) fn();
    us.push((performance.now() - t) * 1e3 / inner);
  }
  return us;
}

function answer(outs) {
  const y = outs[0];
  if (y.data.length === 0) return "(empty)";
  if (y.shape.length === 2 && y.shape[0] === 1 && y.shape[1] > 1) {
    let best = 0;
    for (let i = 1; i < y.data.length; i++) if (y.data[i] > y.data[best]) best = i;
    return String(best);
  }
  return Array.from(y.data.slice(0, 4), (v) => Number(v).toPrecision(4)).join(", ") +
    (y.data.length > 4 ? " …" : "");
}

function fmtUs(us) { return us >= 1000 ? `${(us / 1000).toFixed(2)} ms` : `${us.toFixed(1)} µs`; }

async function ortSession(cfg) {
  if (!cfg.onnx || !cfg.ort) return null;
  const ort = await import(cfg.ort);
  ort.env.wasm.wasmPaths = new URL(cfg.ort_dir, location.href).href;
  ort.env.wasm.numThreads = 1;        // one thread, as model.wasm
  ort.env.wasm.proxy = false;
  const s = await ort.InferenceSession.create(cfg.onnx, { executionProviders: ["wasm"] });
  const run = async (arrays, shapes) => {
    const feeds = {};
    s.inputNames.forEach((n, i) => {
      const dt = Object.keys(TYPED).find((k) => arrays[i] instanceof TYPED[k]);
      feeds[n] = new ort.Tensor(dt, arrays[i], shapes[i]);
    });
    const r = await s.run(feeds);
    return s.outputNames.map((n) => ({ name: n, shape: r[n].dims.map(Number), type: r[n].type, data: r[n].data }));
  };
  return { run, version: ort.env.versions ? ort.env.versions.web : "" };
}

async function main() {
  const cfg = await (await fetch("page.json")).json();
  $("title").textContent = cfg.title;
  const model = await load("model.wasm", "weights.bin");
  const d = model.inputs[0];
  const shapeOf = (a, desc) => {
    const per = desc.shape.reduce((p, s) => p * (s < 0 ? 1 : s), 1);
    return desc.shape.map((s) => (s < 0 ? a.length / per : s));
  };
  const toTyped = (list) => list.map((v, i) => typed(TYPED[model.inputs[i].dtype], v));
  window.sampan = {
    inputs: model.inputs, outputs: model.outputs,
    run: (list) => model.run(toTyped(list)).map((o, j) => ({ name: o.name, shape: o.shape,
                                                              dtype: model.outputs[j].dtype, data: plain(o.data) })),
    time: (list, reps) => { const a = toTyped(list); return timeCalls(() => model.run(a), reps); },
  };
  let ort = null;
  try { ort = await ortSession(cfg); } catch (e) { $("ort-answer").textContent = `unavailable: ${e.message}`; }
  if (ort) {
    window.sampanOrt = {
      version: ort.version,
      run: async (list) => (await ort.run(toTyped(list), toTyped(list).map((a, i) => shapeOf(a, model.inputs[i]))))
        .map((o) => ({ name: o.name, shape: o.shape, dtype: o.type, data: plain(o.data) })),
      // onnxruntime-web's run is async: each sample awaits its calls
      time: async (list, reps) => {
        const a = toTyped(list), sh = a.map((x, i) => shapeOf(x, model.inputs[i])), us = [];
        let t0 = performance.now(), n = 0;
        while ((performance.now() - t0 < 20 && n < 20) || n < 2) { await ort.run(a, sh); n++; }
        const inner = Math.max(1, Math.ceil(2 / ((performance.now() - t0) / n)));
        for (let r = 0; r < reps; r++) {
          const t = performance.now();
          for (let i = 0; i < inner; i++) await ort.run(a, sh);
          us.push((performance.now() - t) * 1e3 / inner);
        }
        return us;
      },
    };
  }

  // xs: one typed array per input (the drawing pad gives the first input of a one-input model)
  async function show(xs) {
    const outs = model.run(xs);
    $("sampan-answer").textContent = answer(outs);
    $("sampan-latency").textContent = fmtUs(p50(timeCalls(() => model.run(xs), 15, 500)));
    if (ort) {
      try {
        const sh = xs.map((x, i) => shapeOf(x, model.inputs[i]));
        $("ort-answer").textContent = answer(await ort.run(xs, sh));
        const us = [];
        const t0 = performance.now();     // 30 calls, or as many as fit in ~0.5 s (at least 3)
        for (let r = 0; r < 30 && (r < 3 || performance.now() - t0 < 500); r++) {
          const t = performance.now(); await ort.run(xs, sh); us.push((performance.now() - t) * 1e3);
        }
        $("ort-latency").textContent = fmtUs(p50(us));
      } catch (e) { $("ort-answer").textContent = `failed: ${e.message}`; }
    }
    window.sampanShown = (window.sampanShown || 0) + 1;
  }

  // the given inputs (input<i>.bin), or zeros of batch 1
  const given = await Promise.all(model.inputs.map(async (di, i) => {
    const T = TYPED[di.dtype];
    if (cfg.samples && cfg.samples[i]) return new T(await (await fetch(cfg.samples[i])).arrayBuffer());
    return new T(di.shape.reduce((p, s) => p * (s < 0 ? 1 : s), 1));
  }));
  if (cfg.image && model.inputs.length === 1) {
    const paint = setupPad(cfg, (x) => show([x]), () => { paint(given[0]); return show(given); });
    paint(given[0]);
  }
  $("status").textContent = `model.wasm: ${model.inputs.map((i) => `${i.name} ${i.dtype}[${i.shape}]`).join(", ")} → ` +
    `${model.outputs.map((o) => `${o.name} ${o.dtype}[${o.shape}]`).join(", ")}`;
  await show(given);
  window.sampanAnswer = { sampan: $("sampan-answer").textContent, ort: $("ort-answer").textContent };
  window.sampanReady = true;
}

// a drawing pad whose strokes are averaged down to the model's H x W input
function setupPad(cfg, run, runGiven) {
  const [h, w] = cfg.image, pad = $("pad"), g = pad.getContext("2d", { willReadFrequently: true });
  const sy0 = pad.height / h, sx0 = pad.width / w;
  $("drawing").hidden = false;
  const clear = () => { g.fillStyle = "#000"; g.fillRect(0, 0, pad.width, pad.height); };
  clear();
  let down = false;
  const at = (e) => { const r = pad.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };
  pad.onpointerdown = (e) => { down = true; g.beginPath(); g.moveTo(...at(e)); };
  pad.onpointermove = (e) => {
    if (!down) return;
    g.lineWidth = pad.width / Math.min(h, w) * 1.2; g.lineCap = "round"; g.strokeStyle = "#fff";
    g.lineTo(...at(e)); g.stroke();
  };
  pad.onpointerup = () => { down = false; };
  $("clear").onclick = clear;
  $("sample").onclick = runGiven;
  $("run").onclick = () => {
    const px = g.getImageData(0, 0, pad.width, pad.height).data, x = new Float32Array(h * w);
    const sy = pad.height / h, sx = pad.width / w;
    for (let i = 0; i < h; i++) for (let j = 0; j < w; j++) {
      let s = 0, n = 0;
      for (let y = Math.floor(i * sy); y < Math.floor((i + 1) * sy); y++)
        for (let xx = Math.floor(j * sx); xx < Math.floor((j + 1) * sx); xx++) { s += px[4 * (y * pad.width + xx)]; n++; }
      x[i * w + j] = (s / n / 255) * cfg.pixel_max;
    }
    run(x);
  };
  // paint an input on the pad (the given one at load): one gray block a pixel
  return (x) => {
    for (let i = 0; i < h; i++) for (let j = 0; j < w; j++) {
      const v = Math.max(0, Math.min(255, Math.round(255 * Number(x[i * w + j]) / cfg.pixel_max)));
      g.fillStyle = `rgb(${v},${v},${v})`;
      g.fillRect(Math.floor(j * sx0), Math.floor(i * sy0), Math.ceil(sx0), Math.ceil(sy0));
    }
  };
}

main().catch((e) => {
  window.sampanError = String(e && e.stack ? e.stack : e);
  $("status").textContent = `error: ${e.message}`;
  $("status").className = "err";
});
