// node drive.mjs NODE_MODULES REQUEST.json
// Opens each page of REQUEST (folders `sampan deploy --target web` wrote, served on
// 127.0.0.1) in one headless Chromium through playwright-core (the system browser: CHROMIUM
// or /usr/bin/chromium; no browser download), waits for it, then runs what it asks:
//   {pages: [{url, inputs: [[numbers...], ...] | null, reps: N, ort: bool,
//             screenshot: "path.png" | null, click_run: bool (press the pad's Run)}]}
// and prints one JSON line, a list with one result a page: {answer, sampan: {outputs, us},
// ort: {outputs, us, version}, drawn: the answers after Run, browser, isolated}.
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [modules, reqPath] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "noop.js"));
const { chromium } = require("playwright-core");
const req = JSON.parse(fs.readFileSync(reqPath, "utf8"));
const userDir = fs.mkdtempSync(path.join(path.dirname(path.resolve(reqPath)), "chromium-"));
const ctx = await chromium.launchPersistentContext(userDir, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});

async function visit(job) {
  const out = {};
  const page = await ctx.newPage();
  const logs = [];
  page.on("console", (m) => logs.push(m.text()));
  page.on("pageerror", (e) => logs.push(String(e)));
  await page.goto(job.url);
  await page.waitForFunction(() => window.sampanReady || window.sampanError, null, { timeout: 120000 });
  const err = await page.evaluate(() => window.sampanError || null);
  if (err) throw new Error(`the page ${job.url} failed: ${err}\n${logs.join("\n")}`);
  out.browser = ctx.browser() ? ctx.browser().version() : "";
  out.answer = await page.evaluate(() => window.sampanAnswer);
  if (job.inputs) {
    out.sampan = await page.evaluate(([x, reps]) => ({
      outputs: window.sampan.run(x), us: reps ? window.sampan.time(x, reps) : [] }), [job.inputs, job.reps || 0]);
    if (job.ort) {
      out.ort = await page.evaluate(async ([x, reps]) => {
        if (!window.sampanOrt) return null;
        return { outputs: await window.sampanOrt.run(x), us: reps ? await window.sampanOrt.time(x, reps) : [],
                 version: window.sampanOrt.version };
      }, [job.inputs, job.reps || 0]);
    }
  }
  if (job.click_run) {
    const n = await page.evaluate(() => window.sampanShown);
    await page.click("#run");
    await page.waitForFunction((k) => window.sampanShown > k, n, { timeout: 60000 });
    out.drawn = await page.evaluate(() => ({ sampan: document.getElementById("sampan-answer").textContent,
                                            ort: document.getElementById("ort-answer").textContent }));
  }
  out.isolated = await page.evaluate(() => self.crossOriginIsolated);
  if (job.screenshot) await page.screenshot({ path: job.screenshot, fullPage: true });
  await page.close();
  return out;
}

const results = [];
try {
  for (const job of req.pages) results.push(await visit(job));
} finally {
  await ctx.close();
  fs.rmSync(userDir, { recursive: true, force: true });
}
console.log(JSON.stringify(results));
