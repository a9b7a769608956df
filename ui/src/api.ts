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

// The API's types are generated from the service's own (api-types.ts).
export type {
  Disk,
  DiskHealth,
  Drive,
  DriveMetrics,
  Forecast,
  Job,
  JobProgress,
  JobState,
  JobStats,
  MetricsEvent,
  Model,
  PackDetails,
  PolicyReport,
  PrefixStats,
  PromptProgress,
  SamplingDefaults,
  Settings,
  Speculation,
} from "./api-types";
import type { ChatMessage, Input, JobProgress, MetricsEvent } from "./api-types";

/** A task's plain prompt; null for a conversation. */
export const promptOf = (i: Input): string | null => ("prompt" in i ? i.prompt : null);

/** A task's conversation; null for a plain prompt. */
export const conversationOf = (i: Input): ChatMessage[] | null => ("messages" in i ? i.messages : null);

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
