// The status banner under the header: what needs the user while they are
// away from the view that would show it — the service down, the token
// refused, the queue held, the data dir full, a task paused by a drive
// (which retries by itself: its reason says when), a disk that warns.

import { get, Job, post, TOKEN_REFUSED } from "./api";
import { patchHtml, toast } from "./dom";
import { esc } from "./format";
import { store } from "./store";

interface QueueStatus {
  paused: boolean;
  storage_fault: string | null;
  running: number | null;
  waiting: number;
  held: { id: number; title: string; reason: string }[];
  /** What the disks under the packs warn of (see the Drives view). */
  health_warnings?: { device: string; kind: string; text: string }[];
}

/** Queue state is read again this often, besides on every queue event. */
const POLL_MS = 10_000;

let queue: QueueStatus | null = null;

/** What is holding the queue when no task runs, in a few words (empty when nothing is). */
export function holdLine(): string {
  if (!queue) return "";
  if (queue.storage_fault) return "held: the data dir cannot be written";
  if (queue.paused) return `queue paused${queue.waiting ? `, ${queue.waiting} waiting` : ""}`;
  const h = queue.held[0];
  return h ? `task <a href="#/job/${h.id}">${esc(h.title)}</a> paused: ${esc(h.reason)}` : "";
}

function lines(): string[] {
  const out: string[] = [];
  if (store.connection === "reconnecting") {
    out.push(`<span>The Longhaul service is not answering; reconnecting… Tasks keep their output and go on when it is back.</span>`);
  }
  if (store.connection === "rejected") {
    out.push(`<span>${esc(TOKEN_REFUSED)}</span> <a class="button small secondary" href="#/settings">Settings</a>`);
  }
  if (store.connection !== "connected" || !queue) return out;
  if (queue.storage_fault) out.push(`<span>${esc(queue.storage_fault)}</span>`);
  if (queue.paused) {
    const waiting = queue.waiting ? ` ${queue.waiting} waiting.` : "";
    out.push(`<span>The queue is paused: no task starts until it is resumed.${waiting}</span> <button class="small" data-banner="resume-queue">Resume queue</button>`);
  }
  for (const h of queue.held) {
    out.push(
      `<span>Task <a href="#/job/${h.id}">${esc(h.title)}</a> is paused: ${esc(h.reason)}</span> <button class="small secondary" data-banner="resume-job" data-id="${h.id}">Resume</button>`,
    );
  }
  for (const w of queue.health_warnings ?? []) {
    out.push(`<span>Drive ${esc(w.text)}.</span> <a class="button small secondary" href="#/drives">Drives</a>`);
  }
  if (queue.held.length + (queue.paused ? 1 : 0) >= 2) {
    out.push(`<span>Resume the queue and every paused task at once.</span> <button class="small" data-banner="resume-all">Resume all</button>`);
  }
  return out;
}

function draw(box: HTMLElement): void {
  const l = lines();
  box.hidden = l.length === 0;
  patchHtml(box, l.map((x) => `<div class="banner-line">${x}</div>`).join(""));
}

/** Keeps `box` showing what needs attention. */
export function mount(box: HTMLElement): void {
  const refresh = async () => {
    if (store.connection === "connected") {
      try {
        queue = await get<QueueStatus>("/api/queue");
      } catch {
        queue = null;
      }
    }
    draw(box);
  };
  store.onQueue(() => void refresh());
  store.onResync(() => void refresh());
  store.onStatus(() => void refresh());
  setInterval(() => void refresh(), POLL_MS);
  box.addEventListener("click", async (ev) => {
    const b = (ev.target as HTMLElement).closest("button[data-banner]") as HTMLButtonElement | null;
    if (!b) return;
    b.disabled = true;
    try {
      if (b.dataset.banner === "resume-queue") await post("/api/queue/resume");
      else if (b.dataset.banner === "resume-all") await post("/api/queue/resume-all");
      else await post<Job>(`/api/jobs/${b.dataset.id}/resume`);
    } catch (e) {
      toast((e as Error).message, "error");
    }
    await refresh();
  });
  void refresh();
}
