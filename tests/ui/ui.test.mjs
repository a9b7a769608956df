// The web UI end to end: a real `longhaul serve` with the trained demo model
// (assets/) packed so that its experts stream from two drive folders, driven
// in Debian's Chromium.
// Screenshots of every view are kept in ui/test-artifacts/.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { createServer } from "node:http";
import { copyFileSync, mkdtempSync, mkdirSync, readFileSync, existsSync, rmSync, renameSync, writeFileSync } from "node:fs";
import { tmpdir, homedir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const here = dirname(fileURLToPath(import.meta.url));
const uiDir = join(here, "../../ui");
// Playwright is one of the UI's own dev dependencies, in ui/node_modules.
const { chromium } = createRequire(join(uiDir, "package.json"))("playwright-core");
const artifacts = join(uiDir, "test-artifacts");
const bin =
  process.env.LONGHAUL_BIN ??
  join(process.env.CARGO_TARGET_DIR ?? join(homedir(), ".cache/longhaul/target"), "release/longhaul");
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const WAIT = 120_000;
const demoModel = join(uiDir, "../assets/longhaul-demo-moe");
// Packs report slowly enough to watch each phase; drive reads fail with
// EIO while the file `eio` exists in the scratch root.
const faults = () => `pack-delay-ms=15,store-eio-while=${join(root, "eio")}`;
// smartctl outputs the service's stand-in smartctl prints (see setHealth).
const healthFixtures = join(here, "../../service/tests/fixtures/health");

let root, service, browser, page, url, token, packPath;

/** Makes the stand-in smartctl print the recorded output `name`. */
function setHealth(name) {
  copyFileSync(join(healthFixtures, name), join(root, "health.json"));
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

async function api(method, path, body) {
  const res = await fetch(url + path, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return text ? JSON.parse(text) : null;
}

async function waitFor(check, what, timeout = WAIT) {
  const start = Date.now();
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() - start > timeout) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

async function shot(name) {
  await page.screenshot({ path: join(artifacts, `${name}.png`), fullPage: true });
}

before(async () => {
  assert.ok(existsSync(bin), `the longhaul binary is built at ${bin}`);
  assert.ok(existsSync(join(uiDir, "dist/index.html")), "the UI is built (npm run build)");
  assert.ok(existsSync(join(demoModel, "config.json")), `the demo model is at ${demoModel}`);
  // Kept, not cleared: the desktop smoke test leaves desktop.png here too.
  mkdirSync(artifacts, { recursive: true });
  root = mkdtempSync(join(tmpdir(), "longhaul-ui-"));
  const model = demoModel;
  const drives = [0, 1].map((i) => join(root, `drive${i}`));
  drives.forEach((d) => mkdirSync(d));
  packPath = join(root, "pack");
  execFileSync(bin, ["pack", model, "--out", packPath, "--drives", drives.join(","), "--split-threshold", "4K"], { stdio: "ignore" });
  // The probe the dashboard draws as each drive's ceiling.
  execFileSync(bin, ["drives", "probe", "--model", packPath, "--bytes", "1M"], { stdio: "ignore" });
  const data = join(root, "data");
  // Disk health comes from a stand-in smartctl printing recorded outputs.
  setHealth("nvme.json");
  writeFileSync(join(root, "smartctl"), `#!/bin/sh\ncat '${join(root, "health.json")}'\n`, { mode: 0o755 });
  // A budget of a few experts (of 192): most lookups read from the drives.
  // Packs written through it report slowly enough to watch each phase.
  service = spawn(bin, ["serve", "--data-dir", data, "--port", "0", "--budget", "2M", "--ui-dir", join(uiDir, "dist")], {
    stdio: "ignore",
    env: { ...process.env, LONGHAUL_FAULTS: faults(), LONGHAUL_SMARTCTL: join(root, "smartctl") },
  });
  url = await waitFor(() => existsSync(join(data, "endpoint")) && readFileSync(join(data, "endpoint"), "utf8").trim(), "the service");
  token = readFileSync(join(data, "token"), "utf8").trim();
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
  });
  page = await browser.newPage({ viewport: { width: 1360, height: 900 } });
  page.on("pageerror", (e) => console.error("page error:", e.message));
  await page.goto(`${url}/#token=${token}`);
});

after(async () => {
  await browser?.close();
  if (service && service.exitCode === null) {
    // Let it finish writing (heat, state) before its folders go.
    const exited = new Promise((r) => service.once("exit", r));
    service.kill("SIGTERM");
    await Promise.race([exited, sleep(15_000)]);
  }
  if (root) rmSync(root, { recursive: true, force: true, maxRetries: 3 });
});

test("models: an empty list, then a pack added through the form", async () => {
  await page.click("nav a[data-view=models]");
  await page.waitForSelector("#models .empty");
  await page.fill('#add-model input[name="name"]', "demo");
  await page.fill('#add-model input[name="path"]', join(root, "nowhere"));
  await page.click("#add-model button[type=submit]");
  const err = await page.waitForSelector('#add-model [data-field="path"] .field-error');
  assert.match(await err.textContent(), /nowhere: no such file or folder/);
  await page.fill('#add-model input[name="path"]', packPath);
  await page.click("#add-model button[type=submit]");
  await page.waitForSelector("#models li b:text('demo')");
  // The pack's details: family, parameters, storage, RAM and drives.
  await page.click("#models .model-details summary");
  const details = await page.textContent("#models .model-details");
  assert.match(details, /qwen3_moe · 17\.\d M parameters, \d+\.\d M active/);
  assert.match(details, /32 per layer in 6 layers, 4 per token/);
  assert.match(details, /1,024 tokens/);
  assert.equal(await page.$$eval("#models .model-details tbody tr", (r) => r.length), 2, "both drives");
  await shot("models");
});

test("models: a checkpoint packed across two drives from the form, with progress", async () => {
  const drives = [0, 1].map((i) => join(root, `ui-drive${i}`));
  drives.forEach((d) => mkdirSync(d));
  await page.fill('#pack input[name="name"]', "packed-here");
  await page.fill('#pack input[name="source"]', demoModel);
  await page.click("#pack button[type=submit]");
  const err = await page.waitForSelector('#pack [data-field="drives"] .field-error');
  assert.match(await err.textContent(), /at least one drive/);
  await page.fill('#pack textarea[name="drives"]', drives.join("\n"));
  await page.click("#pack button[type=submit]");
  // The experts being written, with their own bytes and rate, then the resident weights.
  const writing = await page.waitForSelector("#packs li.pack[data-state=running] .job-meta:has-text('writing experts')", { timeout: WAIT });
  assert.match(await writing.textContent(), /writing experts · [\d.]+ \w+ of [\d.]+ MiB · [\d.]+ MB\/s/);
  await shot("models-packing");
  await page.waitForSelector("#packs li.pack .job-meta:has-text('writing resident weights'), #packs li.pack[data-state=done]", { timeout: WAIT });
  await page.waitForSelector("#packs li.pack[data-state=done]", { timeout: WAIT });
  assert.match(await page.textContent("#packs"), /MB\/s/);
  await page.waitForSelector("#models li b:text('packed-here')");
  await shot("models-packed");
  const models = (await api("GET", "/api/models")).models;
  assert.ok(models.some((m) => m.name === "packed-here" && m.kind === "local"));
});

test("tasks: bad input is explained inline, a task is queued and finishes", async () => {
  await page.click("nav a[data-view=tasks]");
  await page.waitForSelector("#new-task");
  await page.waitForSelector("#jobs .empty");
  await page.click("#submit");
  const empty = await page.waitForSelector('[data-field="prompt"] .field-error');
  assert.match(await empty.textContent(), /Describe the task/);
  await page.fill('textarea[name="prompt"]', "Draft an architecture for a storage engine");
  await page.fill('input[name="temperature"]', "-1");
  await page.click("#submit");
  const bad = await page.waitForSelector('[data-field="temperature"] .field-error');
  assert.match(await bad.textContent(), /temperature/);
  await shot("tasks-error");
  assert.equal((await api("GET", "/api/jobs")).jobs.length, 0, "nothing queued by bad input");

  await page.fill('input[name="temperature"]', "0");
  await page.fill('input[name="title"]', "Storage engine draft");
  // More than the demo model's 1,024-token context: counting says so first.
  await page.fill('input[name="max_tokens"]', "5000");
  await page.click("#count");
  await page.waitForSelector("#token-count.warn:has-text('does not fit')");
  assert.match(await page.textContent("#token-count"), /of the model's 1024-token context/);
  await page.fill('input[name="max_tokens"]', "300");
  await page.click("#count");
  await page.waitForSelector("#token-count:not(.warn):has-text('prompt tokens')");
  // Before queueing: the RAM, the first token and the end, from the demo pack's probed drives or its finished tasks.
  await page.waitForSelector("#forecast:has-text('needs about')");
  assert.match(await page.textContent("#forecast"), /Forecast: needs about [\d.]+ [KMG]iB of RAM, first token in .+, done in .+ \((from the medians|at least)/);
  await page.click("#submit");
  await page.waitForSelector("#jobs li.job a:text('Storage engine draft')");
  await page.waitForSelector("#jobs li.job[data-state=done]", { timeout: WAIT });
  await shot("tasks");
});

test("pause and resume a long task from the queue", async () => {
  await page.fill('input[name="title"]', "Long audit");
  await page.fill('textarea[name="prompt"]', "Audit every module");
  // Greedy: the demo model's own sampling may end an answer early.
  await page.check('input[name="greedy"]');
  // Long, and within the demo model's context of 1,024 tokens.
  await page.fill('input[name="max_tokens"]', "900");
  await page.click("#submit");
  const row = "#jobs li.job:has(a:text('Long audit'))";
  await page.waitForSelector(`${row}[data-state=running]`, { timeout: WAIT });
  await waitFor(async () => (await api("GET", "/api/jobs")).jobs.find((j) => j.title === "Long audit")?.tokens > 0, "tokens");
  await page.click(`${row} button[data-act=pause]`);
  await page.waitForSelector(`${row}[data-state=paused]`);
  await page.waitForSelector(`${row} .reason:has-text('paused by the user')`);
  await shot("tasks-paused");
  await page.click(`${row} button[data-act=resume]`);
  await page.waitForSelector(`${row}[data-state=running], ${row}[data-state=done]`, { timeout: WAIT });
});

test("results: the output renders with statistics while the task runs", async () => {
  const job = (await api("GET", "/api/jobs")).jobs.find((j) => j.title === "Long audit");
  // The list follows the streamed tokens by patching its rows: the link under
  // the pointer stays the same node, so a click while tokens arrive lands.
  const link = await page.$(`#jobs li.job a:text('Long audit')`);
  const meta = `#jobs li.job:has(a:text('Long audit')) .job-meta`;
  const shownBefore = await page.textContent(meta);
  await waitFor(async () => (await page.textContent(meta)) !== shownBefore || (await api("GET", `/api/jobs/${job.id}`)).state === "done", "the row to follow the tokens");
  // A state change redraws the whole row; tokens alone must not.
  if ((await api("GET", `/api/jobs/${job.id}`)).state === "running") {
    assert.ok(await link.evaluate((a) => a.isConnected), "the row's link survives a redraw");
  }
  await link.click();
  await page.waitForSelector(".view-job .stats");
  await page.waitForFunction(() => (document.querySelector("#output")?.textContent ?? "").length > 20, null, { timeout: WAIT });
  const before = (await page.textContent("#output")).length;
  await waitFor(async () => (await page.textContent("#output")).length > before || (await api("GET", `/api/jobs/${job.id}`)).state === "done", "output to grow");
  // The task's own chart, from the service's history of the seconds it ran.
  await page.waitForSelector(".job-chart:not([hidden]) #c-job .uplot", { timeout: 20_000 });
  await shot("results");
  assert.ok((await page.$$(".drive-reads")).length <= 1, "live updates replace the drive table, not add to it");
  const first = (await api("GET", "/api/jobs")).jobs.find((j) => j.title === "Storage engine draft");
  await page.goto(`${url}/#/job/${first.id}`);
  await page.waitForSelector(".view-job .badge.state-done");
  assert.equal((await page.$$(".drive-reads tbody tr")).length, 2, "bytes read from each of the two drives");
  const text = await page.textContent("#output");
  const stored = (await api("GET", `/api/jobs/${first.id}`)).output;
  assert.ok(text.trim().length > 0 && stored.length > 0);
  // Find in the result: every match is marked and counted.
  const word = stored.split(/\W+/).find((w) => w.length >= 4);
  await page.fill("#find", word);
  await page.waitForSelector("#output mark");
  assert.match(await page.textContent("#found"), /^[1-9]\d* found$/);
  await page.fill("#find", "");
  const exportLink = await page.getAttribute("a:text('Export Markdown')", "href");
  const md = await (await fetch(url + exportLink)).text();
  assert.match(md, /^# Storage engine draft/);
});

test("dashboard: charts fill with live drive, cache and token data", async () => {
  await page.click("nav a[data-view=dashboard]");
  await page.waitForSelector("#c-drives .uplot");
  // A few seconds of samples while the long task streams experts.
  await waitFor(async () => {
    const s = await page.textContent("#summary");
    const m = s.match(/(\d+) s of history/);
    return m && Number(m[1]) >= 5;
  }, "five seconds of metrics");
  // The service's history can fill the charts before the probe is read: wait for the ceilings.
  const ceilingRows = async () => (await page.$$eval("#c-drives .u-legend .u-series", (rows) => rows.map((r) => r.textContent ?? ""))).filter((l) => l.includes("ceiling")).length;
  await waitFor(async () => (await ceilingRows()) >= 2, "the probed ceilings", 15_000).catch(() => {});
  const legend = await page.$$eval("#c-drives .u-legend .u-series", (rows) => rows.map((r) => r.textContent ?? ""));
  assert.equal(legend.filter((l) => l.includes("ceiling")).length, 2, `a probed ceiling per drive: ${legend.join(" | ")}`);
  assert.ok(legend.length >= 6, `two drives, a total and two ceilings (${legend.length} legend rows)`);
  const m = await api("GET", "/api/metrics");
  assert.ok(m.metrics.engine.drives.every((d) => d.bytes > 0), "both drives read");
  assert.ok(m.metrics.engine.drives.every((d) => d.busy_share >= 0 && d.busy_share <= 1), "busy shares");
  const busy = await page.$$eval("#c-busy .u-legend .u-series", (rows) => rows.length);
  assert.ok(busy >= 2, `a busy share per drive (${busy} legend rows)`);
  const hitLegend = await page.textContent("#c-hit .u-legend");
  assert.match(hitLegend ?? "", /prefetch recall/);
  assert.match((await page.textContent("#summary")) ?? "", /prefetch recall/);
  await page.waitForFunction(() => (document.querySelector("#heat")?.width ?? 0) > 0, null, { timeout: 20_000 });
  await shot("dashboard");
});

test("drives: every drive folder of both packs, with space, model bytes and probed rate", async () => {
  await page.click("nav a[data-view=drives]");
  await page.waitForSelector("#drives table");
  const rows = await page.$$("#drives tbody tr");
  assert.equal(rows.length, 4, "two drives for each of the two packs");
  assert.equal(await page.$$eval("#drives .badge.state-done", (b) => b.length), 4);
  assert.equal(await page.locator("#drives td .hint", { hasText: "probed" }).count(), 2, "the probed pack's drives show their rate");
  // Probing the other pack from the page gives its drives a ceiling too.
  await waitFor(async () => (await api("GET", "/api/queue")).running === null, "the queue to be idle");
  await page.click("#probe-row button[data-probe='packed-here']");
  await page.waitForSelector(".toast:has-text('MB/s from all its drives')", { timeout: WAIT });
  await waitFor(async () => (await page.locator("#drives td .hint", { hasText: "probed" }).count()) === 4, "four probed drives");
  await shot("drives");
});

test("settings and keyboard shortcuts", async () => {
  await page.click("nav a[data-view=settings]");
  await page.waitForSelector("#info dl");
  assert.match(await page.textContent("#info"), /2.0 MiB/);
  await shot("settings");
  await page.keyboard.press("n");
  await page.waitForSelector("#new-task");
  await page.waitForFunction(() => document.activeElement?.getAttribute("name") === "prompt");
  await page.click("body");
  await page.keyboard.press("/");
  await page.waitForFunction(() => document.activeElement?.id === "search");
  await page.keyboard.type("zzz-no-match");
  await page.waitForSelector("#jobs .empty:has-text('No task matches')");
  await page.click("body");
  await page.keyboard.press("?");
  await page.waitForSelector("#shortcuts:has-text('Ctrl/⌘ + Enter')");
  await shot("shortcuts");
  await page.keyboard.press("Escape");
  await page.waitForSelector("#shortcuts", { state: "hidden" });
});

test("cancel asks once more: Keep it leaves the task alone, End task ends it", async () => {
  // Held in the queue, the task cannot finish while the question is asked.
  await api("POST", "/api/queue/pause");
  try {
    await page.fill("#search", "");
    await page.fill('input[name="title"]', "Cancel me");
    await page.fill('textarea[name="prompt"]', "Audit the cache");
    await page.check('input[name="greedy"]');
    await page.fill('input[name="max_tokens"]', "900");
    await page.click("#submit");
    const row = "#jobs li.job:has(a:text('Cancel me'))";
    await page.waitForSelector(row);
    await page.click(`${row} button[data-act=cancel]`);
    await page.waitForSelector(`${row} .confirm:has-text('End it for good?')`);
    await page.click(`${row} button[data-act=keep]`);
    await page.waitForSelector(`${row} button[data-act=cancel]`);
    const id = (await api("GET", "/api/jobs")).jobs.find((j) => j.title === "Cancel me").id;
    assert.notEqual((await api("GET", `/api/jobs/${id}`)).state, "cancelled", "one click ends nothing");
    await page.click(`${row} button[data-act=cancel]`);
    await page.click(`${row} button[data-act=cancel-confirm]`);
    await page.waitForSelector(`${row}[data-state=cancelled]`, { timeout: WAIT });
  } finally {
    await api("POST", "/api/queue/resume");
  }
});

test("a long prompt shows its reading in Tasks, Results, the Dashboard and the title within 2 s", async () => {
  // A second service whose forward passes each wait 1.5 s: the prompt reads for seconds.
  const data = join(root, "slow-data");
  const slow = spawn(bin, ["serve", "--data-dir", data, "--port", "0", "--ui-dir", join(uiDir, "dist")], {
    stdio: "ignore",
    env: { ...process.env, LONGHAUL_FAULTS: "token-delay-ms=1500" },
  });
  const ctx = await browser.newContext({ viewport: { width: 1360, height: 900 } });
  try {
    const slowUrl = await waitFor(() => existsSync(join(data, "endpoint")) && readFileSync(join(data, "endpoint"), "utf8").trim(), "the slow service");
    const slowToken = readFileSync(join(data, "token"), "utf8").trim();
    const call = async (method, path, body) =>
      (await fetch(slowUrl + path, { method, headers: { Authorization: `Bearer ${slowToken}`, "Content-Type": "application/json" }, body: body && JSON.stringify(body) })).json();
    await call("POST", "/api/models", { name: "demo", path: packPath });
    const p = await ctx.newPage();
    await p.goto(`${slowUrl}/#token=${slowToken}`);
    // Before anything ran, the empty memory chart still reads in bytes that mean something.
    await p.click("nav a[data-view=dashboard]");
    await p.waitForSelector("#c-ram[data-y-max]");
    assert.ok(Number(await p.getAttribute("#c-ram", "data-y-max")) >= 1 << 20, "the empty memory axis spans at least 1 MiB");
    await p.click("nav a[data-view=tasks]");
    await p.waitForSelector("#new-task");
    // Over one pass of 512, within the demo model's 1,024-token context.
    const prompt = "Audit the storage engine, module by module. ".repeat(64);
    const job = await call("POST", "/api/jobs", { model: "demo", title: "Long prompt", prompt, max_tokens: 4 });
    assert.ok(job.id, JSON.stringify(job));
    const row = "#jobs li.job:has(a:text('Long prompt'))";
    const started = Date.now();
    await p.waitForSelector(`${row} .job-meta:has-text('Reading the prompt')`, { timeout: 5_000 });
    await p.waitForSelector(`${row} .progress.prompt`);
    assert.ok(Date.now() - started < 2_000 + 1_500, "the reading shows at the first report");
    assert.match(await p.title(), /^Reading prompt \d+% · Longhaul$/);
    await p.screenshot({ path: join(artifacts, "tasks-prompt.png"), fullPage: true });
    await p.goto(`${slowUrl}/#/job/${job.id}`);
    await p.waitForSelector(".view-job .phase:has-text('Reading the prompt')", { timeout: 5_000 });
    assert.match(await p.textContent("#output"), /Reading the prompt/);
    assert.doesNotMatch(await p.textContent(".job-stats"), /Wall time\s*–/, "a running job's figures are shown, not dashes");
    await p.screenshot({ path: join(artifacts, "results-prompt.png"), fullPage: true });
    await p.click("nav a[data-view=dashboard]");
    await p.waitForSelector("#summary .phase:has-text('Reading the prompt')", { timeout: 5_000 });
    await p.screenshot({ path: join(artifacts, "dashboard-prompt.png"), fullPage: true });
    // Cancel while the prompt is read: the job ends within a pass.
    await call("POST", `/api/jobs/${job.id}/cancel`);
    await waitFor(async () => (await call("GET", "/api/queue")).running === null, "the runner to let go", 5_000);
  } finally {
    await ctx.close();
    const exited = new Promise((r) => slow.once("exit", r));
    slow.kill("SIGTERM");
    await Promise.race([exited, sleep(15_000)]);
  }
});

test("banner: a paused queue says so with Resume, and a removed drive names the paused task", async () => {
  await page.goto(`${url}/#/tasks`);
  await api("POST", "/api/queue/pause");
  await page.waitForSelector("#banner:has-text('The queue is paused')", { timeout: 15_000 });
  await shot("banner-queue-paused");
  await page.click("#banner button[data-banner=resume-queue]");
  await page.waitForSelector("#banner", { state: "hidden" });
  assert.equal((await api("GET", "/api/queue")).paused, false);

  // A drive folder of the running task's pack disappears.
  const job = await api("POST", "/api/jobs", { model: "demo", title: "Drive test", prompt: "Audit the drives", max_tokens: 900, temperature: 0 });
  await waitFor(async () => (await api("GET", `/api/jobs/${job.id}`)).tokens > 0, "the task to write");
  const drive = join(root, "drive1");
  renameSync(drive, `${drive}-gone`);
  try {
    await page.waitForSelector("#banner:has-text('Drive test')", { timeout: 20_000 });
    assert.match(await page.textContent("#banner"), /is paused: drive missing/);
    await page.click("nav a[data-view=dashboard]");
    await page.waitForFunction(() => /paused: drive missing/.test(document.querySelector("#summary")?.textContent ?? ""), null, { timeout: 15_000 });
    // The pause is marked on the charts' time axis, and kept by the service.
    await page.waitForFunction(() => Number(document.querySelector("#c-tok .uplot")?.dataset.marks ?? 0) >= 1, null, { timeout: 15_000 });
    await waitFor(async () => (await api("GET", "/api/metrics/history")).marks.some((m) => m.job === job.id && m.kind === "paused"), "the mark in the history");
    await shot("banner-drive-missing");
  } finally {
    renameSync(`${drive}-gone`, drive);
  }
  await api("POST", `/api/jobs/${job.id}/cancel`);
  await page.waitForSelector("#banner", { state: "hidden", timeout: 15_000 });
});

test("disk health: each disk's figures and link, a hot night's warnings in the view and the banner, and why a hidden disk says nothing", async () => {
  await page.goto(`${url}/#/drives`);
  await page.click("#read-health");
  await page.waitForSelector(".disk:has-text('Samsung SSD 990 PRO 2TB')");
  const card = await page.textContent(".disk");
  assert.match(card, /Temperature\s*47 °C/);
  assert.match(card, /Endurance used\s*3 %/);
  assert.match(card, /Unsafe shutdowns\s*27/);
  // Every folder of both packs is in one temporary directory: one disk, and each row says so.
  assert.equal(await page.locator(".disk").count(), 1);
  assert.equal(await page.locator("#drives .hint.warn", { hasText: "On one device with" }).count(), 4);
  setHealth("nvme-hot-errors.json");
  await page.click("#read-health");
  await page.waitForSelector(".disk.warned li[data-kind=hot]:has-text('79 °C')");
  assert.equal(await page.locator(".disk li[data-kind=failing]", { hasText: "temperature past a threshold" }).count(), 1);
  assert.equal(await page.locator(".disk li[data-kind=new_errors]", { hasText: "2 new media errors" }).count(), 1);
  assert.equal(await page.locator(".disk svg.spark").count(), 1, "the day's temperatures are drawn");
  await page.waitForSelector("#banner:has-text('runs hot: 79 °C')", { timeout: 15_000 });
  await shot("drives-health-warnings");
  setHealth("usb-hidden.json");
  await page.click("#read-health");
  await page.waitForSelector(".disk:has-text('No health')");
  assert.match(await page.textContent(".disk"), /USB bridge \(USB id 0x152d:0x0578 \(0x214\)\) that does not pass the drive's health through/);
  await page.waitForSelector("#banner:has-text('runs hot')", { state: "detached", timeout: 15_000 });
  await shot("drives-health-hidden");
  setHealth("nvme.json");
  await api("POST", "/api/drives/health");
});

test("a failing drive holds the queue: its task retries by itself, the next waits, and both finish", async () => {
  await page.goto(`${url}/#/tasks`);
  const first = await api("POST", "/api/jobs", { model: "demo", title: "Fault first", prompt: "Audit the drives", max_tokens: 900, temperature: 0 });
  const next = await api("POST", "/api/jobs", { model: "demo", title: "Fault next", prompt: "Audit the cache", max_tokens: 20, temperature: 0 });
  await waitFor(async () => (await api("GET", `/api/jobs/${first.id}`)).tokens > 0, "the task to write");
  const eio = join(root, "eio");
  writeFileSync(eio, "");
  try {
    await page.waitForSelector("#banner:has-text('Fault first')", { timeout: 20_000 });
    await page.waitForSelector("#banner:has-text('retrying by itself in')", { timeout: 10_000 });
    assert.match(await page.textContent("#banner"), /storage fault.*Input\/output error.*retrying by itself in \d+ s/s);
    // Past the first retry: the next task still waits in line instead of
    // starting onto the failing drive.
    await sleep(3_000);
    assert.equal((await api("GET", `/api/jobs/${next.id}`)).state, "queued");
    await page.waitForSelector("#jobs li.job:has(a:text('Fault next')) :text('in line')");
    await shot("banner-fault-retrying");
  } finally {
    rmSync(eio, { force: true });
  }
  // No one presses Resume.
  for (const id of [first.id, next.id]) {
    await waitFor(async () => (await api("GET", `/api/jobs/${id}`)).state === "done", `task ${id} to finish`);
  }
  await page.waitForSelector("#banner", { state: "hidden", timeout: 15_000 });
});

test("Resume all resumes every paused task at once", async () => {
  await api("POST", "/api/queue/pause");
  const ids = [];
  for (const title of ["Held one", "Held two"]) {
    const job = await api("POST", "/api/jobs", { model: "demo", title, prompt: "Name the risks", max_tokens: 8, temperature: 0 });
    await api("POST", `/api/jobs/${job.id}/pause`);
    ids.push(job.id);
  }
  await page.goto(`${url}/#/tasks`);
  const paused = (await api("GET", "/api/jobs")).jobs.filter((j) => j.state === "paused").length;
  assert.ok(paused >= 2);
  await page.waitForSelector(`#resume-all:has-text('Resume all ${paused} paused')`, { timeout: 15_000 });
  await shot("tasks-resume-all");
  await page.click("#resume-all");
  for (const id of ids) {
    await waitFor(async () => (await api("GET", `/api/jobs/${id}`)).state !== "paused", `task ${id} to leave its pause`, 10_000);
  }
  await page.waitForSelector("#resume-all", { state: "hidden" });
  assert.equal((await api("GET", "/api/queue")).paused, false, "the queue is resumed too");
  for (const id of ids) {
    await waitFor(async () => (await api("GET", `/api/jobs/${id}`)).state === "done", `task ${id} to finish`);
  }
});

test("an answer stuck in a loop is pointed out in Results, and penalties are set in the form", async () => {
  // A penalty below 1 favours what was written: the demo loops on a phrase.
  const looped = await api("POST", "/api/jobs", { model: "demo", title: "Looping", prompt: "Audit the cache", max_tokens: 160, temperature: 0, repetition_penalty: 0.5 });
  await waitFor(async () => (await api("GET", `/api/jobs/${looped.id}`)).state === "done", "the looping task");
  await page.goto(`${url}/#/job/${looped.id}`);
  await page.waitForSelector(".loop-warning", { timeout: 15_000 });
  assert.match(await page.textContent(".loop-warning"), /repeats “the same as” \d+ times/);
  await shot("results-loop");
  // The same task from the form with a repetition penalty above 1.
  await page.goto(`${url}/#/tasks`);
  await page.waitForSelector("#new-task");
  await page.fill('#new-task input[name="title"]', "Penalised");
  await page.check('#new-task input[value="prompt"]');
  await page.fill('#new-task textarea[name="prompt"]', "Audit the cache");
  await page.fill('#new-task input[name="max_tokens"]', "160");
  await page.check('#new-task input[name="greedy"]');
  await page.fill('#new-task input[name="repetition_penalty"]', "1.3");
  await page.click("#new-task button[type=submit]");
  const job = await waitFor(async () => (await api("GET", "/api/jobs")).jobs.find((j) => j.title === "Penalised"), "the penalised task");
  assert.equal(job.request.settings.repetition_penalty, 1.3);
  const done = await waitFor(async () => {
    const j = await api("GET", `/api/jobs/${job.id}`);
    return j.state === "done" && j;
  }, "the penalised task to finish");
  await page.goto(`${url}/#/job/${done.id}`);
  await page.waitForSelector("#output");
  assert.equal(await page.$$eval(".loop-warning", (e) => e.length), 0, "no loop: " + done.output.slice(-120));
});

test("a refused token says so, and opening the printed address in the same tab connects", async () => {
  await page.goto(`${url}/#token=0123abcd`);
  await page.waitForSelector("#conn:has-text('token refused')", { timeout: 15_000 });
  assert.match(await page.textContent("#banner"), /refused this page's access token/);
  await shot("token-refused");
  await page.goto(`${url}/#token=${token}`);
  await page.waitForSelector("#conn:has-text('connected')", { timeout: 15_000 });
  await page.waitForSelector("#banner", { state: "hidden" });
  await page.waitForSelector("#new-task");
});

test("a tab opened in the morning shows the night: the dashboard's history comes from the service", async () => {
  const ctx = await browser.newContext({ viewport: { width: 1360, height: 900 } });
  try {
    const p = await ctx.newPage();
    await p.goto(`${url}/#token=${token}`);
    await p.click("nav a[data-view=dashboard]");
    const opened = Date.now();
    await p.waitForFunction(() => {
      const m = (document.querySelector("#summary")?.textContent ?? "").match(/(\d+) s of history/);
      return m && Number(m[1]) >= 20;
    }, null, { timeout: 10_000 });
    assert.ok(Date.now() - opened < 10_000, "more seconds than the tab has been open");
    await p.selectOption("#range", String(12 * 3600));
    await p.waitForFunction(() => /(\d+) min of history/.test(document.querySelector("#summary")?.textContent ?? ""), null, { timeout: 10_000 });
    await p.screenshot({ path: join(artifacts, "dashboard-history.png"), fullPage: true });
  } finally {
    await ctx.close();
  }
});

test("the morning view: every task with its figures, filters, and the next step for each", async () => {
  await page.goto(`${url}/#/report`);
  await page.waitForSelector("table.report tbody tr[data-id]");
  const all = await page.$$eval("table.report tbody tr[data-id]", (r) => r.length);
  const jobs = (await api("GET", "/api/jobs")).jobs;
  assert.equal(all, jobs.length, "every task is listed");
  assert.match(await page.textContent("#report-sum"), /\d+ tasks · [\d,]+ tokens · .* of experts read/);
  await shot("report");
  // Filters: state, then a date range with nothing in it.
  await page.selectOption('#report-filters select[name="state"]', "done");
  const states = await page.$$eval("table.report tbody tr[data-id]", (r) => r.map((x) => x.dataset.state));
  assert.ok(states.length > 0 && states.every((x) => x === "done"), states.join());
  await page.fill('#report-filters input[name="to"]', "2000-01-01");
  await page.waitForSelector("table.report tbody .empty:has-text('No task matches')");
  await page.fill('#report-filters input[name="to"]', "");
  // Re-run: the same input and settings as a new task.
  const source = jobs.find((j) => j.title === "Storage engine draft");
  await page.click(`table.report tr[data-id="${source.id}"] button[data-act=rerun]`);
  const again = await waitFor(async () => (await api("GET", "/api/jobs")).jobs.find((j) => j.title === "Storage engine draft (again)"), "the re-run");
  assert.deepEqual(again.request.settings.max_tokens, source.request.settings.max_tokens);
  assert.deepEqual(again.request.input, source.request.input);
  // A follow-up question continues the conversation.
  page.once("dialog", (d) => d.accept("Which part is riskiest?"));
  await page.click(`table.report tr[data-id="${source.id}"] button[data-act=follow]`);
  const follow = await waitFor(async () => (await api("GET", "/api/jobs")).jobs.find((j) => j.title.startsWith("Storage engine draft: Which part")), "the follow-up");
  const turns = follow.request.input.messages;
  assert.deepEqual(turns.map((m) => m.role).slice(-3), ["user", "assistant", "user"]);
  assert.equal(turns[turns.length - 1].content, "Which part is riskiest?");
  // A follow-up on a long answer cannot keep its task's max tokens within
  // the demo's 1,024-token context: it takes what the context leaves.
  const long = jobs.find((j) => j.title === "Long audit" && j.state === "done");
  assert.ok(long, "the long task of an earlier test");
  page.once("dialog", (d) => d.accept("Summarise it"));
  await page.click(`table.report tr[data-id="${long.id}"] button[data-act=follow]`);
  const fitted = await waitFor(async () => (await api("GET", "/api/jobs")).jobs.find((j) => j.title.startsWith("Long audit: Summarise")), "the fitted follow-up");
  assert.ok(fitted.request.settings.max_tokens < long.request.settings.max_tokens, JSON.stringify(fitted.request.settings));
  // Duplicate and edit opens the form filled in.
  await page.click(`table.report tr[data-id="${source.id}"] button[data-act=edit]`);
  await page.waitForSelector("#new-task");
  // Filled in once the form has its models and presets.
  await page.waitForFunction(() => document.querySelector('#new-task input[name="title"]')?.value !== "", null, { timeout: 15_000 });
  assert.equal(await page.inputValue('input[name="title"]'), "Storage engine draft (copy)");
  assert.ok((await page.inputValue('textarea[name="prompt"]')).length > 0);
  // Delete, after a confirmation, an ended task.
  const cancelled = (await api("GET", "/api/jobs")).jobs.find((j) => j.state === "cancelled");
  await page.goto(`${url}/#/report`);
  await page.waitForSelector(`table.report tr[data-id="${cancelled.id}"]`);
  page.once("dialog", (d) => d.accept());
  await page.click(`table.report tr[data-id="${cancelled.id}"] button[data-act=delete]`);
  await page.waitForSelector(`table.report tr[data-id="${cancelled.id}"]`, { state: "detached" });
  const gone = await fetch(`${url}/api/jobs/${cancelled.id}`, { headers: { Authorization: `Bearer ${token}` } });
  assert.equal(gone.status, 404);
});

test("opened after tasks ended, Longhaul lands on what happened while you were away", async () => {
  // A tab opened fresh (closing one counts as seen), the last visit given.
  const visit = async (lastSeen) => {
    const ctx = await browser.newContext({ viewport: { width: 1360, height: 900 } });
    await ctx.addInitScript(([t, seen]) => {
      localStorage.setItem("longhaul.token", t);
      localStorage.setItem("longhaul.lastSeen", seen);
    }, [token, String(lastSeen)]);
    const p = await ctx.newPage();
    await p.goto(`${url}/`);
    return [ctx, p];
  };
  // The earlier test's follow-ups finish first: the figures compared below stay still.
  await waitFor(async () => {
    const q = await api("GET", "/api/queue");
    return q.running === null && q.waiting === 0;
  }, "the queue to drain");
  const [ctx, p] = await visit(1);
  try {
    await p.waitForFunction(() => location.hash === "#/report", null, { timeout: 15_000 });
    await p.waitForSelector("#away:not([hidden]) .away-counts");
    const jobs = (await api("GET", "/api/jobs")).jobs;
    const count = (state) => jobs.filter((j) => j.state === state && j.finished_ms).length;
    const tokens = jobs.filter((j) => j.finished_ms).reduce((n, j) => n + j.tokens, 0);
    const counts = await p.textContent("#away .away-counts");
    assert.match(counts, new RegExp(`^${count("done")} done · ${count("failed")} failed · \\d+ paused · ${count("cancelled")} cancelled · ${tokens.toLocaleString("en-US")} tokens written`), counts);
    await p.screenshot({ path: join(artifacts, "morning-landing.png"), fullPage: true });
    // Most work first: the biggest task leads.
    await p.selectOption('#report-filters select[name="order"]', "work");
    const work = (j) => j.tokens + (j.stats?.prompt_tokens ?? 0);
    const first = await p.$eval("table.report tbody tr[data-id]", (r) => Number(r.dataset.id));
    assert.equal(work(jobs.find((j) => j.id === first)), Math.max(...jobs.map(work)));
  } finally {
    await ctx.close();
  }
  // A visit with nothing new since opens the tasks as before.
  const [later, q] = await visit(Date.now() + 3_600_000);
  try {
    await q.waitForSelector("#new-task", { timeout: 15_000 });
    assert.equal(await q.evaluate(() => location.hash), "");
  } finally {
    await later.close();
  }
});

test("after the service comes back, the open views recover without a reload", async () => {
  const port = new URL(url).port;
  const data = join(root, "data");
  const down = new Promise((r) => service.once("exit", r));
  service.kill("SIGKILL");
  await down;
  await page.waitForSelector("#conn:has-text('reconnecting')", { timeout: 15_000 });
  await page.waitForSelector("#banner:has-text('not answering')");
  // What was live is greyed and stamped with its age, and the title no
  // longer claims a running task's progress.
  await page.waitForSelector("body.stale");
  await page.waitForSelector("#conn:has-text('figures from')", { timeout: 5_000 });
  assert.match(await page.textContent("#conn"), /reconnecting… · figures from \d+ s ago/);
  assert.equal(await page.title(), "Longhaul (not connected)");
  // A view opened while the service is down shows why.
  await page.click("nav a[data-view=drives]");
  await page.click("nav a[data-view=tasks]");
  await page.waitForSelector("#form-slot .error");
  await shot("service-down");
  // Down for longer than five of the charts' one-second steps: a gap they must break at.
  await sleep(7_000);
  service = spawn(bin, ["serve", "--data-dir", data, "--port", port, "--budget", "2M", "--ui-dir", join(uiDir, "dist")], {
    stdio: "ignore",
    env: { ...process.env, LONGHAUL_FAULTS: faults(), LONGHAUL_SMARTCTL: join(root, "smartctl") },
  });
  await page.waitForSelector("#conn:has-text('connected')", { timeout: 30_000 });
  assert.equal(await page.$$eval("body.stale", (b) => b.length), 0, "fresh again");
  await page.waitForSelector("#new-task", { timeout: 15_000 });
  await page.waitForSelector("#banner", { state: "hidden" });
  await page.waitForSelector("#jobs li.job, #jobs li.empty", { timeout: 15_000 });
  assert.equal(await page.$$eval("#jobs li.error", (e) => e.length), 0, "the task list is back");
  // A task after the restart loads the model again; the charts break across
  // the outage instead of drawing a line through time nobody measured.
  const after = await api("POST", "/api/jobs", { model: "demo", title: "After the outage", prompt: "Audit the cache", max_tokens: 30, temperature: 0 });
  await waitFor(async () => (await api("GET", `/api/jobs/${after.id}`)).state === "done", "the task after the restart");
  await page.click("nav a[data-view=dashboard]");
  await waitFor(
    async () => (await page.$$eval(".uplot[data-gaps]", (us) => us.map((u) => Number(u.dataset.gaps)))).some((n) => n >= 1),
    "a chart to mark the outage",
    30_000,
  );
  await shot("dashboard-outage");
});

test("the task form shows the model's own sampling and keeps greedy one click away", async () => {
  await page.goto(`${url}/#/tasks`);
  await page.waitForSelector("#new-task");
  await page.selectOption('select[name="model"]', "demo");
  await page.waitForSelector("#sampling-note:has-text('temperature 0.7, top-p 0.9, top-k 50')");
  assert.equal(await page.getAttribute('input[name="temperature"]', "placeholder"), "0.7");
  await page.check('input[name="greedy"]');
  await page.waitForSelector("#sampling-note:has-text('Greedy')");
  assert.ok(await page.isDisabled('input[name="temperature"]'));
  await page.fill('input[name="title"]', "Greedy check");
  await page.fill('input[name="max_tokens"]', "4");
  await page.fill('textarea[name="prompt"]', "Name one cache policy");
  // Ctrl+Enter from the prompt queues it.
  await page.press('textarea[name="prompt"]', "Control+Enter");
  const job = await waitFor(async () => (await api("GET", "/api/jobs")).jobs.find((j) => j.title === "Greedy check"), "the task");
  assert.equal(job.request.settings.temperature, 0);
  await page.uncheck('input[name="greedy"]');
  await shot("task-form-sampling");
  // Files dropped on the desktop window arrive as paths: attached and counted at once.
  const notes = join(root, "dropped-notes.md");
  writeFileSync(notes, "# Notes\nThe cache evicts the coldest expert first.\n");
  await page.evaluate((p) => window.longhaulDrop({ kind: "enter", paths: [p] }), notes);
  assert.ok(await page.$("#new-task.dropping"), "the form shows where files land");
  await page.evaluate((p) => window.longhaulDrop({ kind: "drop", paths: [p] }), notes);
  assert.equal(await page.inputValue('textarea[name="attachments"]'), notes);
  await page.waitForSelector("#token-count:has-text('1 attached files')");
  await page.fill('textarea[name="attachments"]', "");
  // A system prompt and settings saved as a preset, applied to a fresh form.
  await page.fill('textarea[name="system"]', "You review storage code.");
  await page.fill('input[name="top_p"]', "0.8");
  page.once("dialog", (d) => d.accept("Night audit"));
  await page.click("#save-preset");
  await page.goto(`${url}/#/dashboard`);
  await page.goto(`${url}/#/tasks`);
  await page.waitForSelector("#new-task");
  await page.selectOption("#preset", "Night audit");
  assert.equal(await page.inputValue('textarea[name="system"]'), "You review storage code.");
  assert.equal(await page.inputValue('input[name="top_p"]'), "0.8");
  await page.fill('input[name="title"]', "With a system prompt");
  await page.fill('input[name="max_tokens"]', "2");
  await page.fill('textarea[name="prompt"]', "Name one risk");
  await page.click("#submit");
  const sys = await waitFor(async () => (await api("GET", "/api/jobs")).jobs.find((j) => j.title === "With a system prompt"), "the task");
  assert.equal(sys.request.settings.speculate, "auto", "guessing ahead is on by default");
  assert.deepEqual(sys.request.input.messages.map((m) => m.role), ["system", "user"]);
  assert.equal(sys.request.settings.top_p.toFixed(2), "0.80");
});

test("dark theme follows the system, with input borders at 3:1 or more in both themes", async () => {
  const lum = (rgb) => {
    const [r, g, b] = rgb.match(/\d+/g).slice(0, 3).map((v) => {
      const c = Number(v) / 255;
      return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const contrast = (a, b) => (Math.max(lum(a), lum(b)) + 0.05) / (Math.min(lum(a), lum(b)) + 0.05);
  for (const scheme of ["light", "dark"]) {
    const ctx = await browser.newContext({ viewport: { width: 1360, height: 900 }, colorScheme: scheme });
    try {
      const p = await ctx.newPage();
      await p.goto(`${url}/#token=${token}`);
      await p.waitForSelector("#new-task");
      const [border, field, bg] = await p.$eval('textarea[name="prompt"]', (el) => {
        const s = getComputedStyle(el);
        return [s.borderTopColor, s.backgroundColor, getComputedStyle(document.documentElement).backgroundColor];
      });
      assert.ok(contrast(border, field) >= 3, `${scheme}: input border ${border} on ${field} is ${contrast(border, field).toFixed(2)}:1`);
      assert.equal(lum(bg) < 0.1, scheme === "dark", `${scheme} page background ${bg}`);
      await p.screenshot({ path: join(artifacts, `tasks-${scheme}.png`), fullPage: true });
      if (scheme === "dark") {
        await p.click("nav a[data-view=dashboard]");
        await p.waitForSelector("#c-drives .uplot", { timeout: 15_000 }).catch(() => {});
        await p.screenshot({ path: join(artifacts, "dashboard-dark.png"), fullPage: true });
      }
    } finally {
      await ctx.close();
    }
  }
});

/** Text in the page whose contrast with what is behind it is under WCAG AA
 * (4.5:1, or 3:1 for large text), and buttons and links with no name. */
async function accessibilityProblems(p) {
  return p.evaluate(() => {
    const parse = (c) => {
      const m = c.match(/[\d.]+/g);
      if (!m) return null;
      const [r, g, b, a = 1] = m.map(Number);
      return { r, g, b, a };
    };
    const lum = ({ r, g, b }) =>
      [r, g, b]
        .map((v) => {
          v /= 255;
          return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
        })
        .reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
    const behind = (el) => {
      for (let e = el; e; e = e.parentElement) {
        const c = parse(getComputedStyle(e).backgroundColor);
        if (c && c.a > 0.5) return c;
      }
      return { r: 255, g: 255, b: 255, a: 1 };
    };
    const out = [];
    for (const el of document.querySelectorAll("body *")) {
      if (el.closest("[hidden], svg, .uplot, .skip, :disabled")) continue;
      const st = getComputedStyle(el);
      if (st.visibility === "hidden" || st.display === "none" || el.getClientRects().length === 0) continue;
      if ((el.tagName === "BUTTON" || el.tagName === "A") && !(el.getAttribute("aria-label") || el.textContent.trim())) {
        out.push(`${el.tagName} without a name: ${el.outerHTML.slice(0, 80)}`);
      }
      if (![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
      const fg = parse(st.color);
      const bg = behind(el);
      const [a, b] = [lum(fg), lum(bg)];
      const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
      const size = parseFloat(st.fontSize);
      const need = size >= 24 || (Number(st.fontWeight) >= 700 && size >= 18.66) ? 3 : 4.5;
      if (ratio < need) out.push(`${el.tagName}.${el.className} “${el.textContent.trim().slice(0, 40)}” ${st.color} on ${JSON.stringify(bg)}: ${ratio.toFixed(2)}:1`);
    }
    return out;
  });
}

test("every view meets AA contrast in both themes, names every button, and has a heading and a skip link", async () => {
  for (const scheme of ["light", "dark"]) {
    const ctx = await browser.newContext({ viewport: { width: 1360, height: 900 }, colorScheme: scheme });
    try {
      const p = await ctx.newPage();
      await p.goto(`${url}/#token=${token}`);
      await p.waitForSelector("#new-task");
      assert.equal(await p.textContent("h1"), "Longhaul");
      await p.keyboard.press("Tab");
      assert.equal(await p.evaluate(() => document.activeElement?.textContent), "Skip to content");
      await p.keyboard.press("Enter");
      assert.equal(await p.evaluate(() => document.activeElement?.id), "view", "the skip link moves focus to the view");
      for (const v of ["tasks", "report", "dashboard", "drives", "models", "settings"]) {
        await p.click(`nav a[data-view=${v}]`);
        await p.waitForSelector(`nav a[data-view=${v}][aria-current=page]`);
        await sleep(600);
        const problems = await accessibilityProblems(p);
        assert.deepEqual(problems, [], `${scheme} ${v}`);
      }
    } finally {
      await ctx.close();
    }
  }
});

test("removing a pack asks whether its files go too, and deleting them leaves the drives clean", async () => {
  const drives = [0, 1].map((i) => join(root, `rm-drive${i}`));
  drives.forEach((d) => mkdirSync(d));
  const out = join(root, "rm-pack");
  execFileSync(bin, ["pack", demoModel, "--out", out, "--drives", drives.join(","), "--split-threshold", "4K"], { stdio: "ignore" });
  await api("POST", "/api/models", { name: "to-remove", path: out });
  await page.goto(`${url}/#/models`);
  await page.click("button[data-remove='to-remove']");
  await page.waitForSelector("button[data-confirm-remove='to-remove'][data-files=true]");
  assert.match(await page.textContent(".remove-row:has(button[data-confirm-remove='to-remove'])"), /Remove, keep its files.*Remove and delete its pack \([\d.]+ [KMG]iB on its drives\).*Keep/s);
  await shot("models-remove-ask");
  await page.click("button[data-confirm-remove='to-remove'][data-files=true]");
  await page.waitForSelector(".toast:has-text('Removed to-remove and deleted')");
  assert.equal(existsSync(out), false, "the pack folder is gone");
  for (const d of drives) assert.equal(existsSync(join(d, "rm-pack")), false, `${d} holds none of it`);
  assert.equal((await api("GET", "/api/models")).models.some((m) => m.name === "to-remove"), false);
});

test("at 800 px the queue comes first and nothing scrolls sideways", async () => {
  const ctx = await browser.newContext({ viewport: { width: 800, height: 700 } });
  try {
    const p = await ctx.newPage();
    await p.goto(`${url}/#token=${token}`);
    await p.waitForSelector("#queue");
    await p.waitForSelector("#new-task");
    const [queueTop, formTop] = await p.evaluate(() => [
      document.querySelector("#queue").getBoundingClientRect().top,
      document.querySelector("#new-task").getBoundingClientRect().top,
    ]);
    assert.ok(queueTop < 700 && queueTop < formTop, `the queue at ${queueTop} px, the form at ${formTop} px`);
    for (const v of ["tasks", "report", "dashboard", "drives", "models", "settings"]) {
      await p.click(`nav a[data-view=${v}]`);
      await p.waitForSelector(`nav a[data-view=${v}][aria-current=page]`);
      await sleep(500);
      const wide = await p.evaluate(() => document.documentElement.scrollWidth);
      assert.ok(wide <= 800, `${v} is ${wide} px wide at 800`);
      if (v === "tasks") await p.screenshot({ path: join(artifacts, "tasks-800.png"), fullPage: false });
    }
  } finally {
    await ctx.close();
  }
});

test("results: code blocks are coloured by their language and tables are ruled", async () => {
  // A remote OpenAI-compatible server answering with Markdown.
  const answer = "Here is the fix:\n\n```rust\nfn main() {\n    let n: u32 = 42; // the answer\n    println!(\"{n}\");\n}\n```\n\n| drive | MB/s |\n|---|---|\n| ssd0 | 3100 |\n| ssd1 | 2950 |\n";
  const server = createServer((req, res) => {
    if (req.url.startsWith("/v1/models")) {
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ object: "list", data: [{ id: "md", object: "model" }] }));
      return;
    }
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "Content-Type": "text/event-stream" });
      const chunk = (delta, finish = null) => `data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
      res.write(chunk({ role: "assistant", content: answer }));
      res.write(chunk({}, "stop"));
      res.end("data: [DONE]\n\n");
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  try {
    await api("POST", "/api/models", { name: "markdown-server", url: `http://127.0.0.1:${server.address().port}`, remote_model: "md" });
    const job = await api("POST", "/api/jobs", { model: "markdown-server", title: "Markdown answer", prompt: "Show the fix", max_tokens: 200 });
    await waitFor(async () => (await api("GET", `/api/jobs/${job.id}`)).state === "done", "the remote task to finish");
    await page.goto(`${url}/#/job/${job.id}`);
    await page.waitForSelector("#output pre code.hljs .hljs-keyword");
    assert.deepEqual(await page.$$eval("#output .hljs-keyword", (k) => k.map((e) => e.textContent)), ["fn", "let"]);
    assert.equal(await page.textContent("#output .hljs-comment"), "// the answer");
    const border = await page.$eval("#output td", (td) => getComputedStyle(td).borderTopStyle + " " + getComputedStyle(td).borderTopWidth);
    assert.equal(border, "solid 1px");
    assert.equal(await page.locator("#output tbody tr").count(), 2);
    await shot("results-code-table");
    assert.deepEqual(await accessibilityProblems(page), [], "coloured code meets AA too");
  } finally {
    server.close();
    await api("DELETE", "/api/models/markdown-server");
  }
});

test("a draft model is chosen in the task form, named in Results, and changes nothing in the answer", async () => {
  await page.goto(`${url}/#/tasks`);
  await page.waitForSelector("#new-task select[name=draft_model] option[value='packed-here']", { state: "attached" });
  await page.selectOption('#new-task select[name="model"]', "demo");
  await page.fill('input[name="title"]', "Drafted audit");
  await page.fill('textarea[name="prompt"]', "Audit the storage layer");
  await page.fill('input[name="temperature"]', "0");
  await page.fill('input[name="max_tokens"]', "40");
  // The same weights packed again guess for the demo model.
  await page.selectOption('#new-task select[name="draft_model"]', "packed-here");
  await page.click("#submit");
  const job = await waitFor(async () => (await api("GET", "/api/jobs")).jobs.find((j) => j.title === "Drafted audit"), "the task");
  assert.equal(job.request.settings.draft_model, "packed-here");
  const done = await waitFor(async () => {
    const j = await api("GET", `/api/jobs/${job.id}`);
    return j.state === "done" && j;
  }, "the drafted task to finish");
  assert.ok(done.stats.speculation.drafted > 0, JSON.stringify(done.stats.speculation));
  // The same chat without guessing at all.
  const plain = await api("POST", "/api/jobs", { model: "demo", messages: done.request.input.messages, max_tokens: 40, temperature: 0, speculate: "off" });
  const alone = await waitFor(async () => {
    const j = await api("GET", `/api/jobs/${plain.id}`);
    return j.state === "done" && j;
  }, "the plain task");
  assert.equal(done.output, alone.output, "the draft guesses; the model decides");
  await page.goto(`${url}/#/job/${job.id}`);
  await page.waitForSelector(".view-job .stats");
  await page.click("text=Task and settings");
  await page.waitForSelector("text=guessing ahead auto with draft model packed-here");
});
