// The loader of a model that `sampan deploy --target wasm` compiled to model.wasm.
// It works in Node (>= 18) and in browsers, and needs nothing else: the module is a
// WASI "reactor" whose few system calls a small shim below answers (or Node's own WASI,
// passed as {wasi}); the weights are bytes handed to the model's create-from-memory.
//
//   import { load } from "./model.mjs";
//   const m = await load("model.wasm", "weights.bin");     // URLs, paths, or bytes
//   m.inputs   // [{name, dtype: "float32", shape: [-1, 784]}]  (-1: the batch size)
//   const [y] = m.run([new Float32Array(784)]);           // or m.run({x: ...})
//   y.data, y.shape                                        // Float32Array, [1, 10]
//
// Every error names what it got and what it expected; the model's own errors (a
// corrupted weights file, a batch over the generated maximum) come back as its text.

const TYPED = {
  float32: Float32Array, float64: Float64Array, int8: Int8Array, uint8: Uint8Array,
  int16: Int16Array, int32: Int32Array, int64: BigInt64Array, bool: Uint8Array,
};

const isNode = typeof process !== "undefined" && !!(process.versions && process.versions.node);

async function bytesOf(src, what) {
  if (src instanceof Uint8Array) return src;
  if (src instanceof ArrayBuffer) return new Uint8Array(src);
  if (ArrayBuffer.isView(src)) return new Uint8Array(src.buffer, src.byteOffset, src.byteLength);
  if (typeof src === "string" || src instanceof URL) {
    const s = String(src);
    if (isNode && !/^(https?|data|blob):/.test(s)) {
      const fs = await import("node:fs/promises");
      const { fileURLToPath } = await import("node:url");
      return new Uint8Array(await fs.readFile(s.startsWith("file:") ? fileURLToPath(s) : s));
    }
    const r = await fetch(s);
    if (!r.ok) throw new Error(`sampan model: fetching ${what} ${s}: HTTP ${r.status}`);
    return new Uint8Array(await r.arrayBuffer());
  }
  throw new TypeError(`sampan model: ${what} must be a URL, a path or bytes, got ${typeof src}`);
}

// The WASI preview1 calls a reactor built from portable C may import. Output goes to the
// console; files and the environment do not exist; anything else answers ENOSYS.
function wasiShim(getMemory) {
  const EBADF = 8, ENOSYS = 52, decoder = new TextDecoder();
  const pending = { 1: "", 2: "" };
  const view = () => new DataView(getMemory().buffer);
  const calls = {
    fd_write(fd, iovs, n, written) {
      const dv = view(); let total = 0;
      for (let i = 0; i < n; i++) {
        const ptr = dv.getUint32(iovs + 8 * i, true), len = dv.getUint32(iovs + 8 * i + 4, true);
        if (fd === 1 || fd === 2) pending[fd] += decoder.decode(new Uint8Array(getMemory().buffer, ptr, len));
        total += len;
      }
      if (fd !== 1 && fd !== 2) return EBADF;
      const lines = pending[fd].split("\n"); pending[fd] = lines.pop();
      for (const l of lines) (fd === 1 ? console.log : console.error)(l);
      dv.setUint32(written, total, true);
      return 0;
    },
    environ_sizes_get(count, size) { const dv = view(); dv.setUint32(count, 0, true); dv.setUint32(size, 0, true); return 0; },
    environ_get() { return 0; },
    args_sizes_get(count, size) { const dv = view(); dv.setUint32(count, 0, true); dv.setUint32(size, 0, true); return 0; },
    args_get() { return 0; },
    fd_prestat_get() { return EBADF; },
    fd_close() { return 0; },
    fd_fdstat_get(fd) { return fd <= 2 ? 0 : EBADF; },
    clock_time_get(id, precision, out) {
      const ns = BigInt(Math.round((typeof performance !== "undefined" ? performance.now() : Date.now()) * 1e6));
      view().setBigUint64(out, ns, true); return 0;
    },
    random_get(ptr, len) { globalThis.crypto.getRandomValues(new Uint8Array(getMemory().buffer, ptr, len)); return 0; },
    proc_exit(code) { throw new Error(`sampan model: the module exited with status ${code}`); },
  };
  return new Proxy(calls, { get: (t, k) => (k in t ? t[k] : () => ENOSYS) });
}

function cstring(mem, ptr) {
  const b = new Uint8Array(mem.buffer); let end = ptr;
  while (b[end] !== 0) end++;
  return new TextDecoder().decode(b.subarray(ptr, end));
}

function descriptors(x, mem, side) {
  const n = x[`sw_num_${side}s`](), out = [];
  for (let i = 0; i < n; i++) {
    const rank = x[`sw_${side}_rank`](i), shape = [];
    for (let j = 0; j < rank; j++) shape.push(Number(x[`sw_${side}_dim`](i, j)));
    out.push({ name: cstring(mem, x[`sw_${side}_name`](i)),
               dtype: cstring(mem, x[`sw_${side}_dtype`](i)), shape });
  }
  return out;
}

const prod = (a) => a.reduce((p, d) => p * d, 1);

export async function load(wasm, weights, { wasi } = {}) {
  const [code, wbytes] = await Promise.all([bytesOf(wasm, "model.wasm"), bytesOf(weights, "the weights")]);
  let memory = null;
  const imports = { wasi_snapshot_preview1: wasi ? wasi.wasiImport : wasiShim(() => memory) };
  const { instance } = await WebAssembly.instantiate(code, imports);
  const x = instance.exports;
  memory = x.memory;
  if (wasi) wasi.initialize(instance); else if (x._initialize) x._initialize();
  for (const f of ["sw_create", "sw_run", "sw_error", "sw_alloc", "sw_num_inputs"])
    if (typeof x[f] !== "function")
      throw new Error(`sampan model: model.wasm does not export ${f}: not built by sampan deploy --target wasm`);
  const wptr = x.sw_alloc(wbytes.length);
  if (!wptr) throw new Error(`sampan model: out of memory for ${wbytes.length} bytes of weights`);
  new Uint8Array(memory.buffer, wptr, wbytes.length).set(wbytes);
  const handle = x.sw_create(wptr, wbytes.length);
  if (!handle) throw new Error(`sampan model: ${cstring(memory, x.sw_error())}`);
  const inputs = descriptors(x, memory, "input"), outputs = descriptors(x, memory, "output");
  for (const d of [...inputs, ...outputs])
    if (!TYPED[d.dtype]) throw new Error(`sampan model: ${d.name} has dtype ${d.dtype}, which this loader does not know`);
  const size = (d, b) => prod(d.shape.map((s) => (s < 0 ? b : s)));
  let bufs = null;   // the wasm-side buffers of the last batch size

  function buffers(batch) {
    if (bufs && bufs.batch === batch) return bufs;
    if (bufs) for (const p of bufs.ptrs) x.sw_free(p);
    const all = [...inputs, ...outputs];
    const ptrs = all.map((d) => x.sw_alloc(Math.max(1, size(d, batch) * TYPED[d.dtype].BYTES_PER_ELEMENT)));
    const table = x.sw_alloc(4 * all.length);
    if (ptrs.some((p) => !p) || !table) throw new Error(`sampan model: out of memory for batch ${batch}`);
    ptrs.push(table);
    bufs = { batch, ptrs };
    return bufs;
  }

  function run(given) {
    const list = Array.isArray(given) ? given
      : inputs.map((d) => {
          if (!(d.name in given)) throw new Error(`sampan model: run() is missing input ${d.name}; expected ${inputs.map((i) => i.name).join(", ")}`);
          return given[d.name];
        });
    if (list.length !== inputs.length)
      throw new Error(`sampan model: run() got ${list.length} inputs, expected ${inputs.length} (${inputs.map((i) => i.name).join(", ")})`);
    let batch = null;
    list.forEach((a, i) => {
      const d = inputs[i], T = TYPED[d.dtype];
      if (!(a instanceof T)) throw new TypeError(`sampan model: input ${d.name} must be a ${T.name} (${d.dtype}), got ${a && a.constructor ? a.constructor.name : typeof a}`);
      const per = size(d, 1);
      if (d.shape.includes(-1)) {
        if (a.length === 0 || a.length % per) throw new Error(`sampan model: input ${d.name} has ${a.length} elements, expected a positive multiple of ${per} (shape [${d.shape}])`);
        const b = a.length / per;
        if (batch !== null && b !== batch) throw new Error(`sampan model: input ${d.name} gives batch ${b}, an earlier input gave ${batch}`);
        batch = b;
      } else if (a.length !== per) throw new Error(`sampan model: input ${d.name} has ${a.length} elements, expected ${per} (shape [${d.shape}])`);
    });
    batch = batch || 1;
    const { ptrs } = buffers(batch), table = ptrs[ptrs.length - 1], nIn = inputs.length;
    list.forEach((a, i) => new Uint8Array(memory.buffer, ptrs[i], a.byteLength).set(new Uint8Array(a.buffer, a.byteOffset, a.byteLength)));
    const tv = new Uint32Array(memory.buffer, table, ptrs.length - 1);
    for (let i = 0; i < ptrs.length - 1; i++) tv[i] = ptrs[i];
    const rc = x.sw_run(handle, batch, table, table + 4 * nIn);
    if (rc !== 0) throw new Error(`sampan model: ${cstring(memory, x.sw_error())}`);
    return outputs.map((d, j) => {
      const T = TYPED[d.dtype], n = size(d, batch);
      return { name: d.name, shape: d.shape.map((s) => (s < 0 ? batch : s)),
               data: new T(memory.buffer.slice(ptrs[nIn + j], ptrs[nIn + j] + n * T.BYTES_PER_ELEMENT)) };
    });
  }

  function close() {
    if (bufs) for (const p of bufs.ptrs) x.sw_free(p);
    bufs = null;
    x.sw_destroy(handle);
    x.sw_free(wptr);
  }

  return { inputs, outputs, run, close };
}
