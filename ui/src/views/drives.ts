// Drives: every drive folder holding a registered pack, with its space, the
// model bytes on it, live read rate, latency and errors, and whether it is there.

import { Drive, get, post } from "../api";
import { toast } from "../dom";
import { bytes, esc } from "../format";

/** How often the table refreshes. */
const REFRESH_MS = 2000;

export async function render(root: HTMLElement): Promise<() => void> {
  root.innerHTML = `<section class="card"><div class="queue-head"><h2>Drives</h2><div class="row" id="probe-row"></div></div>
    <p class="hint">Probing reads each drive of a pack as decoding does; the Dashboard draws the result as each drive's ceiling. Probe when no task runs.</p>
    <div id="drives" class="loading">Loading…</div></section>`;
  const box = root.querySelector("#drives") as HTMLElement;
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
  const draw = async () => {
    try {
      const { drives } = await get<{ drives: Drive[] }>("/api/drives");
      box.classList.remove("loading");
      const names = [...new Set(drives.flatMap((d) => d.models))].sort();
      if (names.join() !== packs.join()) {
        packs = names;
        probeRow.innerHTML = names.map((n) => `<button class="small secondary" data-probe="${esc(n)}">Probe drives of ${esc(n)}</button>`).join("");
      }
      if (drives.length === 0) {
        box.innerHTML = `<p class="empty">No drives yet. Packs made across several drives show each one here.</p>`;
        return;
      }
      box.innerHTML = `<table class="table"><thead><tr><th>Drive folder</th><th>Status</th><th>Free / total</th><th>Model data</th><th>Read</th><th>Latency p50</th><th>Errors</th></tr></thead><tbody>
        ${drives
          .map(
            (d) => `<tr data-path="${esc(d.path)}" class="${d.present ? "" : "missing"}">
          <td><code>${esc(d.path)}</code><div class="hint">${esc(d.models.join(", "))}</div></td>
          <td>${d.present ? `<span class="badge state-done">present</span>` : `<span class="badge state-failed">missing</span>`}</td>
          <td>${bytes(d.free_bytes)} / ${bytes(d.total_bytes)}</td>
          <td>${bytes(d.model_bytes)}</td>
          <td>${d.mb_per_s == null ? "–" : `${d.mb_per_s.toFixed(1)} MB/s`}${d.ceiling_mb_per_s == null ? "" : `<div class="hint">probed ${d.ceiling_mb_per_s.toFixed(0)} MB/s</div>`}</td>
          <td>${d.latency_p50_ms == null ? "–" : `${d.latency_p50_ms.toFixed(2)} ms`}</td>
          <td>${d.errors ?? "–"}</td></tr>`,
          )
          .join("")}</tbody></table>`;
    } catch (e) {
      box.innerHTML = `<p class="error">${esc((e as Error).message)}</p>`;
    }
  };
  await draw();
  const timer = setInterval(draw, REFRESH_MS);
  return () => clearInterval(timer);
}
