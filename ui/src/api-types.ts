// Generated from the service's Rust types (service/src/http/api_types.rs);
// do not edit. After changing one of them: LONGHAUL_WRITE_API_TYPES=1 cargo test -p longhaul-service api_types

export type Basis = "measured" | "probed_drives" | "none";

/**
 * Hit, miss and eviction counts.
 */
export type CacheCounters = { hits: number, misses: number, evictions: number, held_bytes: number, pinned_bytes: number, budget_bytes: number, };

export type ChatMessage = { role: string, 
/**
 * Absent or null (an assistant turn that only called tools) reads as
 * empty.
 */
content: string, } & ({ [key in string]: number | string | boolean | Array<JsonValue> | { [key in string]: JsonValue } | null });

export type Disk = { device: string | null, link: string | null, via: Array<string>, checked_at: number, health: DiskHealth | null, unavailable: string | null, warnings: Array<Warning>, 
/**
 * (seconds since the epoch, °C), the last day of readings.
 */
temperatures: Array<[number, number]>, };

/**
 * One reading of a drive's health.
 */
export type DiskHealth = { 
/**
 * The device smartctl read, `/dev/nvme0`.
 */
device: string, model: string | null, serial: string | null, firmware: string | null, 
/**
 * "NVMe", "ATA" or "SCSI".
 */
protocol: string | null, 
/**
 * How smartctl reached it when not directly: "USB NVMe JMicron", "SAT".
 */
through: string | null, 
/**
 * The drive's own verdict (SMART overall health, or no NVMe critical warning).
 */
passed: boolean | null, 
/**
 * NVMe critical warning bits (0 when none).
 */
critical_warning: number | null, temperature_c: number | null, 
/**
 * Share of the drive's rated endurance used, in percent (may pass 100).
 */
percentage_used: number | null, 
/**
 * NVMe spare capacity left and the threshold under which it warns, in percent.
 */
available_spare: number | null, available_spare_threshold: number | null, 
/**
 * Media and data integrity errors (NVMe), or uncorrectable errors reported (ATA 187).
 */
media_errors: number | null, 
/**
 * NVMe error information log entries.
 */
error_log_entries: number | null, 
/**
 * Reallocated sectors or NAND blocks (ATA 5).
 */
reallocated: number | null, 
/**
 * Link CRC errors between drive and host (ATA 199): a cable or bridge fault.
 */
crc_errors: number | null, 
/**
 * Power lost without a clean shutdown (NVMe, or ATA 174).
 */
unsafe_shutdowns: number | null, power_on_hours: number | null, 
/**
 * Minutes the drive ran above its warning / critical temperature, where
 * it throttles (NVMe).
 */
warning_temp_minutes: number | null, critical_temp_minutes: number | null, };

export type Drive = { path: string, status: DriveStatus, 
/**
 * Whether the folder is there now.
 */
present: boolean, free_bytes: number | null, total_bytes: number | null, 
/**
 * Bytes of registered models' packs stored in this folder.
 */
model_bytes: number, 
/**
 * Which models have data here.
 */
models: Array<string>, mb_per_s: number | null, 
/**
 * The drive's read rate at the last `longhaul drives probe` (or bench).
 */
ceiling_mb_per_s: number | null, 
/**
 * Measured over the reads of the last second; none when none finished.
 */
latency_p50_ms: number | null, latency_p90_ms: number | null, latency_p99_ms: number | null, 
/**
 * Failed reads since the service started, over every model load.
 */
errors: number, last_error_seconds_ago: number | null, 
/**
 * Other folders on the same device: striping over them buys nothing.
 */
same_device: Array<string>, 
/**
 * The disk under the folder and what it says of itself.
 */
disk: Disk | null, };

/**
 * Bytes a job read from one drive folder.
 */
export type DriveBytes = { path: string, bytes: number, };

export type DriveMetrics = { path: string, bytes: number, reads: number, errors: number, 
/**
 * Read rate since the previous sample.
 */
mb_per_s: number, 
/**
 * Share of the time since the previous sample the drive was reading.
 */
busy_share: number, 
/**
 * Measured over the reads that finished since the previous sample;
 * `None` when none did.
 */
latency_p50_ms: number | null, latency_p90_ms: number | null, latency_p99_ms: number | null, };

/**
 * What one drive holds of a pack.
 */
export type DriveShare = { path: string, bytes: number, };

export type DriveStatus = "present" | "missing" | "errors";

/**
 * Which call a request forces.
 */
export type ForcedCall = { "type": "any" } | { "type": "function", name: string, };

export type Forecast = { ram_bytes: number, first_token_seconds: number | null, total_seconds: number | null, tokens_per_second: number | null, 
/**
 * Expert bytes read per answer token, cold (no cache).
 */
read_bytes_per_token: number | null, basis: Basis, 
/**
 * What the forecast rests on, in words.
 */
words: string, };

/**
 * What the model is asked: plain text, or a conversation for the chat template.
 */
export type Input = { "prompt": string } | { "messages": Array<ChatMessage> };

/**
 * A job as the API shows it: as saved, and while it runs with its live
 * figures (its statistics so far, and in `live` the tokens not yet
 * committed, speed and prompt reading), so every view of a running job
 * says the same.
 */
export type Job = { 
/**
 * The running job's latest progress; absent for the others.
 */
live: JobProgress | null, 
/**
 * Why the running job is held: the data dir cannot be written, so its
 * saved state cannot say so yet.
 */
storage_fault?: string, id: number, title: string, model: string, state: JobState, priority: number, 
/**
 * Place among the jobs waiting to run (1 is next), when waiting.
 */
queue_position: number | null, origin: string, request: Request, 
/**
 * Output so far (omitted from lists).
 */
output?: string, 
/**
 * The model's reasoning so far, apart from the answer (omitted from
 * lists and where the model did not think aloud).
 */
reasoning?: string, tokens: number, stats: JobStats | null, error: string | null, pause_reason: string | null, 
/**
 * What holds a paused job (see [`PauseCause`]).
 */
pause_cause: PauseCause | null, finish_reason: string | null, log: string, created_ms: number, started_ms: number | null, finished_ms: number | null, updated_ms: number, };

export type JobProgress = { id: number, state: JobState, 
/**
 * Tokens of the answer so far.
 */
tokens: number, max_tokens: number, 
/**
 * Byte offset in the job's output where `delta` begins. A watcher whose
 * copy of the output is not `offset` bytes long missed or holds text
 * that was not committed, and should re-read the job. Absent from
 * events that only report a waiting job's place.
 */
offset: number | null, 
/**
 * Text made final since the previous event of this job.
 */
delta: string, 
/**
 * Byte offset in the job's reasoning where `reasoning_delta` begins
 * (absent where `offset` is).
 */
reasoning_offset?: number, 
/**
 * Reasoning made final since the previous event (the model's thinking
 * before its answer), kept apart from `delta`.
 */
reasoning_delta?: string, 
/**
 * Over the last few seconds of decoding.
 */
tokens_per_second: number | null, 
/**
 * To reach `max_tokens` at the current rate (an upper bound: the model may stop sooner).
 */
eta_seconds: number | null, queue_position: number | null, 
/**
 * While the prompt is read (before the first token), how far.
 */
prompt: PromptProgress | null, 
/**
 * The job's figures so far, while it runs.
 */
stats: JobStats | null, };

export type JobState = "queued" | "running" | "paused" | "interrupted" | "done" | "failed" | "cancelled";

/**
 * Per-job figures, recorded when the job stops.
 */
export type JobStats = { prompt_tokens: number, generated_tokens: number, time_to_first_token_s: number | null, tokens_per_second: number, wall_seconds: number, expert_bytes_read: number, 
/**
 * The expert bytes read from each drive folder, in the pack's drive order.
 */
drive_bytes_read: Array<DriveBytes>, cache_hit_rate: number | null, 
/**
 * Times the job was resumed after an interruption or a pause.
 */
resumes: number, 
/**
 * What guessing ahead did over the job's runs.
 */
speculation: Speculation, 
/**
 * Prompt tokens the latest run took from the prefix cache rather than
 * computing them, and the bytes of saved state they came from.
 */
prefix_tokens: number, prefix_bytes: number, };

export type JsonValue = number | string | boolean | Array<JsonValue> | { [key in string]: JsonValue } | null;

export type MetricsEvent = { model: string, running_job: number | null, tokens_per_second: number | null, 
/**
 * Drive and cache counters; absent for models held in RAM.
 */
engine: MetricsSnapshot | null, budget_bytes: number, 
/**
 * The prefix cache's counters, when the service keeps one.
 */
prefix: PrefixStats | null, };

export type MetricsSnapshot = { 
/**
 * Seconds covered by the rates (since the previous sample, or since the sampler began).
 */
interval_seconds: number, drives: Array<DriveMetrics>, cache: CacheCounters, 
/**
 * Hits over lookups, since the model was opened.
 */
hit_rate: number, 
/**
 * Time the model spent waiting for expert reads, since it was opened.
 */
stall_seconds: number, 
/**
 * How well next-layer predictions matched, since the model was opened.
 */
pilot: PilotCounters, 
/**
 * Share of asked-for experts that had been predicted.
 */
prefetch_recall: number | null, 
/**
 * The eviction policy in use, and the latest replays of the pack's
 * routing trace that it was chosen from.
 */
policy: string, policy_report: PolicyReport | null, };

/**
 * A model as `GET /api/models` lists it: as registered, with what a
 * local model's files say.
 */
export type Model = { 
/**
 * How a local checkpoint asks to be sampled (its
 * `generation_config.json`); null: greedy, or a remote model.
 */
sampling: SamplingDefaults | null, 
/**
 * What a pack holds (absent for checkpoints and remote models).
 */
details?: PackDetails, 
/**
 * How a pack stores its weights (absent where `details` is).
 */
weights?: PackWeights, name: string, created_ms: number, } & ({ "kind": "local", path: string, } | { "kind": "remote", url: string, 
/**
 * The model name the server knows it by.
 */
remote_model: string, });

export type PackDetails = { model_type: string, layers: number, context_length: number | null, 
/**
 * Every parameter: the resident weights and every expert.
 */
total_params: number, 
/**
 * What one token uses: the resident weights and its experts in each
 * expert layer (absent when config.json does not say how many).
 */
active_params: number | null, expert_layers: number, experts_per_layer: number, experts_per_token: number | null, 
/**
 * How experts are stored (a safetensors dtype or a quantisation).
 */
expert_dtype: string, 
/**
 * Quantisation asked for when packing (lossy), if any.
 */
expert_quantization: string | null, resident_quantization: string | null, 
/**
 * Lossless compression of expert records, if any.
 */
compression: string | null, 
/**
 * Bytes of expert records on the drives.
 */
expert_bytes: number, 
/**
 * Bytes of the resident weights: the RAM they need, as stored.
 */
resident_bytes: number, drives: Array<DriveShare>, };

/**
 * How a pack stores its weights: the experts' dtype, the resident
 * quantization asked for, and whether anything was quantised on request
 * (so a lossy pack is never mistaken for the published weights).
 */
export type PackWeights = { experts: string, resident: string, lossy: boolean, };

/**
 * The choice between keeping records packed and keeping weights, and what
 * it rests on: hit rates replayed at both capacities, and a decode step's
 * predicted time either way from the costs measured.
 */
export type PackingChoice = { packed: boolean, hit_rate_packed: number, hit_rate_weights: number, seconds_per_pass_packed: number, seconds_per_pass_weights: number, 
/**
 * What the prediction used: compute per pass, restore and drive time per byte.
 */
compute_seconds_per_pass: number, restore_seconds_per_gb: number, drive_seconds_per_gb: number, passes_measured: number, };

/**
 * Why a job is paused: who or what holds it. The reason beside it says
 * the same to people; code decides on the cause.
 */
export type PauseCause = "user" | "queue" | "drive_missing" | "read_fault" | "storage";

/**
 * Counts since the model was opened.
 */
export type PilotCounters = { 
/**
 * Layers for which a prediction was made before they asked for experts.
 */
predicted_layers: number, 
/**
 * Experts predicted, over those layers.
 */
predicted: number, 
/**
 * Experts those layers asked for.
 */
demanded: number, 
/**
 * Experts asked for that had been predicted.
 */
correct: number, 
/**
 * Reads started on a prediction and their bytes.
 */
prefetch_reads: number, prefetch_bytes: number, 
/**
 * Prefetched bytes the predicted layer then asked for, and those it did not.
 */
useful_bytes: number, wasted_bytes: number, };

/**
 * What the replays found, and the policy chosen from them.
 */
export type PolicyReport = { chosen: string, 
/**
 * Chosen from the trace (`false`: set by hand; the replays are for comparison).
 */
automatic: boolean, 
/**
 * Every candidate, best first.
 */
candidates: Array<Replayed>, belady_hit_rate: number, best_fixed_hit_rate: number, 
/**
 * Expert lookups replayed, and those counted.
 */
lookups: number, counted_lookups: number, budget_bytes: number, 
/**
 * Whether the cache keeps compressed records packed, and why (for packs
 * whose records are compressed and do not all fit as weights).
 */
packing: PackingChoice | null, };

/**
 * The cache's counters and contents, read now.
 */
export type PrefixStats = { 
/**
 * Prompts looked up.
 */
lookups: number, 
/**
 * Prompts that reused at least one block.
 */
hits: number, 
/**
 * Prompt positions taken from the cache rather than computed.
 */
reused_tokens: number, read_ram_bytes: number, read_disk_bytes: number, written_bytes: number, 
/**
 * Blocks refused on read (damaged, or not fitting the model).
 */
refused: number, 
/**
 * Blocks and tails held in RAM, and their bytes.
 */
ram_blocks: number, ram_bytes: number, 
/**
 * Blocks and tails held in the folder, and their bytes.
 */
disk_blocks: number, disk_bytes: number, };

/**
 * How far a running job has read its prompt (and, resuming, the answer it
 * had: the model reads it again unless its state was saved).
 */
export type PromptProgress = { done: number, total: number, 
/**
 * Positions per second since reading began.
 */
per_second: number | null, eta_seconds: number | null, };

/**
 * One policy's replayed hit rate.
 */
export type Replayed = { 
/**
 * As written in settings: `lfu`, `slru:80/layer`, …
 */
policy: string, hit_rate: number, 
/**
 * Belady's hit rate minus this one.
 */
regret: number, };

/**
 * A job as stored: fixed at submission, so a resumed job sees exactly what
 * it started with even if attached files have changed since.
 */
export type Request = { input: Input, 
/**
 * Attached files rendered as text, placed before the prompt.
 */
attachments?: string, settings: Settings, 
/**
 * Switches for the chat template or prompt encoder
 * (`chat_template_kwargs`: `enable_thinking`, `thinking`, …).
 */
chat_args?: { [key in string]: JsonValue }, 
/**
 * When the job was submitted (seconds since the epoch): the instant a
 * template's `strftime_now` formats, so a resumed job reads the prompt
 * it started with.
 */
rendered_at?: number | null, 
/**
 * Tools offered to the model (OpenAI's function tools), rendered by
 * its template as `tools`; its answer is read for calls to them.
 */
tools?: Array<JsonValue>, 
/**
 * A call the answer must make (`tool_choice` forcing one): decoding
 * is held to the family's opening of a call to one of the tools.
 */
forced_call?: ForcedCall | null, 
/**
 * The format the model wrote tool calls in when the job was admitted
 * (with tools offered): its answer is read in it, whatever the
 * model's files say later.
 */
tool_format?: ToolFormat | null, };

/**
 * How a checkpoint asks to be sampled (its `generation_config.json`).
 */
export type SamplingDefaults = { temperature: number, top_p: number, top_k: number | null, };

/**
 * How to generate.
 */
export type Settings = { max_tokens: number, 
/**
 * 0 is greedy.
 */
temperature: number, top_p: number, top_k: number | null, seed: number, stop: Array<string>, 
/**
 * Where the sampling settings the request left out came from, when
 * the model's `generation_config.json` gave them.
 */
sampling_from?: string | null, 
/**
 * Guessing ahead: `auto` (prompt lookup, while it pays), `lookup` or
 * `off`. The answer is the same either way.
 */
speculate: Speculate, 
/**
 * A registered local model that guesses ahead for this one (a small
 * model of the same family); prompt lookup when absent. The answer is
 * the same either way: every guess is verified.
 */
draft_model?: string | null, 
/**
 * transformers' `repetition_penalty`: 1 is off.
 */
repetition_penalty: number, 
/**
 * OpenAI's `frequency_penalty`: 0 is off.
 */
frequency_penalty: number, 
/**
 * OpenAI's `presence_penalty`: 0 is off.
 */
presence_penalty: number, };

/**
 * How a job guesses ahead (see the engine's speculative decoding).
 */
export type Speculate = "auto" | "lookup" | "off";

/**
 * Guesses verified and kept over a job's runs.
 */
export type Speculation = { verify_passes: number, drafted: number, accepted: number, 
/**
 * Forward passes of one token (nothing guessed, or guessing paused).
 */
plain_steps: number, };

/**
 * A family's tool-call format.
 */
export type ToolFormat = "kimi" | "deepseek_tokens" | "dsml" | "hermes" | "qwen_xml" | "glm" | "minimax" | "harmony";

export type Warning = { kind: WarningKind, text: string, };

export type WarningKind = "failing" | "new_errors" | "hot" | "throttled" | "worn";
