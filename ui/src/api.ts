// The service's HTTP API: every call carries the bearer token, every error
// comes back in one shape ({error: {message, param}}) and is thrown as ApiError.

const TOKEN_KEY = "longhaul.token";

export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly param: string | null,
  ) {
    super(message);
  }
}

/** What a refused token means and what to do. */
export const TOKEN_REFUSED =
  "The service refused this page's access token (it changes with each data dir). Open the address `longhaul serve` printed, which carries the token, or paste the data dir's token file in Settings.";

/** Takes a token handed over in the URL (`#token=…`) and keeps it; true if there was one. */
export function adoptToken(): boolean {
  const m = location.hash.match(/token=([0-9a-f]+)/i);
  if (!m) return false;
  localStorage.setItem(TOKEN_KEY, m[1]);
  history.replaceState(null, "", location.pathname + "#/tasks");
  return true;
}

export function token(): string | null {
  return localStorage.getItem(TOKEN_KEY);
}

export function setToken(t: string): void {
  localStorage.setItem(TOKEN_KEY, t.trim());
}

export async function call<T>(method: string, path: string, body?: unknown): Promise<T> {
  let res: Response;
  try {
    res = await fetch(path, {
      method,
      headers: {
        Authorization: `Bearer ${token() ?? ""}`,
        ...(body === undefined ? {} : { "Content-Type": "application/json" }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch {
    throw new ApiError("The Longhaul service is not reachable. Is it running?", 0, null);
  }
  const text = await res.text();
  let data: unknown = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (res.status === 401) {
    throw new ApiError(TOKEN_REFUSED, 401, null);
  }
  if (!res.ok) {
    const err = (data as { error?: { message?: string; param?: string | null } } | null)?.error;
    throw new ApiError(err?.message ?? `HTTP ${res.status}`, res.status, err?.param ?? null);
  }
  return data as T;
}

export const get = <T>(path: string) => call<T>("GET", path);
export const post = <T>(path: string, body: unknown = {}) => call<T>("POST", path, body);
export const del = <T>(path: string) => call<T>("DELETE", path);

/** A URL that carries the token in the query, for downloads and event streams. */
export function withToken(path: string): string {
  const sep = path.includes("?") ? "&" : "?";
  return `${path}${sep}token=${encodeURIComponent(token() ?? "")}`;
}

export interface Settings {
  max_tokens: number;
  temperature: number;
  top_p: number;
  top_k: number | null;
  seed: number;
  stop: string[];
  /** Where the settings the request left out came from, when the model gave them. */
  sampling_from?: string;
  /** Guessing ahead: auto, lookup or off (the answer is the same). */
  speculate?: string;
  /** A model on this machine that guesses ahead for this one. */
  draft_model?: string | null;
  /** transformers' repetition penalty (1: off), OpenAI's frequency and presence penalties (0: off). */
  repetition_penalty?: number;
  frequency_penalty?: number;
  presence_penalty?: number;
}

export interface JobStats {
  prompt_tokens: number;
  generated_tokens: number;
  time_to_first_token_s: number | null;
  tokens_per_second: number;
  wall_seconds: number;
  expert_bytes_read: number;
  /** The same bytes per drive folder (absent on jobs recorded before it existed). */
  drive_bytes_read?: { path: string; bytes: number }[];
  cache_hit_rate: number | null;
  resumes: number;
  /** Guessing ahead over the job's runs (absent on jobs recorded before it existed). */
  speculation?: Speculation;
  /** Prompt tokens the latest run took from the prefix cache, and the bytes of saved state. */
  prefix_tokens?: number;
  prefix_bytes?: number;
}

/** Guessing ahead: passes that verified guesses, guesses made and kept, passes of one token. */
export interface Speculation {
  verify_passes: number;
  drafted: number;
  accepted: number;
  /** Absent on jobs recorded before it existed. */
  plain_steps?: number;
}

export type JobState = "queued" | "running" | "paused" | "interrupted" | "done" | "failed" | "cancelled";

export interface Job {
  id: number;
  title: string;
  model: string;
  state: JobState;
  priority: number;
  queue_position: number | null;
  origin: string;
  request: {
    input: { prompt?: string; messages?: { role: string; content: string }[] };
    attachments?: string;
    settings: Settings;
    /** Switches for the model's chat template (`chat_template_kwargs`). */
    chat_args?: Record<string, unknown>;
  };
  output?: string;
  /** The model's reasoning, apart from the answer (absent where it did not think aloud). */
  reasoning?: string;
  tokens: number;
  stats: JobStats | null;
  error: string | null;
  pause_reason: string | null;
  finish_reason: string | null;
  log: string;
  created_ms: number;
  started_ms: number | null;
  finished_ms: number | null;
  /** The running job's latest progress (absent or null for the others). */
  live?: JobProgress | null;
}

export interface Model {
  name: string;
  kind: "local" | "remote";
  path?: string;
  url?: string;
  remote_model?: string;
  created_ms: number;
  /** How a local checkpoint asks to be sampled (its generation_config.json); null: greedy. */
  sampling?: SamplingDefaults | null;
  /** What a pack holds (absent for checkpoints and remote models). */
  details?: PackDetails;
}

export interface PackDetails {
  model_type: string;
  layers: number;
  context_length: number | null;
  total_params: number;
  active_params: number | null;
  expert_layers: number;
  experts_per_layer: number;
  experts_per_token: number | null;
  expert_dtype: string;
  expert_quantization: string | null;
  resident_quantization: string | null;
  compression: string | null;
  expert_bytes: number;
  resident_bytes: number;
  drives: { path: string; bytes: number }[];
}

export interface SamplingDefaults {
  temperature: number;
  top_p: number;
  top_k: number | null;
}

export interface DriveMetrics {
  path: string;
  bytes: number;
  reads: number;
  errors: number;
  mb_per_s: number;
  /** Share of the last interval the drive had a read in progress. */
  busy_share: number;
  latency_p50_ms: number | null;
  latency_p90_ms: number | null;
  latency_p99_ms: number | null;
}

export interface MetricsEvent {
  model: string;
  running_job: number | null;
  tokens_per_second: number | null;
  budget_bytes: number;
  engine: {
    drives: DriveMetrics[];
    cache: { hits: number; misses: number; evictions: number; held_bytes: number; pinned_bytes: number; budget_bytes: number };
    hit_rate: number;
    stall_seconds: number;
    interval_seconds: number;
    /** Next-layer predictions against what layers asked for, since the model loaded. */
    pilot: { predicted: number; demanded: number; correct: number; wasted_bytes: number; useful_bytes: number };
    prefetch_recall: number | null;
    /** The eviction policy in use (`lfu`, `slru:80/layer`, …). */
    policy: string;
    /** The latest replays of the pack's routing trace against every candidate policy. */
    policy_report: PolicyReport | null;
  } | null;
  /** The prefix cache: prompts looked up and served, tokens reused, what it holds. */
  prefix?: PrefixStats | null;
}

export interface PolicyReport {
  chosen: string;
  /** Chosen from the trace (false: set by hand, replayed for comparison). */
  automatic: boolean;
  /** Best first; regret is Belady's hit rate minus the candidate's. */
  candidates: { policy: string; hit_rate: number; regret: number }[];
  belady_hit_rate: number;
  best_fixed_hit_rate: number;
  lookups: number;
  counted_lookups: number;
  budget_bytes: number;
}

export interface PrefixStats {
  lookups: number;
  hits: number;
  reused_tokens: number;
  read_ram_bytes: number;
  read_disk_bytes: number;
  written_bytes: number;
  refused: number;
  ram_blocks: number;
  ram_bytes: number;
  disk_blocks: number;
  disk_bytes: number;
}

export interface JobProgress {
  id: number;
  state: JobState;
  tokens: number;
  max_tokens: number;
  offset: number | null;
  delta: string;
  /** Byte offset in the job's reasoning where `reasoning_delta` begins. */
  reasoning_offset?: number | null;
  /** Reasoning made final since the previous event (absent when none). */
  reasoning_delta?: string;
  tokens_per_second: number | null;
  eta_seconds: number | null;
  queue_position: number | null;
  /** While the prompt is read (before the first token), how far. */
  prompt: PromptProgress | null;
  /** The job's figures so far, while it runs. */
  stats: JobStats | null;
}

export interface PromptProgress {
  done: number;
  total: number;
  per_second: number | null;
  eta_seconds: number | null;
}

export interface Drive {
  path: string;
  /** Present, missing, or present with reads failing in the last two minutes. */
  status: "present" | "missing" | "errors";
  present: boolean;
  free_bytes: number | null;
  total_bytes: number | null;
  model_bytes: number;
  models: string[];
  mb_per_s: number | null;
  ceiling_mb_per_s: number | null;
  /** Measured over the reads of the last second; null when none finished. */
  latency_p50_ms: number | null;
  latency_p90_ms: number | null;
  latency_p99_ms: number | null;
  /** Failed reads since the service started. */
  errors: number;
  last_error_seconds_ago: number | null;
  /** Other drive folders on the same device. */
  same_device: string[];
  disk: Disk | null;
}

/** Before queueing: RAM, first token and end, and what they rest on. */
export interface Forecast {
  ram_bytes: number;
  first_token_seconds: number | null;
  total_seconds: number | null;
  tokens_per_second: number | null;
  read_bytes_per_token: number | null;
  basis: "measured" | "probed_drives" | "none";
  words: string;
}

/** The disk under a drive folder, and what it says of itself. */
export interface Disk {
  device: string | null;
  link: string | null;
  via: string[];
  checked_at: number;
  health: DiskHealth | null;
  /** Why there is no health reading. */
  unavailable: string | null;
  warnings: { kind: string; text: string }[];
  /** [seconds since the epoch, °C] over the last day. */
  temperatures: [number, number][];
}

export interface DiskHealth {
  device: string;
  model: string | null;
  serial: string | null;
  firmware: string | null;
  protocol: string | null;
  through: string | null;
  passed: boolean | null;
  critical_warning: number | null;
  temperature_c: number | null;
  percentage_used: number | null;
  available_spare: number | null;
  available_spare_threshold: number | null;
  media_errors: number | null;
  error_log_entries: number | null;
  reallocated: number | null;
  crc_errors: number | null;
  unsafe_shutdowns: number | null;
  power_on_hours: number | null;
  warning_temp_minutes: number | null;
  critical_temp_minutes: number | null;
}

/** The event stream's state: open, trying again, or refused for the token. */
export type Connection = "connected" | "reconnecting" | "rejected";

type Handlers = {
  job?: (p: JobProgress) => void;
  queue?: () => void;
  /** Events may have been missed (a new connection, or this client fell behind): refetch. */
  resync?: () => void;
  metrics?: (m: MetricsEvent) => void;
  status?: (c: Connection) => void;
};

/** How long to wait before opening the stream again after the browser gave up on it. */
const RETRY_MS = 2000;

/** Follows the service's event stream; reconnects by itself, and says when the token is refused. */
export function events(handlers: Handlers): () => void {
  let source: EventSource | null = null;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let stopped = false;
  const open = () => {
    const s = new EventSource(withToken("/api/events"));
    source = s;
    s.addEventListener("job", (e) => handlers.job?.(JSON.parse((e as MessageEvent).data)));
    s.addEventListener("queue", () => handlers.queue?.());
    s.addEventListener("resync", () => handlers.resync?.());
    s.addEventListener("metrics", (e) => handlers.metrics?.(JSON.parse((e as MessageEvent).data)));
    s.onopen = () => handlers.status?.("connected");
    s.onerror = async () => {
      if (s.readyState !== EventSource.CLOSED) {
        handlers.status?.("reconnecting");
        return;
      }
      // The browser gives up on an HTTP error (a refused token): ask why, then try again.
      s.close();
      let refused = false;
      try {
        refused = (await fetch("/api/queue", { headers: { Authorization: `Bearer ${token() ?? ""}` } })).status === 401;
      } catch {
        // Not answering at all.
      }
      handlers.status?.(refused ? "rejected" : "reconnecting");
      if (!stopped && source === s) timer = setTimeout(open, RETRY_MS);
    };
  };
  open();
  return () => {
    stopped = true;
    clearTimeout(timer);
    source?.close();
  };
}
