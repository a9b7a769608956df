// Results: one job's output rendered as sanitised Markdown (code coloured
// by language, tables ruled), live while it runs, with its statistics, copy and export, and its controls.

import DOMPurify from "dompurify";
import { marked } from "marked";

import { conversationOf, get, Job, post, promptOf, withToken } from "../api";
import { stateBadge, toast } from "../dom";
import { bytes, duration, esc, guessLine, percent, phaseLine, rate, when } from "../format";
import { chart, COLORS, columns } from "../charts";
import { highlightCode } from "../code";
import { Sample, store } from "../store";

function markdown(text: string): string {
  return DOMPurify.sanitize(marked.parse(text, { async: false }) as string);
}

/** Puts a Copy button on each code block of `out`. */
function addCopyButtons(out: Element): void {
  out.querySelectorAll("pre").forEach((pre) => {
    if (pre.querySelector("button.copy-code")) return;
    const b = document.createElement("button");
    b.className = "copy-code small secondary";
    b.type = "button";
    b.textContent = "Copy";
    b.setAttribute("aria-label", "Copy this code block");
    pre.prepend(b);
  });
}

/** Marks each match of `q` in `out`'s text; returns how many there are. */
function highlight(out: Element, q: string): number {
  if (!q) return 0;
  const needle = q.toLowerCase();
  const walker = document.createTreeWalker(out, NodeFilter.SHOW_TEXT);
  const hits: Text[] = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if ((n.textContent ?? "").toLowerCase().includes(needle) && !(n.parentElement?.closest("button"))) hits.push(n as Text);
  }
  let count = 0;
  for (const node of hits) {
    const text = node.textContent ?? "";
    const lower = text.toLowerCase();
    const frag = document.createDocumentFragment();
    let at = 0;
    for (let i = lower.indexOf(needle); i >= 0; i = lower.indexOf(needle, at)) {
      frag.append(text.slice(at, i));
      const mark = document.createElement("mark");
      mark.textContent = text.slice(i, i + q.length);
      frag.append(mark);
      at = i + q.length;
      count++;
    }
    frag.append(text.slice(at));
    node.replaceWith(frag);
  }
  return count;
}

/** The running job's phase: a bar and a line while the prompt is read, speed and ETA after. */
function phase(j: Job): string {
  const live = j.state === "running" ? j.live : null;
  if (!live) return "";
  const p = live.prompt;
  const bar = p
    ? `<div class="progress prompt" role="progressbar" aria-label="Prompt read" aria-valuenow="${p.done}" aria-valuemax="${p.total}"><div style="width:${Math.min(100, (100 * p.done) / Math.max(1, p.total))}%"></div></div>`
    : "";
  const line = phaseLine(live);
  return line ? `<p class="phase" role="status">${esc(line)}</p>${bar}` : "";
}

function statsGrid(j: Job): string {
  const s = j.stats;
  const cell = (k: string, v: string) => `<div><dt>${k}</dt><dd>${v}</dd></div>`;
  return `<div class="job-stats">${phase(j)}<dl class="stats">
    ${cell("Tokens", `${j.state === "running" ? (j.live?.tokens ?? j.tokens) : j.tokens} / ${j.request.settings.max_tokens}`)}
    ${cell("Speed", s && s.tokens_per_second > 0 ? rate(s.tokens_per_second) : "–")}
    ${cell("First token", s?.time_to_first_token_s != null ? duration(s.time_to_first_token_s) : "–")}
    ${cell("Wall time", duration(s?.wall_seconds))}
    ${cell("Expert bytes read", bytes(s?.expert_bytes_read))}
    ${cell("Cache hit rate", percent(s?.cache_hit_rate))}
    ${cell("Prompt tokens", s ? String(s.prompt_tokens) : "–")}
    ${cell("From the prefix cache", s?.prefix_tokens ? `${s.prefix_tokens} tokens (${bytes(s.prefix_bytes)})` : "–")}
    ${cell("Resumed", s ? `${s.resumes}×` : "–")}
    ${cell("Guessing ahead", guessLine(s?.speculation) || "–")}
  </dl>${driveReads(s?.drive_bytes_read)}</div>`;
}

function driveReads(reads: { path: string; bytes: number }[] | undefined): string {
  if (!reads?.length) return "";
  const rows = reads.map((r) => `<tr><td><code>${esc(r.path)}</code></td><td>${bytes(r.bytes)}</td></tr>`);
  return `<table class="table drive-reads"><thead><tr><th>Drive folder</th><th>Expert bytes read</th></tr></thead>
    <tbody>${rows.join("")}</tbody></table>`;
}

function task(j: Job): string {
  const i = j.request.input;
  const text = promptOf(i) ?? (conversationOf(i) ?? []).map((m) => `${m.role}: ${m.content}`).join("\n\n");
  const s = j.request.settings;
  return `<details class="card"><summary>Task and settings (${s.temperature === 0 ? "greedy" : `temperature ${s.temperature}, top-p ${s.top_p}`})</summary>
    <pre class="task">${esc(text)}</pre>
    <p class="hint">max_tokens ${s.max_tokens} · temperature ${s.temperature} · top_p ${s.top_p} · top_k ${s.top_k ?? "off"} · seed ${s.seed}${s.stop.length ? ` · stop ${esc(JSON.stringify(s.stop))}` : ""}${j.request.attachments ? ` · ${j.request.attachments.length} characters attached` : ""}${s.sampling_from ? ` · sampling left unset came from ${esc(s.sampling_from)}` : ""}${s.speculate ? ` · guessing ahead ${esc(s.speculate)}` : ""}${s.draft_model ? ` with draft model ${esc(s.draft_model)}` : ""}${(s.repetition_penalty ?? 1) !== 1 ? ` · repetition penalty ${s.repetition_penalty}` : ""}${s.frequency_penalty ? ` · frequency penalty ${s.frequency_penalty}` : ""}${s.presence_penalty ? ` · presence penalty ${s.presence_penalty}` : ""}</p>
    <p class="hint">Created ${when(j.created_ms)} · started ${when(j.started_ms)} · finished ${when(j.finished_ms)}</p>
    ${j.log ? `<pre class="log">${esc(j.log)}</pre>` : ""}
  </details>`;
}

/** The service's history while this task ran: minutes for the older part, seconds for the last ten minutes. */
function samplesOf(id: number): Sample[] {
  const recent = store.samples.filter((x) => x.job === id);
  const since = recent.length ? recent[0].t : Infinity;
  return [...store.minutes.filter((x) => x.job === id && x.t < since), ...recent];
}

function emptyNote(j: Job): string {
  if (j.state === "queued") return j.queue_position ? `Waiting in the queue (#${j.queue_position} in line).` : "Waiting in the queue.";
  if (j.state === "running" && j.live?.prompt) return "Reading the prompt; the answer starts when it is read.";
  if (j.state === "running") return "Starting…";
  return "No output yet.";
}

/** The fewest repeats of one line, or of one short stretch of text, that
 * make an answer look stuck in a loop. */
const LOOP_REPEATS = 8;
/** The longest stretch checked for repeating without line breaks. */
const LOOP_PERIOD = 80;

/** What an answer repeats at its end, when it looks stuck in a loop. */
export function loopOf(output: string): { text: string; times: number } | null {
  const lines = output.split("\n").map((l) => l.trim()).filter(Boolean);
  let run = 1;
  for (let i = lines.length - 1; i > 0 && lines[i] === lines[i - 1]; i--) run++;
  if (lines.length && run >= LOOP_REPEATS) return { text: lines[lines.length - 1], times: run };
  const tail = output.trimEnd();
  for (let p = 1; p <= LOOP_PERIOD; p++) {
    const unit = tail.slice(tail.length - p);
    let times = 1;
    while (tail.length >= (times + 1) * p && tail.slice(tail.length - (times + 1) * p, tail.length - times * p) === unit) times++;
    if (times >= LOOP_REPEATS && unit.trim()) return { text: unit.trim(), times };
  }
  return null;
}

/** A warning when the answer repeats itself, with the way out. */
function loopNote(output: string, j: Job): string {
  const loop = loopOf(output);
  if (!loop) return "";
  const shown = loop.text.length > 60 ? `${loop.text.slice(0, 60)}…` : loop.text;
  const penalized = (j.request.settings.repetition_penalty ?? 1) !== 1 || (j.request.settings.frequency_penalty ?? 0) !== 0;
  const advice = penalized ? "raise its penalties or sample (temperature above 0)" : "re-run it with a repetition penalty (1.1–1.3) or a frequency penalty, or sample (temperature above 0)";
  return `<p class="reason loop-warning">This answer repeats “${esc(shown)}” ${loop.times} times at its end: the model is looping. To avoid it, ${advice}.</p>`;
}

export async function render(root: HTMLElement, id: number): Promise<() => void> {
  root.innerHTML = `<div class="card loading">Loading task ${id}…</div>`;
  let job: Job;
  try {
    job = await get<Job>(`/api/jobs/${id}`);
  } catch (e) {
    root.innerHTML = `<div class="card error">${esc((e as Error).message)} <a href="#/tasks">Back to tasks</a></div>`;
    return () => {};
  }
  let output = job.output ?? "";
  // Event offsets count UTF-8 bytes.
  const utf8 = new TextEncoder();
  let outputBytes = utf8.encode(output).length;
  // The model's thinking, shown apart and folded unless the reader opens it.
  let reasoning = job.reasoning ?? "";
  let reasoningBytes = utf8.encode(reasoning).length;
  let thinkingOpen = false;
  const thinking = () =>
    reasoning
      ? `<details class="card thinking" id="thinking" ${thinkingOpen ? "open" : ""}><summary>Thinking <span class="hint">${reasoning.length.toLocaleString()} characters</span></summary><div class="thinking-text">${esc(reasoning)}</div></details>`
      : "";

  // One click must not end an overnight job: Cancel asks once more.
  let confirming = false;
  const draw = () => {
    const active = ["queued", "running", "paused", "interrupted"].includes(job.state);
    const controls = [
      ["queued", "running", "interrupted"].includes(job.state) ? `<button data-act="pause" class="secondary">Pause</button>` : "",
      job.state === "paused" ? `<button data-act="resume">Resume</button>` : "",
      active && !confirming ? `<button data-act="cancel" class="secondary">Cancel</button>` : "",
      active && confirming
        ? `<span class="confirm">End it for good? Its output is kept.</span><button data-act="cancel-confirm">End task</button><button data-act="keep" class="secondary">Keep it</button>`
        : "",
    ].join("");
    root.innerHTML = `
      <div class="card">
        <div class="job-head"><h2>${esc(job.title)}</h2>${stateBadge(job.state)}</div>
        <p class="hint">${esc(job.model)}${job.finish_reason ? ` · finished by ${esc(job.finish_reason)}` : ""}</p>
        ${job.pause_reason ? `<p class="reason">${esc(job.pause_reason)}</p>` : ""}
        ${job.error ? `<p class="reason error">${esc(job.error)}</p>` : ""}
        ${loopNote(output, job)}
        ${statsGrid(job)}
        <div class="row">
          ${controls}
          <button data-act="copy" class="secondary">Copy</button>
          <input id="find" type="search" placeholder="Find in the result" aria-label="Find in the result" value="${esc(query)}" />
          <span id="found" class="hint" aria-live="polite"></span>
          <a class="button secondary" href="${withToken(`/api/jobs/${id}/export?format=markdown`)}" download>Export Markdown</a>
          <a class="button secondary" href="${withToken(`/api/jobs/${id}/export?format=json`)}" download>Export JSON</a>
        </div>
      </div>
      ${task(job)}
      <section class="card job-chart" ${samplesOf(id).length < 2 ? "hidden" : ""}><div id="c-job" class="chart"></div></section>
      ${thinking()}
      <article class="card output" id="output">${output ? markdown(output) : `<p class="empty">${emptyNote(job)}</p>`}</article>
      <button id="jump" class="jump" hidden>Jump to latest ↓</button>`;
    decorate();
    drawChart?.();
  };
  // While the answer grows the page follows its end, unless the reader
  // scrolled up; then a button brings them back.
  let following = true;
  const atEnd = () => window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
  const onScroll = () => {
    following = atEnd();
    const jump = root.querySelector("#jump") as HTMLElement | null;
    if (jump) jump.hidden = following || job.state !== "running";
  };
  window.addEventListener("scroll", onScroll, { passive: true });
  const decorate = () => {
    const out = root.querySelector("#output");
    if (!out) return;
    highlightCode(out);
    addCopyButtons(out);
    const n = highlight(out, query);
    const found = root.querySelector("#found");
    if (found) found.textContent = query ? `${n} found` : "";
  };
  let query = "";
  let jobChart: ReturnType<typeof chart> | null = null;
  const drawChart = () => {
    const el = root.querySelector("#c-job") as HTMLElement | null;
    const points = samplesOf(id);
    if (!el || points.length < 2) return;
    (el.parentElement as HTMLElement).hidden = false;
    if (!jobChart || !el.contains(jobChart.root)) {
      jobChart?.destroy();
      jobChart = chart(el, "Tokens per second while this task ran", [{ label: "tok/s", color: COLORS[0] }], "tok/s");
    }
    jobChart.setData(columns(points, [(x) => x.tokensPerSecond]));
  };
  draw();
  drawChart();
  void store.loadHistory().then(drawChart);
  const offMetrics = store.onMetrics(drawChart);
  root.addEventListener("input", (ev) => {
    const input = ev.target as HTMLInputElement;
    if (input.id !== "find") return;
    query = input.value;
    const out = root.querySelector("#output");
    if (out) out.innerHTML = output ? markdown(output) : out.innerHTML;
    decorate();
    root.querySelector("#output mark")?.scrollIntoView({ block: "center" });
  });

  root.addEventListener("click", async (ev) => {
    const target = ev.target as HTMLElement;
    const codeCopy = target.closest("button.copy-code");
    if (codeCopy) {
      const code = codeCopy.parentElement?.querySelector("code")?.textContent ?? "";
      try {
        await navigator.clipboard.writeText(code);
        toast("Copied the code block");
      } catch {
        toast("The browser did not allow copying; select the text instead.", "error");
      }
      return;
    }
    if (target.closest("#jump")) {
      following = true;
      window.scrollTo({ top: document.body.scrollHeight });
      onScroll();
      return;
    }
    const b = target.closest("button[data-act]") as HTMLButtonElement | null;
    if (!b) return;
    const act = b.dataset.act;
    if (act === "cancel" || act === "keep") {
      confirming = act === "cancel";
      draw();
      return;
    }
    if (act === "copy") {
      try {
        await navigator.clipboard.writeText(output);
        toast("Copied the result");
      } catch {
        toast("The browser did not allow copying; select the text instead.", "error");
      }
      return;
    }
    try {
      confirming = false;
      job = await post<Job>(`/api/jobs/${id}/${act === "cancel-confirm" ? "cancel" : act}`);
      output = job.output ?? output;
      outputBytes = utf8.encode(output).length;
      reasoning = job.reasoning ?? reasoning;
      reasoningBytes = utf8.encode(reasoning).length;
      draw();
    } catch (e) {
      toast((e as Error).message, "error");
    }
  });

  const reload = async () => {
    job = await get<Job>(`/api/jobs/${id}`);
    output = job.output ?? "";
    outputBytes = utf8.encode(output).length;
    reasoning = job.reasoning ?? "";
    reasoningBytes = utf8.encode(reasoning).length;
    draw();
  };
  root.addEventListener("toggle", (ev) => {
    if ((ev.target as HTMLElement).id === "thinking") thinkingOpen = (ev.target as HTMLDetailsElement).open;
  }, true);
  let scheduled = false;
  const off = store.onJob((p) => {
    if (p.id !== id || p.offset === null) return;
    const reasoningAt = p.reasoning_offset ?? reasoningBytes;
    // A new state (queued → running) redraws the badge and the actions.
    if (p.state !== job.state && !["done", "failed", "cancelled", "paused"].includes(p.state)) {
      void reload();
      return;
    }
    if (p.offset === outputBytes && reasoningAt === reasoningBytes) {
      output += p.delta;
      outputBytes += utf8.encode(p.delta).length;
      const thought = p.reasoning_delta ?? "";
      const firstThought = thought !== "" && reasoning === "";
      reasoning += thought;
      reasoningBytes += utf8.encode(thought).length;
      if (firstThought) {
        draw();
      }
      job.tokens = p.tokens;
      job.state = p.state;
      job.live = p;
      if (p.stats) job.stats = p.stats;
    } else {
      // Missed or regenerated text: the job itself is the truth.
      void reload();
      return;
    }
    if (["done", "failed", "cancelled", "paused"].includes(p.state)) {
      void reload();
      return;
    }
    if (!scheduled) {
      scheduled = true;
      requestAnimationFrame(() => {
        scheduled = false;
        const out = root.querySelector("#output");
        if (out) out.innerHTML = output ? markdown(output) : `<p class="empty">${emptyNote(job)}</p>`;
        const thoughts = root.querySelector("#thinking");
        if (thoughts) thoughts.outerHTML = thinking();
        decorate();
        if (following) window.scrollTo({ top: document.body.scrollHeight });
        onScroll();
        const stats = root.querySelector(".job-stats");
        if (stats) stats.outerHTML = statsGrid(job);
      });
    }
  });
  const offResync = store.onResync(() => void reload());
  return () => {
    off();
    offResync();
    offMetrics();
    jobChart?.destroy();
    window.removeEventListener("scroll", onScroll);
  };
}
