// Settings: where the service keeps its data and how it runs, notifications,
// and the access token for this browser.

import { call, get, setToken, token } from "../api";
import { store } from "../store";
import { toast } from "../dom";
import { bytes, esc } from "../format";

interface Info {
  version: string;
  data_dir: string;
  address: string;
  budget_bytes: number;
  policy: string;
  cache_dtype: string;
}

const NOTIFY_KEY = "longhaul.notify";

export function notificationsOn(): boolean {
  return localStorage.getItem(NOTIFY_KEY) === "1" && "Notification" in window && Notification.permission === "granted";
}

export async function render(root: HTMLElement): Promise<() => void> {
  root.innerHTML = `<section class="card"><h2>Settings</h2><div id="info" class="loading">Loading…</div></section>
    <section class="card"><h2>Notifications</h2>
      <label class="inline"><input type="checkbox" id="desktop-notify" /> The desktop app tells me when a task finishes or fails</label>
      <label class="inline"><input type="checkbox" id="notify" /> This browser tab tells me too</label>
      <p class="hint" id="notify-note"></p></section>
    <section class="card"><h2>Access</h2>
      <p class="hint">This browser talks to the service with the token from its data dir (<code>token</code>). Paste it here if the page was opened without it.</p>
      <form id="token-form" class="row"><input id="token" type="password" autocomplete="off" value="${esc(token() ?? "")}" /><button>Save token</button></form></section>`;
  const box = root.querySelector("#info") as HTMLElement;
  try {
    const i = await get<Info>("/api/info");
    box.classList.remove("loading");
    box.innerHTML = `<dl class="stats">
      <div><dt>Data dir</dt><dd><code>${esc(i.data_dir)}</code></dd></div>
      <div><dt>Address</dt><dd><code>${esc(i.address)}</code></dd></div>
      <div><dt>RAM budget for experts</dt><dd>${bytes(i.budget_bytes)}</dd></div>
      <div><dt>Eviction</dt><dd>${esc(i.policy)}, cached as ${esc(i.cache_dtype)}</dd></div>
      <div><dt>Version</dt><dd>${esc(i.version)}</dd></div></dl>
      <p class="hint">These are set when the service starts: <code>longhaul serve --data-dir DIR --port N --budget SIZE</code>. Drives are chosen per model when it is packed (<code>longhaul pack … --drives</code>).</p>`;
  } catch (e) {
    box.innerHTML = `<p class="error">${esc((e as Error).message)}</p>`;
  }
  const notify = root.querySelector("#notify") as HTMLInputElement;
  const note = root.querySelector("#notify-note") as HTMLElement;
  notify.checked = notificationsOn();
  // Kept by the service, so the desktop app and every tab agree.
  const desktop = root.querySelector("#desktop-notify") as HTMLInputElement;
  try {
    desktop.checked = (await get<{ notify_when_done: boolean }>("/api/preferences")).notify_when_done;
  } catch {
    desktop.disabled = true;
  }
  desktop.addEventListener("change", async () => {
    try {
      await call("PUT", "/api/preferences", { notify_when_done: desktop.checked });
      toast(desktop.checked ? "The desktop app will tell you when tasks end" : "The desktop app will stay quiet");
    } catch (e) {
      desktop.checked = !desktop.checked;
      toast((e as Error).message, "error");
    }
  });
  notify.addEventListener("change", async () => {
    if (notify.checked) {
      if (!("Notification" in window)) {
        note.textContent = "This browser cannot show notifications.";
        notify.checked = false;
        return;
      }
      const p = await Notification.requestPermission();
      if (p !== "granted") {
        note.textContent = "The browser refused; allow notifications for this page in its settings.";
        notify.checked = false;
        return;
      }
    }
    localStorage.setItem(NOTIFY_KEY, notify.checked ? "1" : "0");
  });
  root.querySelector("#token-form")?.addEventListener("submit", (e) => {
    e.preventDefault();
    setToken((root.querySelector("#token") as HTMLInputElement).value);
    store.start();
    toast("Token saved");
  });
  return () => {};
}
