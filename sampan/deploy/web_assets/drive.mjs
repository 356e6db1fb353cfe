// node drive.mjs NODE_MODULES URL REQUEST.json
// Opens URL (a folder `sampan deploy --target web` wrote, served on 127.0.0.1) in headless
// Chromium through playwright-core (the system browser: CHROMIUM or /usr/bin/chromium; no
// browser download), waits for the page, then runs what REQUEST asks:
//   {inputs: [[numbers...], ...], reps: N, ort: bool, screenshot: "path.png" | null,
//    click_run: bool (press the drawing pad's Run)}
// and prints one JSON line: {answer, sampan: {outputs, us}, ort: {outputs, us, version},
// drawn: the answers after Run, browser}.
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [modules, url, reqPath] = process.argv.slice(2);
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
const out = {};
try {
  const page = ctx.pages()[0] || await ctx.newPage();
  const logs = [];
  page.on("console", (m) => logs.push(m.text()));
  page.on("pageerror", (e) => logs.push(String(e)));
  await page.goto(url);
  await page.waitForFunction(() => window.sampanReady || window.sampanError, null, { timeout: 60000 });
  const err = await page.evaluate(() => window.sampanError || null);
  if (err) throw new Error(`the page failed: ${err}\n${logs.join("\n")}`);
  out.browser = ctx.browser() ? ctx.browser().version() : "";
  out.answer = await page.evaluate(() => window.sampanAnswer);
  if (req.inputs) {
    out.sampan = await page.evaluate(([x, reps]) => ({
      outputs: window.sampan.run(x), us: reps ? window.sampan.time(x, reps) : [] }), [req.inputs, req.reps || 0]);
    if (req.ort) {
      out.ort = await page.evaluate(async ([x, reps]) => {
        if (!window.sampanOrt) return null;
        return { outputs: await window.sampanOrt.run(x), us: reps ? await window.sampanOrt.time(x, reps) : [],
                 version: window.sampanOrt.version };
      }, [req.inputs, req.reps || 0]);
    }
  }
  if (req.click_run) {          // the drawing pad's Run on what it shows (the given input)
    const n = await page.evaluate(() => window.sampanShown);
    await page.click("#run");
    await page.waitForFunction((k) => window.sampanShown > k, n, { timeout: 30000 });
    out.drawn = await page.evaluate(() => ({ sampan: document.getElementById("sampan-answer").textContent,
                                            ort: document.getElementById("ort-answer").textContent }));
  }
  out.isolated = await page.evaluate(() => self.crossOriginIsolated);
  if (req.screenshot) await page.screenshot({ path: req.screenshot, fullPage: true });
} finally {
  await ctx.close();
  fs.rmSync(userDir, { recursive: true, force: true });
}
console.log(JSON.stringify(out));
