// Models: the registered checkpoints, packs and remote servers; add and remove.

import { del, get, Model, PackDetails, post } from "../api";
import { clearFormErrors, showFormError, toast } from "../dom";
import { bytes, duration, esc, when } from "../format";

interface PackTask {
  id: number;
  name: string;
  source: string;
  drives: string[];
  state: "running" | "done" | "failed";
  phase: string;
  done_bytes: number;
  total_bytes: number;
  mb_per_s: number | null;
  eta_seconds: number | null;
  error: string | null;
}

/** How often packing progress is read while a pack is being written. */
const PACK_POLL_MS = 500;

function packRow(t: PackTask): string {
  const pct = t.total_bytes ? Math.min(100, (100 * t.done_bytes) / t.total_bytes) : 0;
  const speed = t.mb_per_s != null ? ` · ${t.mb_per_s.toFixed(1)} MB/s` : "";
  const eta = t.state === "running" && t.eta_seconds != null ? ` · ETA ${duration(t.eta_seconds)}` : "";
  return `<li class="pack" data-state="${t.state}"><div class="job-head"><b>${esc(t.name)}</b><span class="badge state-${t.state === "running" ? "running" : t.state === "done" ? "done" : "failed"}">${t.state}</span></div>
    <div class="job-meta">${esc(t.phase)} · ${bytes(t.done_bytes)} of ${bytes(t.total_bytes)}${speed}${eta} · ${t.drives.length} drives</div>
    <div class="progress" role="progressbar" aria-valuenow="${t.done_bytes}" aria-valuemax="${t.total_bytes}"><div style="width:${pct}%"></div></div>
    ${t.error ? `<span class="reason error">${esc(t.error)}</span>` : ""}</li>`;
}

/** Parameters in people's units: 17.5 M, 1.0 T. */
function params(n: number): string {
  const units: [number, string][] = [[1e12, "T"], [1e9, "B"], [1e6, "M"], [1e3, "K"]];
  const [scale, unit] = units.find(([s]) => n >= s) ?? [1, ""];
  return `${(n / scale).toFixed(n / scale >= 100 ? 0 : 1)} ${unit}`.trim();
}

/** A pack's details: what it is, how it is stored, what it needs and where it lives. */
function details(d: PackDetails): string {
  const cell = (k: string, v: string) => `<div><dt>${k}</dt><dd>${v}</dd></div>`;
  const stored = [d.expert_quantization ? `experts ${d.expert_quantization} (lossy)` : `experts ${d.expert_dtype}`, d.resident_quantization ? `resident ${d.resident_quantization} (lossy)` : "resident as published", d.compression ? `compressed (${d.compression})` : ""]
    .filter(Boolean)
    .join(", ");
  const drives = d.drives.map((x) => `<tr><td><code>${esc(x.path)}</code></td><td>${bytes(x.bytes)}</td></tr>`).join("");
  return `<details class="model-details"><summary>${esc(d.model_type)} · ${params(d.total_params)} parameters${d.active_params ? `, ${params(d.active_params)} active` : ""}</summary>
    <dl class="stats">
      ${cell("Family", `${esc(d.model_type)}, ${d.layers} layers`)}
      ${cell("Parameters", params(d.total_params))}
      ${cell("Active per token", d.active_params ? params(d.active_params) : "–")}
      ${cell("Experts", `${d.experts_per_layer} per layer in ${d.expert_layers} layers${d.experts_per_token ? `, ${d.experts_per_token} per token` : ""}`)}
      ${cell("Context", d.context_length ? `${d.context_length.toLocaleString()} tokens` : "not stated")}
      ${cell("Stored as", esc(stored))}
      ${cell("On the drives", bytes(d.expert_bytes))}
      ${cell("RAM for the resident part", bytes(d.resident_bytes))}
    </dl>
    <table class="table"><thead><tr><th>Drive folder</th><th>Expert bytes</th></tr></thead><tbody>${drives}</tbody></table>
  </details>`;
}

export async function render(root: HTMLElement): Promise<() => void> {
  root.innerHTML = `<div class="two-col">
    <form id="add-model" class="card" novalidate>
      <h2>Add a model</h2>
      <label data-field="name">Name <input name="name" placeholder="kimi-k2" /></label>
      <div class="row">
        <label class="inline"><input type="radio" name="kind" value="local" checked /> On this machine</label>
        <label class="inline"><input type="radio" name="kind" value="remote" /> Remote server</label>
      </div>
      <div class="local">
        <label data-field="path">Checkpoint or pack folder <input name="path" placeholder="/mnt/ssd0/packs/kimi-k2" /></label>
      </div>
      <div class="remote" hidden>
        <label data-field="url">Server URL <input name="url" placeholder="http://gpu-box:8000" /></label>
        <label data-field="api_key">API key <input name="api_key" type="password" autocomplete="off" /></label>
        <label data-field="remote_model">Model name on the server <input name="remote_model" /></label>
      </div>
      <button type="submit">Add model</button>
    </form>
    <section class="card"><h2>Models</h2><ul id="models" class="models"><li class="loading">Loading…</li></ul></section>
  </div>
  <div class="two-col">
    <form id="pack" class="card" novalidate>
      <h2>Pack a checkpoint across drives</h2>
      <p class="hint">Experts are striped over the drives so every token reads from all of them at once; the rest stays in RAM.</p>
      <label data-field="name">Model name <input name="name" placeholder="kimi-k2-4ssd" /></label>
      <label data-field="source">Checkpoint folder <input name="source" placeholder="/models/Kimi-K2" /></label>
      <label data-field="drives">Drive folders (one per line) <textarea name="drives" rows="4" placeholder="/mnt/ssd0\n/mnt/ssd1"></textarea></label>
      <label data-field="experts">Experts <select name="experts"><option value="">exactly as in the checkpoint</option><option value="q8_0">quantised, Q8_0 (8.5 bits)</option><option value="q4k">quantised, Q4K (4.5 bits)</option></select></label>
      <button type="submit">Pack and add</button>
    </form>
    <section class="card"><h2>Packing</h2><ul id="packs" class="models"><li class="empty">Nothing is being packed.</li></ul></section>
  </div>`;
  const list = root.querySelector("#models") as HTMLElement;
  const form = root.querySelector("#add-model") as HTMLFormElement;
  const refresh = async () => {
    try {
      const { models } = await get<{ models: Model[] }>("/api/models");
      list.innerHTML = models.length
        ? models
            .map(
              (m) => `<li><div><b>${esc(m.name)}</b> <span class="badge">${m.kind}</span></div>
              <div class="hint"><code>${esc(m.kind === "local" ? m.path : m.url)}</code>${m.kind === "remote" ? ` · ${esc(m.remote_model)}` : ""} · added ${when(m.created_ms)}</div>
              ${m.details ? details(m.details) : ""}
              <div class="row remove-row"><button class="small secondary" data-remove="${esc(m.name)}" data-pack="${m.details ? bytes(m.details.expert_bytes + m.details.resident_bytes) : ""}">Remove</button></div></li>`,
            )
            .join("")
        : `<li class="empty">No models yet. Add a Hugging Face checkpoint folder, a pack made with <code>longhaul pack</code>, or a remote OpenAI-compatible server.</li>`;
    } catch (e) {
      list.innerHTML = `<li class="error">${esc((e as Error).message)}</li>`;
    }
  };
  await refresh();
  form.addEventListener("change", () => {
    const remote = (form.querySelector('input[name="kind"]:checked') as HTMLInputElement).value === "remote";
    (form.querySelector(".remote") as HTMLElement).hidden = !remote;
    (form.querySelector(".local") as HTMLElement).hidden = remote;
  });
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearFormErrors(form);
    const v = (n: string) => ((form.elements.namedItem(n) as HTMLInputElement).value || "").trim();
    const remote = (form.querySelector('input[name="kind"]:checked') as HTMLInputElement).value === "remote";
    const body = remote
      ? { name: v("name"), url: v("url"), api_key: v("api_key") || undefined, remote_model: v("remote_model") || undefined }
      : { name: v("name"), path: v("path") };
    try {
      await post("/api/models", body);
      toast(`Added ${body.name}`);
      form.reset();
      await refresh();
    } catch (e) {
      showFormError(form, e);
    }
  });
  list.addEventListener("click", async (ev) => {
    const target = ev.target as HTMLElement;
    const b = target.closest("button[data-remove]") as HTMLButtonElement | null;
    if (b) {
      // Asked in place: what goes, and whether the pack's files go with it.
      const name = b.dataset.remove ?? "";
      const pack = b.dataset.pack ?? "";
      const row = b.parentElement as HTMLElement;
      row.innerHTML = `<span class="confirm">Remove ${esc(name)}?</span>
        <button class="small secondary" data-confirm-remove="${esc(name)}" data-files="false">${pack ? "Remove, keep its files" : "Remove (its files stay)"}</button>
        ${pack ? `<button class="small" data-confirm-remove="${esc(name)}" data-files="true">Remove and delete its pack (${esc(pack)} on its drives)</button>` : ""}
        <button class="small secondary" data-keep>Keep</button>`;
      return;
    }
    if (target.closest("button[data-keep]")) {
      await refresh();
      return;
    }
    const c = target.closest("button[data-confirm-remove]") as HTMLButtonElement | null;
    if (!c) return;
    const name = c.dataset.confirmRemove ?? "";
    const files = c.dataset.files === "true";
    try {
      const r = await del<{ removed_bytes?: number } | null>(`/api/models/${encodeURIComponent(name)}${files ? "?files=true" : ""}`);
      toast(files && r?.removed_bytes != null ? `Removed ${name} and deleted ${bytes(r.removed_bytes)} of pack files` : `Removed ${name}`);
      await refresh();
    } catch (e) {
      toast((e as Error).message, "error");
    }
  });
  const packForm = root.querySelector("#pack") as HTMLFormElement;
  const packs = root.querySelector("#packs") as HTMLElement;
  let timer: ReturnType<typeof setTimeout> | null = null;
  let seen = new Map<number, string>();
  const poll = async () => {
    timer = null;
    try {
      const { packs: tasks } = await get<{ packs: PackTask[] }>("/api/packs");
      if (tasks.length) packs.innerHTML = tasks.slice().reverse().map(packRow).join("");
      for (const t of tasks) {
        if (seen.get(t.id) === "running" && t.state !== "running") {
          if (t.state === "done") toast(`Packed and added ${t.name}`);
          else toast(`Packing ${t.name} failed: ${t.error ?? ""}`, "error");
          await refresh();
        }
      }
      seen = new Map(tasks.map((t) => [t.id, t.state]));
      if (tasks.some((t) => t.state === "running")) timer = setTimeout(poll, PACK_POLL_MS);
    } catch (e) {
      packs.innerHTML = `<li class="error">${esc((e as Error).message)}</li>`;
    }
  };
  await poll();
  packForm.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearFormErrors(packForm);
    const v = (n: string) => ((packForm.elements.namedItem(n) as HTMLInputElement).value || "").trim();
    const body = {
      name: v("name"),
      source: v("source"),
      drives: v("drives")
        .split("\n")
        .map((d) => d.trim())
        .filter(Boolean),
      experts: v("experts") || undefined,
    };
    try {
      const started = await post<PackTask & { warnings?: string[] }>("/api/packs", body);
      for (const w of started.warnings ?? []) toast(w, "error");
      // Counted as running until a poll says otherwise, however fast it ends.
      seen.set(started.id, "running");
      packForm.reset();
      if (timer) clearTimeout(timer);
      await poll();
    } catch (e) {
      showFormError(packForm, e);
    }
  });
  return () => {
    if (timer) clearTimeout(timer);
  };
}
