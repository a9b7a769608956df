// Models: the registered checkpoints, packs and remote servers; add and remove.

import { del, get, Model, post } from "../api";
import { clearFormErrors, showFormError, toast } from "../dom";
import { esc, when } from "../format";

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
              <div class="hint"><code>${esc(m.path ?? m.url ?? "")}</code>${m.remote_model ? ` · ${esc(m.remote_model)}` : ""} · added ${when(m.created_ms)}</div>
              <button class="small secondary" data-remove="${esc(m.name)}">Remove</button></li>`,
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
    const b = (ev.target as HTMLElement).closest("button[data-remove]") as HTMLButtonElement | null;
    if (!b) return;
    const name = b.dataset.remove ?? "";
    if (!confirm(`Remove ${name}? Its files stay where they are.`)) return;
    try {
      await del(`/api/models/${encodeURIComponent(name)}`);
      await refresh();
    } catch (e) {
      toast((e as Error).message, "error");
    }
  });
  return () => {};
}
