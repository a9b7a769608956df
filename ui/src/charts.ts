// Time-series charts (uPlot) in the theme's colours, shared by the
// Dashboard and the Results view.

import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

import { Sample, store } from "./store";

/** Draws each interruption (pause, failure) as a dashed vertical line, with its text on hover. */
function drawMarks(u: uPlot): void {
  const ctx = u.ctx;
  const [min, max] = [u.scales.x.min ?? 0, u.scales.x.max ?? 0];
  const color = getComputedStyle(document.documentElement).getPropertyValue("--warn").trim() || "#b7791f";
  ctx.save();
  ctx.strokeStyle = color;
  ctx.setLineDash([4, 4]);
  ctx.lineWidth = 1.5 * devicePixelRatio;
  for (const m of store.marks) {
    if (m.t < min || m.t > max) continue;
    const x = Math.round(u.valToPos(m.t, "x", true));
    ctx.beginPath();
    ctx.moveTo(x, u.bbox.top);
    ctx.lineTo(x, u.bbox.top + u.bbox.height);
    ctx.stroke();
  }
  // Time with no figures (the service stopped or unreachable): shaded.
  // The times of real samples (not the empty points `columns` puts in gaps).
  const real = Array.from(u.data[0]).filter((_, i) => u.data.slice(1).some((col) => col[i] != null));
  const outages = gaps(real).filter(([a, b]) => b >= min && a <= max);
  ctx.fillStyle = getComputedStyle(document.documentElement).getPropertyValue("--line").trim() || "#e2e0db";
  ctx.globalAlpha = 0.6;
  ctx.setLineDash([]);
  for (const [a, b] of outages) {
    const x0 = u.valToPos(Math.max(a, min), "x", true);
    const x1 = u.valToPos(Math.min(b, max), "x", true);
    ctx.fillRect(x0, u.bbox.top, Math.max(1, x1 - x0), u.bbox.height);
  }
  ctx.restore();
  const shown = store.marks.filter((m) => m.t >= min && m.t <= max);
  const when = (t: number) => new Date(t * 1000).toLocaleTimeString();
  u.root.dataset.marks = String(shown.length);
  u.root.dataset.gaps = String(outages.length);
  u.root.title = [
    ...shown.map((m) => `${when(m.t)} ${m.text}`),
    ...outages.map(([a, b]) => `${when(a)}–${when(b)} no figures: the service was stopped or not answering`),
  ].join("\n");
}

export const COLORS = ["#2f7dd1", "#d1792f", "#3aa35b", "#b04ac9", "#c9a227", "#c94a4a", "#4ac9c0", "#7a7a7a"];

// Rates and sizes are read against zero, not against their own wobble.
const fromZero: uPlot.Scale.Range = (_u, _min, max) => [0, max > 0 ? max * 1.15 : 1];
export const share: uPlot.Scale.Range = () => [0, 1];
/** The time axis spans at least a minute, so one sample does not stretch it over years. */
const MIN_TIME_SPAN_S = 60;
const timeRange: uPlot.Scale.Range = (_u, min, max) => (max - min < MIN_TIME_SPAN_S ? [max - MIN_TIME_SPAN_S, max] : [min, max]);
/** Memory never spans less than 1 MiB, so an empty chart reads 0 B … 1 MiB, not "1 B, 1 B, 0 B". */
const MIN_MEMORY_SPAN = 1 << 20;
export const memoryRange: uPlot.Scale.Range = (_u, _min, max) => [0, Math.max(MIN_MEMORY_SPAN, max * 1.15)];

export function chart(
  el: HTMLElement,
  title: string,
  series: { label: string; color: string; dash?: number[] }[],
  yLabel: string,
  format?: (v: number) => string,
  yRange: uPlot.Scale.Range = fromZero,
): uPlot {
  // Axes in the theme's colours (light or dark).
  const css = getComputedStyle(document.documentElement);
  const ink = css.getPropertyValue("--muted").trim() || "#6b7075";
  const grid = css.getPropertyValue("--line").trim() || "#e2e0db";
  const opts: uPlot.Options = {
    title,
    width: Math.max(300, el.clientWidth - 8),
    height: 200,
    scales: { x: { time: true, range: timeRange }, y: { range: yRange } },
    axes: [
      { stroke: ink, grid: { stroke: grid } },
      { stroke: ink, grid: { stroke: grid }, label: yLabel, size: 70, ...(format ? { values: (_u: uPlot, vals: number[]) => vals.map(format) } : {}) },
    ],
    series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, width: s.dash ? 1 : 2, dash: s.dash, spanGaps: false }))],
    // The y range in use, on the element: what the axis reads, for tests and tools.
    hooks: {
      setScale: [(u: uPlot, key: string) => key === "y" && (el.dataset.yMax = String(u.scales.y.max ?? ""))],
      draw: [drawMarks],
    },
  };
  el.setAttribute("role", "img");
  el.setAttribute("aria-label", `Chart: ${title}`);
  return new uPlot(opts, [[], ...series.map(() => [])], el);
}

/** Samples further apart than this many times their usual spacing (every
 * second live, every minute in the week's history) leave a gap: time nobody
 * measured, as the service was stopped or not answering. */
export const GAP_FACTOR = 5;

/** The usual spacing of sorted times: their median step. */
function step(times: ArrayLike<number>): number {
  const d: number[] = [];
  for (let i = 1; i < times.length; i++) d.push(times[i] - times[i - 1]);
  d.sort((a, b) => a - b);
  return d.length ? d[Math.floor(d.length / 2)] : Infinity;
}

/** The gaps in a chart's time column: [from, to] pairs. */
function gaps(times: ArrayLike<number>): [number, number][] {
  const limit = GAP_FACTOR * step(times);
  const out: [number, number][] = [];
  for (let i = 1; i < times.length; i++) {
    if (times[i] - times[i - 1] > limit) out.push([times[i - 1], times[i]]);
  }
  return out;
}

/** Columns for uPlot, with an empty point inside each gap so lines break
 * there instead of sloping through time nobody measured. */
export function columns(samples: Sample[], pick: ((s: Sample) => number | null)[]): uPlot.AlignedData {
  const rows: (Sample | null)[] = [];
  const times: number[] = [];
  const limit = GAP_FACTOR * step(samples.map((s) => s.t));
  samples.forEach((s, i) => {
    if (i > 0 && s.t - samples[i - 1].t > limit) {
      rows.push(null);
      times.push((samples[i - 1].t + s.t) / 2);
    }
    rows.push(s);
    times.push(s.t);
  });
  return [times, ...pick.map((f) => rows.map((r) => (r ? f(r) : null)))] as uPlot.AlignedData;
}

