// node run_node.mjs FOLDER TMP REPS shim|wasi
// Loads FOLDER/model.wasm with model.mjs, reads TMP/in<i>.bin (raw little-endian, in the
// order of the model's input descriptors), runs it once, writes TMP/out<j>.bin, then times
// REPS more calls; prints one JSON line: {outputs: [{name, dtype, shape}], us: [...]}.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [folder, tmp, repsArg, mode] = process.argv.slice(2);
const { load } = await import(pathToFileURL(path.join(folder, "model.mjs")).href);
const TYPED = { float32: Float32Array, float64: Float64Array, int8: Int8Array, uint8: Uint8Array,
                int16: Int16Array, int32: Int32Array, int64: BigInt64Array, bool: Uint8Array };
let wasi;
if (mode === "wasi") {
  const { WASI } = await import("node:wasi");
  wasi = new WASI({ version: "preview1", args: [], env: {} });
}
const m = await load(path.join(folder, "model.wasm"), path.join(folder, "weights.bin"), { wasi });
const inputs = m.inputs.map((d, i) => {
  const b = fs.readFileSync(path.join(tmp, `in${i}.bin`));
  const T = TYPED[d.dtype];
  const copy = new Uint8Array(b.length); copy.set(b);
  return new T(copy.buffer, 0, b.length / T.BYTES_PER_ELEMENT);
});
const outs = m.run(inputs);
outs.forEach((o, j) => fs.writeFileSync(path.join(tmp, `out${j}.bin`),
  new Uint8Array(o.data.buffer, o.data.byteOffset, o.data.byteLength)));
const us = [];
const reps = Number(repsArg) || 0;
const w0 = process.hrtime.bigint();      // warm-up: 50 calls, or 1 s of them (at least 2)
for (let r = 0; r < Math.min(reps, 50) && (r < 2 || process.hrtime.bigint() - w0 < 1000000000n); r++) m.run(inputs);
for (let r = 0; r < reps; r++) {
  const t = process.hrtime.bigint();
  m.run(inputs);
  us.push(Number(process.hrtime.bigint() - t) / 1e3);
}
m.close();
console.log(JSON.stringify({ outputs: outs.map((o, j) => ({ name: o.name, dtype: m.outputs[j].dtype, shape: o.shape })), us }));
