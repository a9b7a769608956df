// The morning view: every task of the night in one table — when it started
// and ended, how long it took, what interrupted it and why, what it wrote
// and what it cost — with filters, and the next step for each: open it, run
// it again, edit a copy, continue it, ask a follow-up, or delete it.

import { conversationOf, del, get, Job, post, promptOf, Settings } from "../api";
import { stateBadge, toast } from "../dom";
import { bytes, duration, esc, percent, rate } from "../format";
import { store } from "../store";

/** Where "Duplicate and edit" leaves a task for the task form to pick up. */
export const DRAFT_KEY = "longhaul.draft";

/** A task as the form takes it. */
export interface Draft extends Pick<Settings, "max_tokens" | "temperature" | "top_p" | "top_k" | "seed" | "stop"> {
  title: string;
  model: string;
  prompt: string;
  /** The chat's system prompt, if it had one. */
  system?: string;
  chat: boolean;
}

const ENDED = new Set(["done", "failed", "cancelled"]);

/** The task's input as sent, with its attachments where the service put them. */
function messagesOf(j: Job): { role: string; content: string }[] {
  const attached = j.request.attachments ?? "";
  const i = j.request.input;
  const conversation = conversationOf(i);
  if (conversation) {
    let first = true;
    return conversation.map((m) => {
      if (m.role === "user" && first) {
        first = false;
        return { role: m.role, content: attached + m.content };
      }
      return m;
    });
  }
  return [{ role: "user", content: attached + (promptOf(i) ?? "") }];
}

/** A follow-up question typed but not yet queued (offered again after a refusal). */
let unsent = "";

function settingsOf(j: Job): Record<string, unknown> {
  const s = j.request.settings;
  return {
    max_tokens: s.max_tokens,
    temperature: s.temperature,
    top_p: s.top_p,
    top_k: s.top_k ?? undefined,
    seed: s.seed,
    stop: s.stop.length ? s.stop : undefined,
    speculate: s.speculate,
    draft_model: s.draft_model ?? undefined,
    repetition_penalty: s.repetition_penalty,
    frequency_penalty: s.frequency_penalty,
    presence_penalty: s.presence_penalty,
  };
}

/** The same task again: same input (attachments as they were read), same settings. */
function rerun(j: Job): Record<string, unknown> {
  const input = conversationOf(j.request.input) ? { messages: messagesOf(j) } : { prompt: messagesOf(j)[0].content };
  return { model: j.model, title: `${j.title} (again)`, ...input, ...settingsOf(j) };
}

/** More of the answer: a plain prompt continues its own text; a chat is asked to go on.
 * The task's max tokens is a cap, cut to what the longer prompt leaves. */
function continuation(j: Job, output: string): Record<string, unknown> {
  const base = { model: j.model, title: `${j.title} (continued)`, ...settingsOf(j), fit_max_tokens: true };
  if (!conversationOf(j.request.input)) return { ...base, prompt: messagesOf(j)[0].content + output };
  return { ...base, messages: [...messagesOf(j), { role: "assistant", content: output }, { role: "user", content: "Continue exactly where you stopped." }] };
}

/** A question about the answer, in the same conversation (its max tokens a cap, as for a continuation). */
function followUp(j: Job, output: string, question: string): Record<string, unknown> {
  return {
    model: j.model,
    title: `${j.title}: ${question.slice(0, 40)}`,
    ...settingsOf(j),
    fit_max_tokens: true,
    messages: [...messagesOf(j), { role: "assistant", content: output }, { role: "user", content: question }],
  };
}

function draftOf(j: Job): Draft {
  const s = j.request.settings;
  const i = j.request.input;
  return {
    title: `${j.title} (copy)`,
    model: j.model,
    prompt: (j.request.attachments ?? "") + (promptOf(i) ?? conversationOf(i)?.find((m) => m.role === "user")?.content ?? ""),
    system: conversationOf(i)?.find((m) => m.role === "system")?.content,
    chat: !!conversationOf(i),
    max_tokens: s.max_tokens,
    temperature: s.temperature,
    top_p: s.top_p,
    top_k: s.top_k,
    seed: s.seed,
    stop: s.stop,
  };
}

/** Why a task stopped or stalled, in a few words. */
function why(j: Job): string {
  const parts: string[] = [];
  if (j.stats?.resumes) parts.push(`resumed ${j.stats.resumes}×`);
  const pauses = (j.log.match(/paused: [^\n]*/g) ?? []).map((l) => l.slice("paused: ".length));
  if (pauses.length) parts.push(`paused by ${[...new Set(pauses)].join("; ")}`);
  if (j.pause_reason && j.state === "paused") parts.push(j.pause_reason);
  if (j.error) parts.push(j.error);
  if (j.finish_reason) parts.push(`ended: ${j.finish_reason}`);
  return parts.join(" · ");
}

function day(ms: number): string {
  const d = new Date(ms);
  return `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, "0")}-${String(d.getDate()).padStart(2, "0")}`;
}

function time(ms: number | null): string {
  return ms ? new Date(ms).toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" }) : "–";
}

function row(j: Job): string {
  const s = j.stats;
  const act = (a: string, label: string, enabled = true) => (enabled ? `<button class="small secondary" data-act="${a}" data-id="${j.id}">${label}</button>` : "");
  const ended = ENDED.has(j.state);
  return `<tr data-id="${j.id}" data-state="${j.state}">
    <td><a href="#/job/${j.id}">${esc(j.title)}</a><div class="hint">${esc(j.model)}</div></td>
    <td>${stateBadge(j.state)}<div class="hint">${esc(why(j))}</div></td>
    <td>${time(j.started_ms)}</td>
    <td>${time(j.finished_ms)}</td>
    <td>${duration(s?.wall_seconds)}</td>
    <td>${j.tokens} / ${j.request.settings.max_tokens}</td>
    <td>${s && s.tokens_per_second > 0 ? rate(s.tokens_per_second) : "–"}</td>
    <td>${bytes(s?.expert_bytes_read)}</td>
    <td>${percent(s?.cache_hit_rate)}${s?.prefix_tokens ? `<div class="hint">${s.prefix_tokens} prompt tokens reused</div>` : ""}</td>
    <td class="actions">
      ${act("rerun", "Re-run")}${act("edit", "Duplicate and edit")}${act("continue", "Continue", j.state === "done" && j.tokens > 0)}${act("follow", "Follow up", j.state === "done")}${act("delete", "Delete", ended)}
    </td>
  </tr>`;
}

/** Where the last visit ended (ms), kept across tabs and restarts. */
const LAST_SEEN_KEY = "longhaul.lastSeen";
/** How often a visible page counts as seen. */
const SEEN_EVERY_MS = 60_000;

/** When the user last had Longhaul in front of them, before this visit. */
export const lastVisit = Number(localStorage.getItem(LAST_SEEN_KEY) ?? 0);
const seen = () => localStorage.setItem(LAST_SEEN_KEY, String(Date.now()));
document.addEventListener("visibilitychange", () => document.visibilityState === "hidden" && seen());
window.addEventListener("pagehide", seen);
setInterval(() => document.visibilityState === "visible" && seen(), SEEN_EVERY_MS);

/** Jobs that ended since the last visit. */
export function endedSinceLastVisit(jobs: Job[]): Job[] {
  return jobs.filter((j) => (j.finished_ms ?? 0) > lastVisit);
}

/** A job's size of work: its tokens, read and written. */
function work(j: Job): number {
  return j.tokens + (j.stats?.prompt_tokens ?? 0);
}

/** The "while you were away" summary; false when nothing happened. */
function drawAway(box: HTMLElement, jobs: Job[]): boolean {
  const ended = endedSinceLastVisit(jobs);
  const paused = jobs.filter((j) => j.state === "paused");
  if (!lastVisit || (ended.length === 0 && paused.length === 0)) return false;
  const count = (state: string) => ended.filter((j) => j.state === state).length;
  const starts = ended.map((j) => j.started_ms ?? j.created_ms);
  const ends = ended.map((j) => j.finished_ms ?? 0);
  const span = ended.length ? `${time(Math.min(...starts))} – ${time(Math.max(...ends))} (${duration((Math.max(...ends) - Math.min(...starts)) / 1000)})` : "";
  const tokens = ended.reduce((n, j) => n + j.tokens, 0);
  const failures = ended.filter((j) => j.state === "failed");
  const act = (j: Job, a: string, label: string) => `<button class="small secondary" data-act="${a}" data-id="${j.id}">${label}</button>`;
  box.className = "card away";
  box.innerHTML = `<h3>While you were away <span class="hint">since ${time(lastVisit)}</span></h3>
    <p class="away-counts"><b>${count("done")}</b> done · <b>${count("failed")}</b> failed · <b>${paused.length}</b> paused · <b>${count("cancelled")}</b> cancelled · ${tokens.toLocaleString()} tokens written${span ? ` · ${span}` : ""}</p>
    <ul class="away-list">${[
      ...failures.map((j) => `<li><a href="#/job/${j.id}">${esc(j.title)}</a> failed: ${esc(j.error ?? "no reason recorded")} ${act(j, "rerun", "Re-run")}</li>`),
      ...paused.map((j) => `<li><a href="#/job/${j.id}">${esc(j.title)}</a> is paused: ${esc(j.pause_reason ?? "")} ${act(j, "resume", "Resume")}</li>`),
    ].join("")}</ul>`;
  return true;
}

export async function render(root: HTMLElement): Promise<() => void> {
  root.innerHTML = `<section class="card">
    <div class="queue-head"><h2>Tasks overnight</h2><span class="hint" id="report-sum"></span></div>
    <div id="away" hidden></div>
    <form id="report-filters" class="row" aria-label="Filter the tasks">
      <label class="inline">Order <select name="order"><option value="time">newest first</option><option value="work">most work first</option></select></label>
      <label class="inline">State <select name="state"><option value="">any</option>
        ${["done", "failed", "cancelled", "paused", "running", "queued", "interrupted"].map((s) => `<option>${s}</option>`).join("")}</select></label>
      <label class="inline">Model <select name="model"><option value="">any</option></select></label>
      <label class="inline">From <input type="date" name="from" /></label>
      <label class="inline">To <input type="date" name="to" /></label>
    </form>
    <div class="table-wrap"><table class="table report"><thead><tr>
      <th>Task</th><th>State, and why</th><th>Started</th><th>Finished</th><th>Duration</th><th>Tokens</th><th>Speed</th><th>Expert bytes read</th><th>Hit rate</th><th>Next</th>
    </tr></thead><tbody id="report-rows"><tr><td colspan="10" class="loading">Loading…</td></tr></tbody></table></div>
  </section>`;
  const filters = root.querySelector("#report-filters") as HTMLFormElement;
  const rows = root.querySelector("#report-rows") as HTMLElement;
  const sum = root.querySelector("#report-sum") as HTMLElement;
  const field = (n: string) => (filters.elements.namedItem(n) as HTMLInputElement).value;
  let jobs: Job[] = [];

  const away = root.querySelector("#away") as HTMLElement;
  const draw = () => {
    away.hidden = !drawAway(away, jobs);
    const order = field("order");
    const shown = [...jobs].sort((a, b) => (order === "work" ? work(b) - work(a) : 0)).filter((j) => {
      const at = day(j.started_ms ?? j.created_ms);
      return (!field("state") || j.state === field("state")) && (!field("model") || j.model === field("model")) && (!field("from") || at >= field("from")) && (!field("to") || at <= field("to"));
    });
    rows.innerHTML = shown.length
      ? shown.map(row).join("")
      : `<tr><td colspan="10" class="empty">${jobs.length ? "No task matches these filters." : "No tasks yet."}</td></tr>`;
    const tokens = shown.reduce((n, j) => n + j.tokens, 0);
    const read = shown.reduce((n, j) => n + (j.stats?.expert_bytes_read ?? 0), 0);
    const failed = shown.filter((j) => j.state === "failed").length;
    sum.textContent = `${shown.length} tasks · ${tokens.toLocaleString()} tokens · ${bytes(read)} of experts read${failed ? ` · ${failed} failed` : ""}`;
  };
  const refresh = async () => {
    try {
      jobs = (await get<{ jobs: Job[] }>("/api/jobs")).jobs.sort((a, b) => (b.started_ms ?? b.created_ms) - (a.started_ms ?? a.created_ms));
      const models = filters.elements.namedItem("model") as HTMLSelectElement;
      const chosen = models.value;
      models.innerHTML = `<option value="">any</option>${[...new Set(jobs.map((j) => j.model))].map((m) => `<option>${esc(m)}</option>`).join("")}`;
      models.value = chosen;
      draw();
    } catch (e) {
      rows.innerHTML = `<tr><td colspan="10" class="error">${esc((e as Error).message)}</td></tr>`;
    }
  };
  filters.addEventListener("input", draw);
  filters.addEventListener("change", draw);

  root.addEventListener("click", async (ev) => {
    const b = (ev.target as HTMLElement).closest("button[data-act]") as HTMLButtonElement | null;
    if (!b) return;
    const j = jobs.find((x) => x.id === Number(b.dataset.id));
    if (!j) return;
    const act = b.dataset.act;
    try {
      if (act === "edit") {
        sessionStorage.setItem(DRAFT_KEY, JSON.stringify(draftOf(j)));
        location.hash = "#/tasks";
        return;
      }
      if (act === "resume") {
        await post(`/api/jobs/${j.id}/resume`);
      } else if (act === "delete") {
        if (!confirm(`Delete “${j.title}” and its output for good?`)) return;
        await del(`/api/jobs/${j.id}`);
        toast(`Deleted “${j.title}”`);
      } else {
        const full = await get<Job>(`/api/jobs/${j.id}`);
        let body: Record<string, unknown>;
        if (act === "rerun") body = rerun(full);
        else if (act === "continue") body = continuation(full, full.output ?? "");
        else {
          const q = prompt("Ask about this answer:", unsent);
          if (!q?.trim()) return;
          // Kept until it is queued: a refusal does not lose what was typed.
          unsent = q;
          body = followUp(full, full.output ?? "", q.trim());
        }
        const made = await post<Job>("/api/jobs", body);
        if (act === "follow") unsent = "";
        toast(`Queued “${made.title}”`);
      }
      await refresh();
    } catch (e) {
      toast((e as Error).message, "error");
    }
  });

  await refresh();
  const offQueue = store.onQueue(() => void refresh());
  const offResync = store.onResync(() => void refresh());
  return () => {
    offQueue();
    offResync();
  };
}
