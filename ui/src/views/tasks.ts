// Tasks: submit a long-form task, and the queue with progress, speed, ETA,
// place in line, and the controls to reorder, pause, resume and cancel.

import { ApiError, Forecast, get, Job, Model, post } from "../api";
import { clearFormErrors, patchHtml, showFormError, stateBadge, toast } from "../dom";
import { bytes, duration, esc, phaseLine, rate } from "../format";
import { store } from "../store";
import { Draft, DRAFT_KEY } from "./report";

const ACTIVE = new Set(["queued", "running", "paused", "interrupted"]);

function form(models: Model[]): string {
  const options = models.map((m) => `<option value="${esc(m.name)}">${esc(m.name)}</option>`).join("");
  // Any model on this machine may guess for another (the service refuses the model itself).
  const drafts = models
    .filter((m) => m.kind !== "remote")
    .map((m) => `<option value="${esc(m.name)}">${esc(m.name)}</option>`)
    .join("");
  return `
  <form id="new-task" class="card" novalidate>
    <div class="queue-head"><h2>New task</h2>
      <div class="row presets"><label class="inline">Preset <select id="preset" aria-label="Apply a saved preset"><option value="">—</option></select></label>
      <button type="button" class="small secondary" id="save-preset">Save as preset</button></div></div>
    ${models.length === 0 ? `<p class="empty">No models yet. <a href="#/models">Add one</a> to submit tasks.</p>` : ""}
    <label data-field="title">Title <input name="title" placeholder="Audit the storage layer" /></label>
    <label data-field="model">Model <select name="model" required>${options}</select></label>
    <div class="row">
      <label class="inline"><input type="radio" name="mode" value="chat" checked /> Chat</label>
      <label class="inline"><input type="radio" name="mode" value="prompt" /> Plain prompt</label>
    </div>
    <label data-field="messages" class="system-prompt">System prompt (chat only; optional) <textarea name="system" rows="2" placeholder="You are a careful reviewer of storage code."></textarea></label>
    <label data-field="chat_template_kwargs" class="system-prompt" title="Passed to the model's chat template, as chat_template_kwargs: enable_thinking=false, thinking=true, reasoning_effort=high">Template switches (chat only; one KEY=VALUE per line) <textarea name="chat_args" rows="1" placeholder="enable_thinking=false"></textarea></label>
    <label data-field="prompt">Task <textarea name="prompt" rows="7" placeholder="What should the model work on tonight?"></textarea></label>
    <label data-field="attachments">Attach files or folders on this machine (one path per line; in the desktop app, drop them on the window)
      <textarea name="attachments" rows="2" placeholder="/home/me/project/src"></textarea></label>
    <p class="hint" id="token-count" aria-live="polite"></p>
    <p class="hint" id="forecast" aria-live="polite"></p>
    <div class="grid3">
      <label data-field="max_tokens">Max tokens <input name="max_tokens" type="number" min="1" placeholder="all the context leaves" /></label>
      <label data-field="priority" title="Higher runs sooner; equal priorities run in the order queued">Priority (higher runs sooner) <input name="priority" type="number" value="0" /></label>
      <label data-field="seed">Seed <input name="seed" type="number" min="0" placeholder="0" /></label>
    </div>
    <fieldset class="sampling">
      <legend>Sampling</legend>
      <label class="inline"><input type="checkbox" name="greedy" /> Greedy (the most likely token each time)</label>
      <div class="grid3">
        <label data-field="temperature">Temperature <input name="temperature" type="number" step="0.05" min="0" /></label>
        <label data-field="top_p">Top-p <input name="top_p" type="number" step="0.01" min="0" max="1" /></label>
        <label data-field="top_k">Top-k <input name="top_k" type="number" min="1" /></label>
      </div>
      <div class="grid3" title="Against an answer that loops: tokens already written (and, for repetition, in the prompt) are made less likely">
        <label data-field="repetition_penalty">Repetition penalty <input name="repetition_penalty" type="number" step="0.05" min="0.05" placeholder="1 (off)" /></label>
        <label data-field="frequency_penalty">Frequency penalty <input name="frequency_penalty" type="number" step="0.1" min="-2" max="2" placeholder="0 (off)" /></label>
        <label data-field="presence_penalty">Presence penalty <input name="presence_penalty" type="number" step="0.1" min="-2" max="2" placeholder="0 (off)" /></label>
      </div>
      <label data-field="stop">Stop at (one string per line) <textarea name="stop" rows="1"></textarea></label>
      <label data-field="speculate" title="Guesses are verified against the model: the answer is the same either way">Guess ahead
        <select name="speculate"><option value="auto">automatically, while it pays</option><option value="lookup">always, from earlier text</option><option value="off">never</option></select></label>
      <label data-field="draft_model" title="A smaller model on this machine guesses the next tokens; the model checks every guess, so the answer is the same">Draft model
        <select name="draft_model"><option value="">none: guess from earlier text</option>${drafts}</select></label>
      <p class="hint" id="sampling-note"></p>
    </fieldset>
    <div class="row">
      <button type="button" id="count" class="secondary">Count and estimate</button>
      <button type="submit" id="submit" ${models.length === 0 ? "disabled" : ""}>Queue task</button>
    </div>
  </form>`;
}

/** `KEY=VALUE` lines as template switches: VALUE as JSON where it reads as JSON (true, 3, "x"), else as text. */
export function chatArgs(text: string): Record<string, unknown> | undefined {
  const out: Record<string, unknown> = {};
  for (const line of text.split("\n").map((l) => l.trim()).filter(Boolean)) {
    const at = line.indexOf("=");
    if (at <= 0) throw new ApiError(`Template switch “${line}” is not KEY=VALUE (enable_thinking=false)`, 400, "chat_template_kwargs");
    const raw = line.slice(at + 1).trim();
    let value: unknown = raw;
    try {
      value = JSON.parse(raw);
    } catch {
      value = raw;
    }
    out[line.slice(0, at).trim()] = value;
  }
  return Object.keys(out).length ? out : undefined;
}

function body(f: HTMLFormElement): Record<string, unknown> {
  const v = (n: string) => (f.elements.namedItem(n) as HTMLInputElement | null)?.value ?? "";
  const text = v("prompt");
  const attachments = v("attachments")
    .split("\n")
    .map((s) => s.trim())
    .filter(Boolean);
  const num = (n: string) => (v(n).trim() === "" ? undefined : Number(v(n)));
  const mode = (f.querySelector('input[name="mode"]:checked') as HTMLInputElement | null)?.value;
  const greedy = (f.elements.namedItem("greedy") as HTMLInputElement | null)?.checked ?? false;
  const stop = v("stop")
    .split("\n")
    .filter((s) => s.length > 0);
  return {
    model: v("model"),
    title: v("title").trim() || undefined,
    ...(mode === "chat"
      ? {
          messages: [...(v("system").trim() ? [{ role: "system", content: v("system") }] : []), { role: "user", content: text }],
          chat_template_kwargs: chatArgs(v("chat_args")),
        }
      : { prompt: text }),
    attachments: attachments.length ? attachments : undefined,
    max_tokens: num("max_tokens"),
    // Empty fields take the model's own defaults (its generation_config.json).
    ...(greedy ? { temperature: 0 } : { temperature: num("temperature"), top_p: num("top_p"), top_k: num("top_k") }),
    seed: num("seed"),
    stop: stop.length ? stop : undefined,
    speculate: v("speculate") || undefined,
    draft_model: v("draft_model") || undefined,
    repetition_penalty: num("repetition_penalty"),
    frequency_penalty: num("frequency_penalty"),
    presence_penalty: num("presence_penalty"),
    priority: num("priority"),
  };
}

function jobRow(j: Job): string {
  const running = j.state === "running";
  // Live figures only for the running job; the saved job is the truth for the rest.
  const live = running ? (store.progress.get(j.id) ?? j.live ?? null) : null;
  const tokens = live?.tokens ?? j.tokens;
  const max = j.request.settings.max_tokens;
  const prompt = live?.prompt ?? null;
  const [done, total] = prompt ? [prompt.done, prompt.total] : [tokens, max];
  const pct = Math.min(100, (100 * done) / Math.max(1, total));
  const speed = running
    ? phaseLine(live)
    : j.stats && j.stats.tokens_per_second > 0
      ? `${rate(j.stats.tokens_per_second)} · ${duration(j.stats.wall_seconds)}`
      : "";
  const place = j.queue_position ? `#${j.queue_position} in line` : "";
  const reason = j.pause_reason && ["paused", "interrupted"].includes(j.state) ? `<span class="reason">${esc(j.pause_reason)}</span>` : "";
  const err = j.error ? `<span class="reason error">${esc(j.error)}</span>` : "";
  const act = (a: string, label: string, name?: string) =>
    `<button class="small secondary" data-act="${a}" data-id="${j.id}"${name ? ` aria-label="${name}" title="${name}"` : ""}>${label}</button>`;
  const actions = [
    j.state === "queued" ? act("up", "↑", `Move ${esc(j.title)} up the queue`) + act("down", "↓", `Move ${esc(j.title)} down the queue`) : "",
    ["queued", "running", "interrupted"].includes(j.state) ? act("pause", "Pause") : "",
    j.state === "paused" ? act("resume", "Resume") : "",
    ACTIVE.has(j.state) && !confirming.has(j.id) ? act("cancel", "Cancel") : "",
    ACTIVE.has(j.state) && confirming.has(j.id)
      ? `<span class="confirm">End it for good? Its output is kept.</span>` + act("cancel-confirm", "End task") + act("keep", "Keep it")
      : "",
  ].join("");
  return `
  <li class="job" data-id="${j.id}" data-state="${j.state}">
    <div class="job-head">
      <a href="#/job/${j.id}" class="job-title">${esc(j.title)}</a>
      ${stateBadge(j.state)}
    </div>
    <div class="job-meta">${esc(j.model)} · ${tokens} / ${max} tokens ${speed ? "· " + esc(speed) : ""} ${place ? "· " + place : ""}</div>
    <div class="progress${prompt ? " prompt" : ""}" role="progressbar" aria-label="${prompt ? "Prompt read" : "Tokens written"}" aria-valuenow="${done}" aria-valuemax="${total}"><div style="width:${pct}%"></div></div>
    ${reason}${err}
    <div class="actions">${actions}</div>
  </li>`;
}

/** Form fields a preset keeps: the settings, not the task itself. */
const PRESET_FIELDS = ["model", "system", "chat_args", "max_tokens", "priority", "seed", "temperature", "top_p", "top_k", "stop", "speculate", "draft_model", "repetition_penalty", "frequency_penalty", "presence_penalty"];
const PRESETS_KEY = "longhaul.presets";

function presets(): Record<string, Record<string, string>> {
  try {
    return JSON.parse(localStorage.getItem(PRESETS_KEY) ?? "{}");
  } catch {
    return {};
  }
}

/** Fills the preset list, and saves or applies presets. */
function wirePresets(f: HTMLFormElement, changed: () => void): void {
  const select = f.querySelector("#preset") as HTMLSelectElement;
  const fill = () => {
    select.innerHTML = `<option value="">—</option>${Object.keys(presets()).map((n) => `<option>${esc(n)}</option>`).join("")}`;
  };
  fill();
  select.addEventListener("change", () => {
    const p = presets()[select.value];
    if (!p) return;
    for (const n of PRESET_FIELDS) {
      const el = f.elements.namedItem(n) as HTMLInputElement | null;
      if (el && n in p) el.value = p[n];
    }
    const greedy = f.elements.namedItem("greedy") as HTMLInputElement;
    greedy.checked = p.greedy === "1";
    changed();
  });
  f.querySelector("#save-preset")?.addEventListener("click", () => {
    const name = prompt("Name this preset (its model, system prompt and settings):")?.trim();
    if (!name) return;
    const p: Record<string, string> = {};
    for (const n of PRESET_FIELDS) p[n] = (f.elements.namedItem(n) as HTMLInputElement | null)?.value ?? "";
    p.greedy = (f.elements.namedItem("greedy") as HTMLInputElement).checked ? "1" : "0";
    localStorage.setItem(PRESETS_KEY, JSON.stringify({ ...presets(), [name]: p }));
    fill();
    select.value = name;
    toast(`Saved the preset “${name}”`);
  });
}

/** Puts an earlier task's input and settings in the form, to edit before queueing. */
function fillDraft(f: HTMLFormElement, d: Draft): void {
  const set = (n: string, v: string | number | null) => {
    const el = f.elements.namedItem(n) as HTMLInputElement | null;
    if (el && v !== null) el.value = String(v);
  };
  set("title", d.title);
  set("model", d.model);
  set("prompt", d.prompt);
  set("system", d.system ?? "");
  set("max_tokens", d.max_tokens);
  set("temperature", d.temperature);
  set("top_p", d.top_p);
  set("top_k", d.top_k);
  set("seed", d.seed);
  set("stop", d.stop.join("\n"));
  (f.querySelector(`input[name="mode"][value="${d.chat ? "chat" : "prompt"}"]`) as HTMLInputElement | null)?.click();
}

/// Jobs whose Cancel was clicked once: one click must not end an overnight job.
const confirming = new Set<number>();

export async function render(root: HTMLElement): Promise<() => void> {
  root.innerHTML = `<div class="two-col"><div id="form-slot"><div class="card loading">Loading models…</div></div>
    <section class="card" id="queue"><div class="queue-head"><h2>Queue</h2>
    <button type="button" class="small secondary" id="resume-all" hidden>Resume all</button>
    <input id="search" type="search" placeholder="Search tasks  ( / )" aria-label="Search tasks" /></div>
    <ul id="jobs" class="jobs"><li class="loading">Loading…</li></ul></section></div>`;
  const slot = root.querySelector("#form-slot") as HTMLElement;
  const list = root.querySelector("#jobs") as HTMLElement;
  const search = root.querySelector("#search") as HTMLInputElement;
  const resumeAll = root.querySelector("#resume-all") as HTMLButtonElement;
  let jobs: Job[] = [];

  let models: Model[] = [];
  try {
    models = (await get<{ models: Model[] }>("/api/models")).models;
    slot.innerHTML = form(models);
  } catch (e) {
    slot.innerHTML = `<div class="card error">${esc((e as Error).message)}</div>`;
  }
  const f = root.querySelector("#new-task") as HTMLFormElement | null;

  const draw = () => {
    // Several paused tasks (a night of drive faults) resume with one click.
    const paused = jobs.filter((j) => j.state === "paused").length;
    resumeAll.hidden = paused < 2;
    resumeAll.textContent = `Resume all ${paused} paused`;
    const q = search.value.trim().toLowerCase();
    const shown = jobs.filter((j) => !q || j.title.toLowerCase().includes(q) || j.model.toLowerCase().includes(q));
    const active = shown.filter((j) => ACTIVE.has(j.state)).sort((a, b) => (a.queue_position ?? 0) - (b.queue_position ?? 0));
    const finished = shown.filter((j) => !ACTIVE.has(j.state));
    // Patched, not replaced: a click on a row's link or button while a task
    // streams must land (see `patchHtml`).
    if (jobs.length === 0) {
      patchHtml(list, `<li class="empty">No tasks yet. Describe one under New task; it runs in the background and its result waits here.</li>`);
    } else if (shown.length === 0) {
      patchHtml(list, `<li class="empty">No task matches “${esc(q)}”.</li>`);
    } else {
      patchHtml(list, [...active, ...finished].map(jobRow).join(""));
    }
  };
  const refresh = async () => {
    try {
      jobs = (await get<{ jobs: Job[] }>("/api/jobs")).jobs;
      draw();
    } catch (e) {
      list.innerHTML = `<li class="error">${esc((e as Error).message)}</li>`;
    }
  };
  await refresh();

  search.addEventListener("input", draw);
  resumeAll.addEventListener("click", async () => {
    resumeAll.disabled = true;
    try {
      await post("/api/queue/resume-all");
      await refresh();
    } catch (e) {
      toast((e as Error).message, "error");
    } finally {
      resumeAll.disabled = false;
    }
  });
  list.addEventListener("click", async (ev) => {
    const b = (ev.target as HTMLElement).closest("button[data-act]") as HTMLButtonElement | null;
    if (!b) return;
    const id = Number(b.dataset.id);
    const act = b.dataset.act;
    if (act === "cancel" || act === "keep") {
      if (act === "cancel") confirming.add(id);
      else confirming.delete(id);
      draw();
      return;
    }
    try {
      if (act === "cancel-confirm") {
        confirming.delete(id);
        await post(`/api/jobs/${id}/cancel`);
      } else if (act === "up" || act === "down") {
        const waiting = jobs.filter((j) => j.state === "queued" && j.priority === jobs.find((x) => x.id === id)?.priority)
          .sort((a, c) => (a.queue_position ?? 0) - (c.queue_position ?? 0));
        const i = waiting.findIndex((j) => j.id === id);
        await post(`/api/jobs/${id}/move`, { index: Math.max(0, act === "up" ? i - 1 : i + 1) });
      } else {
        await post(`/api/jobs/${id}/${act}`);
      }
      await refresh();
    } catch (e) {
      toast((e as Error).message, "error");
    }
  });

  if (f) {
    // A copy of an earlier task, from "Duplicate and edit".
    const saved = sessionStorage.getItem(DRAFT_KEY);
    if (saved) {
      sessionStorage.removeItem(DRAFT_KEY);
      try {
        fillDraft(f, JSON.parse(saved) as Draft);
      } catch {
        // A draft that does not parse is dropped.
      }
    }
    // The model's sampling shown in the form: as placeholders, with greedy one click away.
    const note = root.querySelector("#sampling-note") as HTMLElement;
    const field = (n: string) => f.elements.namedItem(n) as HTMLInputElement;
    const showSampling = () => {
      const m = models.find((x) => x.name === field("model").value);
      const d = m?.sampling ?? null;
      const greedy = field("greedy").checked;
      field("temperature").placeholder = d ? String(d.temperature) : "0 (greedy)";
      field("top_p").placeholder = d ? String(d.top_p) : "1";
      field("top_k").placeholder = d?.top_k != null ? String(d.top_k) : "off";
      // Empty, the answer may take all the context leaves after the prompt.
      const context = m?.details?.context_length;
      field("max_tokens").placeholder = context ? `all the context leaves (of ${context.toLocaleString()})` : "all the context leaves";
      for (const n of ["temperature", "top_p", "top_k"]) field(n).disabled = greedy;
      note.textContent = greedy
        ? "Greedy: the same prompt always gives the same answer."
        : d
          ? `Empty fields take the model's own settings (generation_config.json): temperature ${d.temperature}, top-p ${d.top_p}, top-k ${d.top_k ?? "off"}.`
          : "This model names no sampling settings: empty fields decode greedily.";
    };
    field("model").addEventListener("change", showSampling);
    field("greedy").addEventListener("change", showSampling);
    showSampling();
    wirePresets(f, showSampling);
    // Files dropped on the desktop window arrive as paths: attach them and count.
    const win = window as unknown as { longhaulDrop?: (d: { kind: string; paths: string[] }) => void };
    win.longhaulDrop = (d) => {
      f.classList.toggle("dropping", d.kind === "enter");
      if (d.kind !== "drop" || d.paths.length === 0) return;
      const list = field("attachments") as unknown as HTMLTextAreaElement;
      const have = new Set(list.value.split("\n").map((x) => x.trim()).filter(Boolean));
      d.paths.forEach((p) => have.add(p));
      list.value = [...have].join("\n");
      (root.querySelector("#count") as HTMLButtonElement | null)?.click();
    };
    // The system prompt and template switches are for chats only.
    const chatRows = [...f.querySelectorAll(".system-prompt")] as HTMLElement[];
    const showSystem = () => {
      const chat = (f.querySelector('input[name="mode"]:checked') as HTMLInputElement | null)?.value === "chat";
      chatRows.forEach((row) => (row.hidden = !chat));
    };
    f.querySelectorAll('input[name="mode"]').forEach((r) => r.addEventListener("change", showSystem));
    showSystem();
    const count = root.querySelector("#count") as HTMLButtonElement;
    const counted = root.querySelector("#token-count") as HTMLElement;
    const forecastLine = root.querySelector("#forecast") as HTMLElement;
    count.addEventListener("click", async () => {
      clearFormErrors(f);
      try {
        const b = body(f);
        const p = await post<{
          prompt_tokens: number;
          estimate: boolean;
          context_tokens: number | null;
          attachment_files: string[];
          skipped: { path: string; reason: string }[];
          forecast: Forecast;
        }>(
          "/api/jobs/preview",
          { model: b.model, prompt: b.prompt, messages: b.messages, attachments: b.attachments, chat_template_kwargs: b.chat_template_kwargs, max_tokens: b.max_tokens },
        );
        const skipped = p.skipped.length ? ` · skipped ${p.skipped.map((s) => `${s.path} (${s.reason})`).join(", ")}` : "";
        const context = p.context_tokens ? ` of the model's ${p.context_tokens}-token context` : "";
        counted.textContent = `${p.estimate ? "about " : ""}${p.prompt_tokens} prompt tokens${context} · ${p.attachment_files.length} attached files${skipped}`;
        // The service refuses a job that cannot fit; say so before it is sent.
        const asked = Number(b.max_tokens ?? 0);
        const room = (p.context_tokens ?? Infinity) - p.prompt_tokens;
        counted.classList.toggle("warn", !p.estimate && (room <= 0 || asked > room));
        if (!p.estimate && room <= 0) {
          counted.textContent += ` — too long for the model: shorten it by at least ${1 - room} tokens`;
        } else if (!p.estimate && asked > room) {
          counted.textContent += ` — with max tokens ${asked} it does not fit: at most ${room}`;
        }
        forecastLine.textContent = forecastWords(p.forecast);
      } catch (e) {
        showFormError(f, e);
      }
    });
    f.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      clearFormErrors(f);
      let b: Record<string, unknown>;
      try {
        b = body(f);
      } catch (e) {
        showFormError(f, e);
        return;
      }
      const text = (b.prompt as string | undefined) ?? (b.messages as { role: string; content: string }[] | undefined)?.find((m) => m.role === "user")?.content ?? "";
      if (!text.trim()) {
        showFormError(f, new ApiError("Describe the task first.", 400, "prompt"));
        return;
      }
      const submit = root.querySelector("#submit") as HTMLButtonElement;
      submit.disabled = true;
      try {
        const job = await post<Job>("/api/jobs", b);
        toast(`Queued “${job.title}”`);
        (f.elements.namedItem("prompt") as HTMLTextAreaElement).value = "";
        (f.elements.namedItem("title") as HTMLInputElement).value = "";
        counted.textContent = "";
        await refresh();
      } catch (e) {
        showFormError(f, e);
      } finally {
        submit.disabled = false;
      }
    });
  }

  const offQueue = store.onQueue(refresh);
  let pending = false;
  const offJob = store.onJob((p) => {
    const j = jobs.find((x) => x.id === p.id);
    if (!j) return;
    if (p.offset !== null) {
      j.tokens = p.tokens;
      j.state = p.state;
    }
    if (!pending) {
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        draw();
      });
    }
  });
  const onKey = (e: KeyboardEvent) => {
    if (e.key === "/" && document.activeElement?.tagName !== "TEXTAREA" && document.activeElement?.tagName !== "INPUT") {
      e.preventDefault();
      search.focus();
    }
  };
  document.addEventListener("keydown", onKey);
  return () => {
    delete (window as unknown as { longhaulDrop?: unknown }).longhaulDrop;
    offQueue();
    offJob();
    document.removeEventListener("keydown", onKey);
  };
}

/** A forecast in one line: the RAM, the first token, the end, and what it rests on. */
function forecastWords(f: Forecast): string {
  const ram = `needs about ${bytes(f.ram_bytes)} of RAM`;
  if (f.total_seconds == null) return `Forecast: ${ram}; ${f.words}.`;
  const first = f.first_token_seconds == null ? "" : `, first token in ${duration(f.first_token_seconds)}`;
  const speed = f.tokens_per_second == null ? "" : ` at ${f.tokens_per_second.toFixed(2)} tok/s`;
  return `Forecast: ${ram}${first}, done in ${duration(f.total_seconds)}${speed} (${f.words}).`;
}
