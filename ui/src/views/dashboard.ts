// Dashboard: the last ten minutes of per-drive read rates and busy shares,
// cache hit rate and prefetch recall, token rate and cache memory against the
// budget, and the expert heat map.

import uPlot from "uplot";

import { Drive, get, MetricsEvent, Model } from "../api";
import { chart, COLORS, columns, memoryRange, share } from "../charts";
import { holdLine } from "../banner";
import { bytes, esc, guessLine, percent, phaseLine, rate } from "../format";
import { Sample, store } from "../store";

interface Heat {
  layers: number[];
  experts: number;
  heat: number[][];
}

function drawHeat(canvas: HTMLCanvasElement, h: Heat): void {
  const cell = Math.max(2, Math.min(12, Math.floor(900 / Math.max(1, h.experts))));
  canvas.width = h.experts * cell;
  canvas.height = h.layers.length * cell;
  const ctx = canvas.getContext("2d");
  if (!ctx) return;
  const max = Math.max(1e-9, ...h.heat.flat());
  h.heat.forEach((row, y) =>
    row.forEach((v, x) => {
      const a = Math.sqrt(v / max);
      ctx.fillStyle = `rgba(209, 90, 47, ${a.toFixed(3)})`;
      ctx.fillRect(x * cell, y * cell, cell - (cell > 3 ? 1 : 0), cell - (cell > 3 ? 1 : 0));
    }),
  );
}

/** Candidates shown in the policy table, best first. */
const POLICY_ROWS = 6;

/** The eviction policy in use and how every candidate did on the pack's own routing. */
function policyCard(m: MetricsEvent | null): string {
  const e = m?.engine;
  if (!e) return `<p class="empty">Shown while a model streams its experts from drives.</p>`;
  const r = e.policy_report;
  if (!r) {
    return `<p>Running <b>${esc(e.policy)}</b>.</p>
      <p class="hint">The pack's routing is replayed against every candidate once its trace holds 32 tokens, then every 256 tokens.</p>`;
  }
  const shown = r.candidates.slice(0, POLICY_ROWS);
  if (!shown.some((c) => c.policy === e.policy)) {
    const own = r.candidates.find((c) => c.policy === e.policy);
    if (own) shown.push(own);
  }
  const rows = shown
    .map(
      (c) => `<tr${c.policy === e.policy ? ` class="current"` : ""}><th scope="row">${esc(c.policy)}${c.policy === e.policy ? " (in use)" : ""}</th>
        <td>${percent(c.hit_rate)}</td><td>${percent(c.regret)}</td></tr>`,
    )
    .join("");
  return `<p>Running <b>${esc(e.policy)}</b>, ${r.automatic ? "chosen from the pack's own routing" : "set by hand"}:
      replayed on its last ${r.lookups.toLocaleString()} expert lookups at a budget of ${bytes(r.budget_bytes)}.</p>
    <table class="policy-table"><thead><tr><th scope="col">policy</th><th scope="col">hit rate</th><th scope="col">behind Belady</th></tr></thead>
      <tbody>${rows}</tbody></table>
    <p class="hint">Belady's optimum (knowing the future) ${percent(r.belady_hit_rate)}; the best fixed set in hindsight ${percent(r.best_fixed_hit_rate)}.
      ${r.candidates.length} candidates replayed; ${r.candidates.length - shown.length} more not shown.</p>`;
}

/** The running task's phase, after its number: reading the prompt shows how far. */
function running(id: number): string {
  const p = store.progress.get(id);
  const line = phaseLine(p);
  if (line.startsWith("Reading")) return ` · <span class="phase">${esc(line)}</span>`;
  const guesses = guessLine(p?.stats?.speculation);
  return guesses ? ` · <span class="guesses">${esc(guesses)}</span>` : "";
}

export async function render(root: HTMLElement): Promise<() => void> {
  root.innerHTML = `
    <div class="summary card" id="summary"></div>
    <div class="row range"><label class="inline">Show <select id="range" aria-label="Time range of the charts">
      <option value="live">the last 10 minutes, each second</option>
      <option value="${12 * 3600}">the last 12 hours, each minute</option>
      <option value="${7 * 24 * 3600}">the last 7 days, each minute</option>
    </select></label></div>
    <div class="charts">
      <section class="card"><div id="c-drives" class="chart"></div></section>
      <section class="card"><div id="c-busy" class="chart"></div></section>
      <section class="card"><div id="c-hit" class="chart"></div></section>
      <section class="card"><div id="c-tok" class="chart"></div></section>
      <section class="card"><div id="c-ram" class="chart"></div></section>
    </div>
    <section class="card" id="policy"><h2>Eviction policy</h2><div id="policy-body"></div></section>
    <section class="card"><h2>Expert heat</h2>
      <div class="row"><label class="inline">Model <select id="heat-model"></select></label></div>
      <p class="hint">Layers (rows) × experts (columns): how often the router chose each expert, decayed over time.</p>
      <div class="heat"><canvas id="heat" aria-label="Expert heat map"></canvas></div>
      <p id="heat-note" class="empty"></p>
    </section>`;
  const summary = root.querySelector("#summary") as HTMLElement;
  const policy = root.querySelector("#policy-body") as HTMLElement;
  let names = new Map<string, string>();
  let drivePaths: string[] = [];
  // Each drive's probed read rate, drawn as its ceiling.
  let ceilings = new Map<string, number>();
  const loadCeilings = async () => {
    try {
      const { drives } = await get<{ drives: Drive[] }>("/api/drives");
      const next = new Map(drives.filter((d) => d.ceiling_mb_per_s != null).map((d) => [d.path, d.ceiling_mb_per_s as number]));
      if ([...next].join() !== [...ceilings].join()) {
        ceilings = next;
        drivePaths = [];
        update();
      }
    } catch {
      // The chart works without ceilings.
    }
  };
  let drivesChart: uPlot | null = null;
  let busyChart: uPlot | null = null;
  const hit = chart(
    root.querySelector("#c-hit") as HTMLElement,
    "Cache hit rate and prefetch recall",
    [
      { label: "hit rate", color: COLORS[2] },
      { label: "prefetch recall", color: COLORS[3] },
    ],
    "share",
    undefined,
    share,
  );
  const tok = chart(root.querySelector("#c-tok") as HTMLElement, "Tokens per second", [{ label: "tok/s", color: COLORS[0] }], "tok/s");
  const ram = chart(
    root.querySelector("#c-ram") as HTMLElement,
    "Expert cache memory",
    [
      { label: "held", color: COLORS[1] },
      { label: "budget", color: COLORS[7] },
    ],
    "RAM",
    (v) => bytes(v),
    memoryRange,
  );

  const range = root.querySelector("#range") as HTMLSelectElement;
  const shown = (): Sample[] => {
    if (range.value === "live") return store.samples;
    const since = Date.now() / 1000 - Number(range.value);
    return store.minutes.filter((s) => s.t >= since);
  };
  const update = () => {
    const samples = shown();
    const paths = Array.from(new Set(samples.flatMap((s) => Object.keys(s.drives)))).sort();
    const capped = paths.filter((p) => ceilings.has(p));
    const short = (p: string) => p.split("/").slice(-2).join("/");
    if (!drivesChart || !busyChart || paths.join() !== drivePaths.join()) {
      drivesChart?.destroy();
      busyChart?.destroy();
      drivePaths = paths;
      const el = root.querySelector("#c-drives") as HTMLElement;
      el.innerHTML = "";
      const busyEl = root.querySelector("#c-busy") as HTMLElement;
      busyEl.innerHTML = "";
      busyChart = chart(
        busyEl,
        "Drive busy share: time with a read in progress",
        paths.map((p, i) => ({ label: short(p), color: COLORS[i % COLORS.length] })),
        "share",
        undefined,
        share,
      );
      drivesChart = chart(
        el,
        "Drive reads (MB/s) against each drive's probed ceiling",
        [
          ...paths.map((p, i) => ({ label: short(p), color: COLORS[i % COLORS.length] })),
          { label: "total", color: "#222" },
          ...capped.map((p) => ({ label: `${short(p)} ceiling`, color: COLORS[paths.indexOf(p) % COLORS.length], dash: [6, 4] })),
        ],
        "MB/s",
      );
    }
    drivesChart.setData(
      columns(samples, [
        ...drivePaths.map((p) => (s: Sample) => s.drives[p] ?? null),
        (s) => s.total,
        ...drivePaths.filter((p) => ceilings.has(p)).map((p) => () => ceilings.get(p) ?? null),
      ]),
    );
    busyChart.setData(columns(samples, drivePaths.map((p) => (s: Sample) => s.busy[p] ?? null)));
    hit.setData(columns(samples, [(s) => s.hitRate, (s) => s.recall]));
    tok.setData(columns(samples, [(s) => s.tokensPerSecond]));
    ram.setData(columns(samples, [(s) => s.held, (s) => s.budget]));
    const m = store.latest;
    policy.innerHTML = policyCard(m);
    summary.innerHTML = m
      ? `<span><b>${esc(names.get(m.model) ?? m.model.split("/").pop() ?? m.model)}</b> loaded</span>
         <span>${m.running_job ? `running task <a href="#/job/${m.running_job}">${m.running_job}</a>${running(m.running_job)}` : holdLine() || "no task running"}</span>
         <span>${rate(m.tokens_per_second)}</span>
         <span>hit rate ${percent(m.engine?.hit_rate)}</span>
         <span>prefetch recall ${percent(m.engine?.prefetch_recall)}</span>
         <span>cache ${bytes(m.engine?.cache.held_bytes)} of ${bytes(m.budget_bytes)}</span>
         ${m.prefix ? `<span class="prefix-cache">prefix cache: ${percent(m.prefix.lookups ? m.prefix.hits / m.prefix.lookups : null)} of ${m.prefix.lookups} prompts, ${m.prefix.reused_tokens} tokens reused, ${bytes(m.prefix.read_ram_bytes + m.prefix.read_disk_bytes)} read, ${bytes(m.prefix.disk_bytes)} kept</span>` : ""}
         <span>${range.value === "live" ? `${samples.length} s of history` : `${samples.length} min of history`}</span>`
      : `<span class="empty">No model is loaded yet: the charts fill once a task runs.</span>`;
  };
  range.addEventListener("change", () => {
    if (range.value !== "live") void store.loadHistory();
    update();
  });
  update();
  const off = store.onMetrics(update);
  const offJob = store.onJob((p) => {
    if (p.prompt) update();
  });
  void loadCeilings();

  // The heat map, per local model.
  const select = root.querySelector("#heat-model") as HTMLSelectElement;
  const note = root.querySelector("#heat-note") as HTMLElement;
  const canvas = root.querySelector("#heat") as HTMLCanvasElement;
  const loadHeat = async () => {
    if (!select.value) return;
    try {
      const h = await get<Heat>(`/api/heat/${encodeURIComponent(select.value)}`);
      if (h.layers.length === 0) {
        canvas.width = canvas.height = 0;
        note.textContent = "No routing recorded for this model yet; it fills as tasks run.";
      } else {
        note.textContent = "";
        drawHeat(canvas, h);
      }
    } catch (e) {
      note.textContent = (e as Error).message;
    }
  };
  try {
    const { models } = await get<{ models: Model[] }>("/api/models");
    const local = models.filter((m) => m.kind === "local");
    names = new Map(local.map((m) => [m.path ?? "", m.name]));
    update();
    select.innerHTML = local.map((m) => `<option>${esc(m.name)}</option>`).join("");
    if (local.length === 0) note.textContent = "No local models yet.";
    select.addEventListener("change", loadHeat);
    await loadHeat();
  } catch (e) {
    note.textContent = (e as Error).message;
  }
  const heatTimer = setInterval(() => {
    void loadHeat();
    void loadCeilings();
    if (range.value !== "live") void store.loadHistory();
  }, 10_000);
  return () => {
    off();
    offJob();
    clearInterval(heatTimer);
    drivesChart?.destroy();
    busyChart?.destroy();
    hit.destroy();
    tok.destroy();
    ram.destroy();
  };
}
