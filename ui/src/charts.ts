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
  ctx.restore();
  const shown = store.marks.filter((m) => m.t >= min && m.t <= max);
  u.root.dataset.marks = String(shown.length);
  u.root.title = shown.map((m) => `${new Date(m.t * 1000).toLocaleTimeString()} ${m.text}`).join("\n");
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
    series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, width: s.dash ? 1 : 2, dash: s.dash, spanGaps: true }))],
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

export function columns(samples: Sample[], pick: ((s: Sample) => number | null)[]): uPlot.AlignedData {
  return [samples.map((s) => s.t), ...pick.map((f) => samples.map(f))] as uPlot.AlignedData;
}

