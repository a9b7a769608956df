// State shared by the views: the event stream, followed from start-up so the
// dashboard has the last ten minutes whichever view is open, and the latest
// progress of each job.

import { Connection, events, get, JobProgress, MetricsEvent } from "./api";

/** A point of the service's history (see the service's `history` module). */
interface HistoryPoint {
  t: number;
  seconds: number;
  drives: { path: string; mb_per_s: number; busy_share: number }[];
  hit_rate: number | null;
  recall: number | null;
  tokens_per_second: number | null;
  held_bytes: number;
  budget_bytes: number;
  running_job: number | null;
}

/** Something that interrupted a task. */
export interface Mark {
  t: number;
  job: number;
  kind: string;
  text: string;
}

function fromHistory(p: HistoryPoint): Sample {
  return {
    t: p.t,
    drives: Object.fromEntries(p.drives.map((d) => [d.path, d.mb_per_s])),
    busy: Object.fromEntries(p.drives.map((d) => [d.path, d.busy_share])),
    total: p.drives.reduce((s, d) => s + d.mb_per_s, 0),
    hitRate: p.hit_rate,
    recall: p.recall,
    tokensPerSecond: p.tokens_per_second,
    held: p.held_bytes,
    budget: p.budget_bytes,
    job: p.running_job,
  };
}

/** Samples kept for the charts: ten minutes at one per second. */
export const HISTORY = 600;

export interface Sample {
  t: number;
  drives: Record<string, number>;
  /** Share of the interval each drive was reading. */
  busy: Record<string, number>;
  total: number;
  hitRate: number | null;
  /** Share of the experts asked for in the interval that the pilot had predicted. */
  recall: number | null;
  tokensPerSecond: number | null;
  held: number;
  budget: number;
  /** The task running in the interval, if one was. */
  job: number | null;
}

type Listener = () => void;

class Store {
  samples: Sample[] = [];
  /** One point a minute for the last week, from the service. */
  minutes: Sample[] = [];
  /** When tasks were paused, failed or cut off: drawn on the charts' time axis. */
  marks: Mark[] = [];
  latest: MetricsEvent | null = null;
  progress = new Map<number, JobProgress>();
  connected = false;
  connection: Connection | "connecting" = "connecting";
  private stop: (() => void) | null = null;
  private jobListeners = new Set<(p: JobProgress) => void>();
  private queueListeners = new Set<Listener>();
  private resyncListeners = new Set<Listener>();
  private metricsListeners = new Set<Listener>();
  private statusListeners = new Set<Listener>();
  private lastCounters: { hits: number; misses: number } | null = null;
  private lastPilot: { demanded: number; correct: number } | null = null;

  /** Follows the event stream (again, with the current token, if it was followed). */
  start(): void {
    this.stop?.();
    this.stop = events({
      job: (p) => {
        // Only a running job has live figures; the saved job says the rest.
        if (p.state === "running") this.progress.set(p.id, p);
        else {
          // A task that stopped short is marked at once; the service keeps the mark too.
          if (this.progress.has(p.id) && ["paused", "failed", "interrupted"].includes(p.state)) {
            this.marks.push({ t: Date.now() / 1000, job: p.id, kind: p.state, text: `task ${p.id}: ${p.state}` });
          }
          this.progress.delete(p.id);
        }
        this.jobListeners.forEach((l) => l(p));
      },
      queue: () => this.queueListeners.forEach((l) => l()),
      resync: () => {
        this.progress.clear();
        void this.loadHistory();
        this.queueListeners.forEach((l) => l());
        this.resyncListeners.forEach((l) => l());
      },
      metrics: (m) => this.addMetrics(m),
      status: (c) => {
        this.connection = c;
        this.connected = c === "connected";
        this.statusListeners.forEach((l) => l());
      },
    });
  }

  /** Takes the service's history: what happened before this page was open. */
  async loadHistory(): Promise<void> {
    try {
      const h = await get<{ recent: HistoryPoint[]; minutes: HistoryPoint[]; marks: Mark[] }>("/api/metrics/history");
      this.marks = h.marks;
      const recent = h.recent.map(fromHistory);
      const oldest = recent.length ? recent[0].t : Infinity;
      const newest = recent.length ? recent[recent.length - 1].t : 0;
      // Samples this page saw before the service's own (a service restarted
      // keeps no per-second history: without them the outage would vanish
      // from the charts), and live ones that arrived while the history was
      // on its way, stay.
      this.samples = [...this.samples.filter((s) => s.t < oldest), ...recent, ...this.samples.filter((s) => s.t > newest)].slice(-HISTORY);
      this.minutes = h.minutes.map(fromHistory);
      this.metricsListeners.forEach((l) => l());
    } catch {
      // The live stream fills the charts anyway.
    }
  }

  private addMetrics(m: MetricsEvent): void {
    this.latest = m;
    const drives: Record<string, number> = {};
    const busy: Record<string, number> = {};
    let total = 0;
    for (const d of m.engine?.drives ?? []) {
      drives[d.path] = d.mb_per_s;
      busy[d.path] = d.busy_share;
      total += d.mb_per_s;
    }
    // Prefetch recall over the last interval, likewise.
    let recall: number | null = null;
    const p = m.engine?.pilot;
    if (p) {
      const prev = this.lastPilot;
      if (prev && p.demanded > prev.demanded) recall = (p.correct - prev.correct) / (p.demanded - prev.demanded);
      this.lastPilot = { demanded: p.demanded, correct: p.correct };
    }
    // Hit rate over the last interval, from the growing counters.
    let hitRate: number | null = null;
    const c = m.engine?.cache;
    if (c) {
      const prev = this.lastCounters;
      if (prev) {
        const lookups = c.hits + c.misses - prev.hits - prev.misses;
        hitRate = lookups > 0 ? (c.hits - prev.hits) / lookups : null;
      }
      this.lastCounters = { hits: c.hits, misses: c.misses };
    }
    this.samples.push({
      t: Date.now() / 1000,
      drives,
      busy,
      total,
      hitRate,
      recall,
      tokensPerSecond: m.tokens_per_second,
      held: c?.held_bytes ?? 0,
      budget: c?.budget_bytes ?? m.budget_bytes,
      job: m.running_job,
    });
    if (this.samples.length > HISTORY) this.samples.splice(0, this.samples.length - HISTORY);
    this.metricsListeners.forEach((l) => l());
  }

  onJob(l: (p: JobProgress) => void): () => void {
    this.jobListeners.add(l);
    return () => this.jobListeners.delete(l);
  }
  onQueue(l: Listener): () => void {
    this.queueListeners.add(l);
    return () => this.queueListeners.delete(l);
  }
  /** Events may have been missed: what a view shows must be fetched again. */
  onResync(l: Listener): () => void {
    this.resyncListeners.add(l);
    return () => this.resyncListeners.delete(l);
  }
  onMetrics(l: Listener): () => void {
    this.metricsListeners.add(l);
    return () => this.metricsListeners.delete(l);
  }
  onStatus(l: Listener): () => void {
    this.statusListeners.add(l);
    return () => this.statusListeners.delete(l);
  }
}

export const store = new Store();
