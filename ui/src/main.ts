// Longhaul's web UI: a hash-routed single page over the service's API.
// Served by `longhaul serve` at `/` and shown by the desktop shell.

import "./locale";
import "./style.css";

import { adoptToken, get, Job, token } from "./api";
import * as banner from "./banner";
import { toast } from "./dom";
import { store } from "./store";
import * as dashboard from "./views/dashboard";
import * as drives from "./views/drives";
import * as jobView from "./views/job";
import * as models from "./views/models";
import * as report from "./views/report";
import * as settings from "./views/settings";
import * as tasks from "./views/tasks";

const VIEWS: [string, string][] = [
  ["tasks", "Tasks"],
  ["report", "Overnight"],
  ["dashboard", "Dashboard"],
  ["drives", "Drives"],
  ["models", "Models"],
  ["settings", "Settings"],
];

adoptToken();

const app = document.getElementById("app") as HTMLElement;
app.innerHTML = `
  <a class="skip" href="#view" id="skip">Skip to content</a>
  <header class="top">
    <h1 class="brand-h"><a class="brand" href="#/tasks">Longhaul</a></h1>
    <nav aria-label="Views">${VIEWS.map(([id, label]) => `<a href="#/${id}" data-view="${id}">${label}</a>`).join("")}</nav>
    <span id="conn" class="conn" title="Connection to the service">connecting…</span>
  </header>
  <div id="banner" class="banner" role="status" aria-live="polite" hidden></div>
  <main id="view" tabindex="-1"></main>
  <div id="toasts" class="toasts" aria-live="polite"></div>`;
const view = document.getElementById("view") as HTMLElement;
// The skip link moves focus to the view without touching the hash route.
document.getElementById("skip")?.addEventListener("click", (ev) => {
  ev.preventDefault();
  view.focus();
});
const conn = document.getElementById("conn") as HTMLElement;

let cleanup: () => void = () => {};
let generation = 0;
// Set by the `n` key: the task view focuses its prompt once it has rendered.
let focusPrompt = false;

function focusPromptField(): void {
  (document.querySelector('#new-task textarea[name="prompt"]') as HTMLElement | null)?.focus();
}

async function route(): Promise<void> {
  const [, name = "tasks", arg] = location.hash.replace(/^#/, "").split("/");
  cleanup();
  cleanup = () => {};
  const mine = ++generation;
  const tab = name === "job" || name === "new" ? "tasks" : name;
  document.querySelectorAll("nav a").forEach((a) => {
    const here = (a as HTMLElement).dataset.view === tab;
    a.classList.toggle("active", here);
    if (here) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  });
  const container = document.createElement("div");
  container.className = `view view-${name}`;
  view.replaceChildren(container);
  if (!token()) {
    container.innerHTML = `<div class="card"><h2>Connect to the service</h2><p>Open the address <code>longhaul serve</code> printed (it carries the access token), or paste the token from the data dir's <code>token</code> file in <a href="#/settings">Settings</a>.</p></div>`;
    if (name !== "settings") return;
  }
  const render =
    name === "job"
      ? () => jobView.render(container, Number(arg))
      : { dashboard: dashboard.render, drives: drives.render, models: models.render, report: report.render, settings: settings.render }[name as "dashboard"]?.bind(null, container) ??
        (() => tasks.render(container));
  const done = await render();
  if (mine === generation) cleanup = done;
  else done();
  // `#/new` (the tray's "New task…") and the `n` key open the task form ready to type.
  if (mine === generation && (name === "new" || focusPrompt)) {
    focusPrompt = false;
    focusPromptField();
  }
}

window.addEventListener("hashchange", () => {
  // A `#token=` address opened in this tab: take the token and follow the stream with it.
  if (adoptToken()) store.start();
  void route();
});

/** The keyboard shortcuts, as `?` lists them. */
const SHORTCUTS: [string, string][] = [
  ["n", "New task (focus the task form)"],
  ["/", "Search the task list"],
  ["Ctrl/⌘ + Enter", "Queue the task being written"],
  ["?", "Show or hide this list"],
  ["Esc", "Close this list"],
];

function toggleShortcuts(show?: boolean): void {
  let box = document.getElementById("shortcuts");
  if (!box) {
    box = document.createElement("div");
    box.id = "shortcuts";
    box.className = "shortcuts card";
    box.setAttribute("role", "dialog");
    box.setAttribute("aria-label", "Keyboard shortcuts");
    box.innerHTML = `<h2>Keyboard shortcuts</h2><table class="table">${SHORTCUTS.map(([k, what]) => `<tr><td><kbd>${k}</kbd></td><td>${what}</td></tr>`).join("")}</table>`;
    box.hidden = true;
    document.body.append(box);
  }
  box.hidden = !(show ?? box.hidden);
}

// Ctrl/Cmd+Enter in the task form queues the task, wherever the focus is in it.
document.addEventListener("keydown", (e) => {
  if (e.key !== "Enter" || !(e.ctrlKey || e.metaKey)) return;
  const form = (document.activeElement as HTMLElement | null)?.closest("form#new-task") as HTMLFormElement | null;
  if (!form) return;
  e.preventDefault();
  form.requestSubmit();
});

// Keyboard: n = new task, / = search (in the task list), ? = the list of shortcuts.
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape") toggleShortcuts(false);
  const typing = ["INPUT", "TEXTAREA", "SELECT"].includes(document.activeElement?.tagName ?? "");
  if (typing || e.metaKey || e.ctrlKey || e.altKey) return;
  if (e.key === "?") {
    e.preventDefault();
    toggleShortcuts();
    return;
  }
  if (e.key === "n") {
    e.preventDefault();
    // On another view the form exists only once the task view has rendered.
    if (location.hash.startsWith("#/tasks") && document.querySelector("#new-task")) {
      focusPromptField();
    } else {
      focusPrompt = true;
      location.hash = "#/tasks";
    }
  }
});

// Connection state, and notifications when a task ends.
let wasConnected = false;
/** When the figures on screen were last fresh: a metrics sample, a task's
 * progress, or the page's own load. */
let lastLive = Date.now();
store.onMetrics(() => (lastLive = Date.now()));
store.onJob(() => (lastLive = Date.now()));
/** How old the figures on screen are, while they cannot be refreshed. */
function staleness(): string {
  const s = Math.round((Date.now() - lastLive) / 1000);
  return ` · figures from ${s < 90 ? `${s} s` : `${Math.round(s / 60)} min`} ago`;
}
const STALE_TICK_MS = 1000;
setInterval(() => {
  if (!store.connected && store.connection !== "connecting") showConnection();
}, STALE_TICK_MS);
function showConnection(): void {
  const word = { connected: "connected", reconnecting: "reconnecting…", rejected: "token refused", connecting: "connecting…" }[store.connection];
  conn.textContent = store.connected ? word : word + staleness();
  // Live figures are greyed while they cannot be refreshed (see style.css).
  document.body.classList.toggle("stale", !store.connected && store.connection !== "connecting");
  if (!store.connected) document.title = "Longhaul (not connected)";
}
store.onStatus(() => {
  showConnection();
  conn.classList.toggle("down", !store.connected);
  // Back after an outage: a view that could not load tries again.
  if (store.connected && !wasConnected && view.querySelector(".error")) void route();
  wasConnected = store.connected;
});
// The running task's progress in the page (and desktop window) title.
store.onJob((p) => {
  if (p.state !== "running") {
    document.title = "Longhaul";
    return;
  }
  const share = (done: number, total: number) => Math.min(100, Math.floor((100 * done) / Math.max(1, total)));
  document.title = p.prompt
    ? `Reading prompt ${share(p.prompt.done, p.prompt.total)}% · Longhaul`
    : `${share(p.tokens, p.max_tokens)}% · Longhaul`;
});
const announced = new Set<number>();
store.onJob(async (p) => {
  if (!["done", "failed"].includes(p.state) || p.offset === null || announced.has(p.id)) return;
  announced.add(p.id);
  try {
    const j = await get<Job>(`/api/jobs/${p.id}`);
    const text = p.state === "done" ? `Finished: ${j.title}` : `Failed: ${j.title}`;
    if (settings.notificationsOn()) {
      // Clicked, a notification opens its task.
      const n = new Notification("Longhaul", { body: text });
      n.onclick = () => {
        window.focus();
        location.hash = `#/job/${p.id}`;
      };
    }
    toast(text, p.state === "done" ? "info" : "error");
  } catch {
    // The list will show it.
  }
});

/** Opened with no view named: land on the night's results when tasks
 * ended since the last visit. */
async function landing(): Promise<void> {
  if (location.hash || !token()) return;
  try {
    const jobs = (await get<{ jobs: Job[] }>("/api/jobs")).jobs;
    if (report.endedSinceLastVisit(jobs).length > 0 && !location.hash) location.hash = "#/report";
  } catch {
    // The Tasks view says why the service cannot be read.
  }
}

banner.mount(document.getElementById("banner") as HTMLElement);
if (token()) store.start();
void route();
void landing();
