// Numbers for people.

export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined) return "–";
  // Binary units, as sizes are given to `longhaul` (4G = 4 GiB).
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(v >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}

export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

export function rate(r: number | null | undefined): string {
  return r === null || r === undefined ? "–" : `${r.toFixed(r < 10 ? 2 : 1)} tok/s`;
}

export function percent(x: number | null | undefined): string {
  return x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)}%`;
}

export function when(ms: number | null | undefined): string {
  return ms ? new Date(ms).toLocaleString() : "–";
}

/** Escapes text for insertion into HTML. */
export function esc(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c] ?? c);
}

/** What a running job is doing, in one line: reading its prompt or answering. */
export function phaseLine(p: { prompt: { done: number; total: number; per_second: number | null; eta_seconds: number | null } | null; tokens_per_second: number | null; eta_seconds: number | null } | null | undefined): string {
  if (!p) return "";
  if (p.prompt) {
    const r = p.prompt.per_second;
    const speed = r != null ? ` · ${r.toFixed(r < 10 ? 2 : 0)} tok/s` : "";
    const left = p.prompt.eta_seconds != null ? ` · ${duration(p.prompt.eta_seconds)} left` : "";
    return `Reading the prompt: ${p.prompt.done} / ${p.prompt.total} tokens${speed}${left}`;
  }
  const speed = rate(p.tokens_per_second);
  return p.eta_seconds != null ? `${speed} · ETA ≤ ${duration(p.eta_seconds)}` : p.tokens_per_second != null ? speed : "";
}

/** What guessing ahead did, in words: "31 of 40 guesses kept (78%) · 2.4 tokens per pass", or "" when nothing was guessed. */
export function guessLine(s: { verify_passes: number; drafted: number; accepted: number; plain_steps?: number } | undefined): string {
  if (!s?.drafted) return "";
  const kept = `${s.accepted} of ${s.drafted} guesses kept (${percent(s.accepted / s.drafted)})`;
  const passes = s.verify_passes + (s.plain_steps ?? 0);
  if (s.plain_steps == null || passes === 0) return `${kept} in ${s.verify_passes} passes`;
  // Each pass yields its own token and the guesses kept.
  return `${kept} · ${((passes + s.accepted) / passes).toFixed(2)} tokens per pass`;
}
