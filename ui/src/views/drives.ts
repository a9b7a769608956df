// Drives: every drive folder holding a registered pack — whether it is there
// and reading without errors, its space, the model bytes on it, live read
// rate, measured latency and errors — and the disks under them, with what
// each says of its own health (or why it says nothing).

import { Disk, DiskHealth, Drive, get, post } from "../api";
import { toast } from "../dom";
import { bytes, duration, esc, when } from "../format";

/** How often the table refreshes. */
const REFRESH_MS = 2000;

/** Sparkline size, in CSS pixels. */
const SPARK_W = 120;
const SPARK_H = 28;

function status(d: Drive): string {
  if (d.status === "missing") return `<span class="badge state-failed">missing</span>`;
  if (d.status === "errors") {
    const ago = d.last_error_seconds_ago == null ? "" : `, last ${duration(d.last_error_seconds_ago)} ago`;
    return `<span class="badge state-failed">read errors</span><div class="hint">${d.errors} failed${ago}</div>`;
  }
  return `<span class="badge state-done">present</span>`;
}

function latency(d: Drive): string {
  if (d.latency_p50_ms == null) return `–<div class="hint">no reads in the last second</div>`;
  const ms = (x: number | null) => (x == null ? "–" : x.toFixed(2));
  return `${ms(d.latency_p50_ms)} ms<div class="hint">p90 ${ms(d.latency_p90_ms)} · p99 ${ms(d.latency_p99_ms)}</div>`;
}

function folderRow(d: Drive): string {
  const shared = d.same_device.length
    ? `<div class="hint warn">On one device with ${d.same_device.map((p) => `<code>${esc(p)}</code>`).join(", ")}: striping over them reads no faster than one.</div>`
    : "";
  return `<tr data-path="${esc(d.path)}" class="${d.status === "present" ? "" : "missing"}">
    <td><code>${esc(d.path)}</code><div class="hint">${esc(d.models.join(", "))}</div>${shared}</td>
    <td>${status(d)}</td>
    <td>${bytes(d.free_bytes)} / ${bytes(d.total_bytes)}</td>
    <td>${bytes(d.model_bytes)}</td>
    <td>${d.mb_per_s == null ? "–" : `${d.mb_per_s.toFixed(1)} MB/s`}${d.ceiling_mb_per_s == null ? "" : `<div class="hint">probed ${d.ceiling_mb_per_s.toFixed(0)} MB/s</div>`}</td>
    <td>${latency(d)}</td>
    <td>${d.errors}</td></tr>`;
}

/** The last day's temperatures as a small line, labelled for screen readers. */
function spark(points: [number, number][]): string {
  if (points.length < 2) return "";
  const t0 = points[0][0];
  const t1 = points[points.length - 1][0];
  const lo = Math.min(...points.map((p) => p[1]));
  const hi = Math.max(...points.map((p) => p[1]));
  const x = (t: number) => ((t - t0) / Math.max(t1 - t0, 1)) * SPARK_W;
  const y = (c: number) => SPARK_H - 2 - ((c - lo) / Math.max(hi - lo, 1)) * (SPARK_H - 4);
  const line = points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
  return `<svg class="spark" width="${SPARK_W}" height="${SPARK_H}" role="img" aria-label="temperature over the last day, ${lo} to ${hi} °C"><polyline points="${line}" fill="none" stroke="currentColor" stroke-width="1.5"/></svg><span class="hint">${lo}–${hi} °C today</span>`;
}

/** The figures the drive reports, each with its name. */
function figures(h: DiskHealth): string {
  const rows: [string, string | null][] = [
    ["Self-assessment", h.passed == null ? null : h.passed ? "passed" : "FAILED"],
    ["Temperature", h.temperature_c == null ? null : `${h.temperature_c} °C`],
    ["Endurance used", h.percentage_used == null ? null : `${h.percentage_used} %`],
    ["Spare", h.available_spare == null ? null : `${h.available_spare} % (warns under ${h.available_spare_threshold ?? "–"} %)`],
    ["Media errors", h.media_errors?.toString() ?? null],
    ["Error-log entries", h.error_log_entries?.toString() ?? null],
    ["Reallocated", h.reallocated?.toString() ?? null],
    ["Link CRC errors", h.crc_errors?.toString() ?? null],
    ["Unsafe shutdowns", h.unsafe_shutdowns?.toString() ?? null],
    ["Powered on", h.power_on_hours == null ? null : `${h.power_on_hours.toLocaleString()} h`],
    ["Above warning temperature", h.warning_temp_minutes == null ? null : `${h.warning_temp_minutes} min${h.critical_temp_minutes ? `, ${h.critical_temp_minutes} above critical` : ""}`],
  ];
  return `<dl class="figures">${rows
    .filter(([, v]) => v != null)
    .map(([k, v]) => `<dt>${k}</dt><dd>${esc(v as string)}</dd>`)
    .join("")}</dl>`;
}

function diskCard(disk: Disk | null, folders: string[]): string {
  const list = folders.map((f) => `<code>${esc(f)}</code>`).join(", ");
  if (!disk) return `<article class="disk"><h3>${list}</h3><p class="hint">Not read yet.</p></article>`;
  const h = disk.health;
  const name = [disk.device, h?.model].filter(Boolean).join(" — ") || folders.join(", ");
  const link = [disk.link, h?.through ? `through ${h.through}` : null].filter(Boolean).join(", ");
  const warnings = disk.warnings.map((w) => `<li class="warn" data-kind="${esc(w.kind)}">${esc(w.text)}</li>`).join("");
  const body = h
    ? `${figures(h)}${spark(disk.temperatures)}`
    : `<p class="hint">No health: ${esc(disk.unavailable ?? "not read")}</p>`;
  return `<article class="disk${disk.warnings.length ? " warned" : ""}" data-device="${esc(disk.device ?? "")}">
    <h3>${esc(name)}</h3>
    <p class="hint">${esc(link)}${disk.via.length ? ` · ${disk.via.map(esc).join(" · ")}` : ""} · holds ${list} · read ${when(disk.checked_at * 1000)}</p>
    ${warnings ? `<ul class="warnings">${warnings}</ul>` : ""}
    ${body}</article>`;
}

/** One card per disk: folders on one disk share it. */
function disks(drives: Drive[]): string {
  const groups = new Map<string, { disk: Disk | null; folders: string[] }>();
  for (const d of drives) {
    const key = d.disk?.device ?? d.path;
    const g = groups.get(key) ?? { disk: d.disk, folders: [] };
    g.folders.push(d.path);
    groups.set(key, g);
  }
  return [...groups.values()].map((g) => diskCard(g.disk, g.folders)).join("");
}

export async function render(root: HTMLElement): Promise<() => void> {
  root.innerHTML = `<section class="card"><div class="queue-head"><h2>Drives</h2><div class="row" id="probe-row"></div></div>
    <p class="hint">Probing reads each drive of a pack as decoding does; the Dashboard draws the result as each drive's ceiling. Probe when no task runs.</p>
    <div id="drives" class="loading">Loading…</div></section>
    <section class="card"><div class="queue-head"><h2>Disk health</h2><button class="small secondary" id="read-health">Read health now</button></div>
    <p class="hint">What each disk under a pack says of itself, read with smartctl every 10 minutes; a week of readings is kept.</p>
    <div id="disks" class="disks"></div></section>`;
  const box = root.querySelector("#drives") as HTMLElement;
  const diskBox = root.querySelector("#disks") as HTMLElement;
  const probeRow = root.querySelector("#probe-row") as HTMLElement;
  let packs: string[] = [];
  probeRow.addEventListener("click", async (ev) => {
    const b = (ev.target as HTMLElement).closest("button[data-probe]") as HTMLButtonElement | null;
    if (!b) return;
    const name = b.dataset.probe ?? "";
    b.disabled = true;
    b.textContent = `Probing ${name}…`;
    try {
      const r = await post<{ aggregate_mb_per_s: number }>(`/api/models/${encodeURIComponent(name)}/probe`);
      toast(`${name}: ${r.aggregate_mb_per_s.toFixed(0)} MB/s from all its drives at once`);
      await draw();
    } catch (e) {
      toast((e as Error).message, "error");
    } finally {
      b.disabled = false;
      b.textContent = `Probe drives of ${name}`;
    }
  });
  const show = (drives: Drive[]) => {
    box.classList.remove("loading");
    const names = [...new Set(drives.flatMap((d) => d.models))].sort();
    if (names.join() !== packs.join()) {
      packs = names;
      probeRow.innerHTML = names.map((n) => `<button class="small secondary" data-probe="${esc(n)}">Probe drives of ${esc(n)}</button>`).join("");
    }
    if (drives.length === 0) {
      box.innerHTML = `<p class="empty">No drives yet. Packs made across several drives show each one here.</p>`;
      diskBox.innerHTML = "";
      return;
    }
    box.innerHTML = `<table class="table"><thead><tr><th>Drive folder</th><th>Status</th><th>Free / total</th><th>Model data</th><th>Read</th><th>Latency p50</th><th>Errors</th></tr></thead><tbody>
      ${drives.map(folderRow).join("")}</tbody></table>`;
    diskBox.innerHTML = disks(drives);
  };
  const draw = async () => {
    try {
      show((await get<{ drives: Drive[] }>("/api/drives")).drives);
    } catch (e) {
      box.innerHTML = `<p class="error">${esc((e as Error).message)}</p>`;
    }
  };
  const readNow = root.querySelector("#read-health") as HTMLButtonElement;
  readNow.addEventListener("click", async () => {
    readNow.disabled = true;
    readNow.textContent = "Reading…";
    try {
      show((await post<{ drives: Drive[] }>("/api/drives/health")).drives);
    } catch (e) {
      toast((e as Error).message, "error");
    } finally {
      readNow.disabled = false;
      readNow.textContent = "Read health now";
    }
  });
  await draw();
  const timer = setInterval(draw, REFRESH_MS);
  return () => clearInterval(timer);
}
