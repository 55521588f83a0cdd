//! The metric names `abserve serve` and `abserve worker --listen` export on `/metrics`: the server registers them from here
//! and `loadtest`, `eval` and the tests read them from here, so a rename cannot leave a reader
//! behind. Counters end in `_total` (Prometheus' rule); labels are bounded (endpoint templates,
//! status codes, reasons, components, experiment names).

/// Standard process collector: resident memory of the server.
pub const PROCESS_RESIDENT_MEMORY: &str = "process_resident_memory_bytes";

pub const MEMORY_BUDGET: &str = "abserve_memory_budget_bytes";
/// Label `component`: weights, kv, compute, prefix_store.
pub const MEMORY_PLANNED: &str = "abserve_memory_planned_bytes";
pub const MEMORY_PEAK_RESIDENT: &str = "abserve_memory_peak_resident_bytes";

/// The device's memory (GPU builds with layers offloaded), labelled `device`.
pub const DEVICE_MEMORY_TOTAL: &str = "abserve_device_memory_total_bytes";
pub const DEVICE_MEMORY_FREE: &str = "abserve_device_memory_free_bytes";
pub const DEVICE_MEMORY_USED: &str = "abserve_device_memory_used_bytes";
pub const DEVICE_MEMORY_USED_BEFORE: &str = "abserve_device_memory_used_before_start_bytes";
pub const DEVICE_MEMORY_BUDGET: &str = "abserve_device_memory_budget_bytes";
pub const DEVICE_MEMORY_PLANNED: &str = "abserve_device_memory_planned_bytes";
pub const KV_CELLS_TOTAL: &str = "abserve_kv_cells_total";
pub const KV_CELLS_USED: &str = "abserve_kv_cells_used";
pub const KV_CELLS_CACHED: &str = "abserve_kv_cells_cached";
pub const KV_SLOTS: &str = "abserve_kv_slots";
pub const KV_CELLS_PER_SLOT: &str = "abserve_kv_cells_per_slot";
pub const KV_UNIFIED: &str = "abserve_kv_unified";
pub const FULL_CONTEXT_SEQUENCES: &str = "abserve_full_context_sequences";

/// Labels `endpoint`, `status`.
pub const REQUESTS: &str = "abserve_requests_total";
/// Label `reason`.
pub const REJECTIONS: &str = "abserve_rejections_total";
/// Generations that ended in an error after admission, by kind (out_of_memory, no_slot, decode, ...).
pub const GENERATION_ERRORS: &str = "abserve_generation_errors_total";
/// p-value of the sample-ratio-mismatch test of each experiment (refreshed every 30 s).
pub const EXPERIMENT_SRM_P_VALUE: &str = "abserve_experiment_srm_p_value";
/// Store writes that failed (disk full, unwritable, busy), by operation: exposure, events, experiment.
pub const STORE_ERRORS: &str = "abserve_store_errors_total";
/// Sampled conversations by outcome: written, queue_full, daily_cap, store_error.
pub const SAMPLES: &str = "abserve_samples_total";
pub const REQUESTS_RUNNING: &str = "abserve_requests_running";
pub const REQUESTS_WAITING: &str = "abserve_requests_waiting";
pub const REQUESTS_HELD_FOR_LATENCY: &str = "abserve_requests_held_for_latency";

pub const PROMPT_TOKENS: &str = "abserve_prompt_tokens_total";
pub const PROMPT_TOKENS_COMPUTED: &str = "abserve_prompt_tokens_computed_total";
pub const PROMPT_TOKENS_REUSED: &str = "abserve_prompt_tokens_reused_total";
pub const GENERATED_TOKENS: &str = "abserve_generated_tokens_total";
pub const PREEMPTIONS: &str = "abserve_preemptions_total";
pub const CANCELLATIONS: &str = "abserve_cancellations_total";

pub const PREFIX_COPIES: &str = "abserve_prefix_copies_total";
pub const PREFIX_RESTORES: &str = "abserve_prefix_restores_total";
pub const DRAFT_TOKENS: &str = "abserve_draft_tokens_total";
pub const DRAFT_ACCEPTED: &str = "abserve_draft_accepted_tokens_total";
pub const DRAFT_MODEL_TOKENS: &str = "abserve_draft_model_tokens_total";
pub const DRAFT_MODEL_ACCEPTED: &str = "abserve_draft_model_accepted_tokens_total";
/// Impossible states the engine met (each failed one request) and panics it caught.
pub const ENGINE_FAULTS: &str = "abserve_engine_faults_total";
/// Structured outputs: grammars compiled (and the seconds it took, summed), refused (at compile
/// time or by a per-step limit), token masks computed (and their seconds), tokens generated
/// under a grammar and the ones it forced (fast-forward), constrained sequences running.
pub const GRAMMAR_COMPILES: &str = "abserve_grammar_compiles_total";
pub const GRAMMAR_COMPILE_SECONDS: &str = "abserve_grammar_compile_seconds_total";
pub const GRAMMAR_REJECTIONS: &str = "abserve_grammar_rejections_total";
pub const GRAMMAR_MASKS: &str = "abserve_grammar_masks_total";
pub const GRAMMAR_MASK_SECONDS: &str = "abserve_grammar_mask_seconds_total";
pub const CONSTRAINED_TOKENS: &str = "abserve_constrained_tokens_total";
pub const FORCED_TOKENS: &str = "abserve_forced_tokens_total";
pub const CONSTRAINED_SEQUENCES: &str = "abserve_constrained_sequences_running";
pub const MATCHER_BYTES: &str = "abserve_grammar_matcher_bytes";
pub const PREFIX_STORE_BYTES: &str = "abserve_prefix_store_bytes";
pub const PREFIX_STORE_ENTRIES: &str = "abserve_prefix_store_entries";

/// Label `experiment`.
pub const EXPERIMENT_KV_CELLS_USED: &str = "abserve_experiment_kv_cells_used";
/// Label `experiment`.
pub const EXPERIMENT_KV_CELLS_PEAK: &str = "abserve_experiment_kv_cells_peak";

// histograms (the text format adds _bucket, _sum and _count)
pub const TIME_TO_FIRST_TOKEN: &str = "abserve_time_to_first_token_seconds";
pub const REQUEST_DURATION: &str = "abserve_request_duration_seconds";
pub const TIME_PER_OUTPUT_TOKEN: &str = "abserve_time_per_output_token_seconds";
pub const ENGINE_STEP: &str = "abserve_engine_step_seconds";

// `abserve worker --listen`: the engine's series above, and its jobs
/// Label `outcome`: answered, retried (republished after a failed try), dead_lettered (after
/// `--max-failures`), returned (requeued after an error of the worker itself, e.g. a lost
/// broker confirm).
pub const WORKER_JOBS: &str = "abserve_worker_jobs_total";
/// Jobs delivered to the worker and not yet acknowledged (at most the plan's sequence slots).
pub const WORKER_JOBS_IN_HAND: &str = "abserve_worker_jobs_in_hand";
/// Seconds from delivery to acknowledgement, summed over finished jobs.
pub const WORKER_JOB_SECONDS: &str = "abserve_worker_job_seconds_total";

/// Every series of an abserve server starts with this.
/// Treatments stopped by a guardrail (`periodic.rs`), in all; and per experiment the
/// variants stopped now (label `experiment`).
pub const GUARDRAIL_STOPS: &str = "abserve_guardrail_stops_total";
pub const EXPERIMENT_VARIANTS_STOPPED: &str = "abserve_experiment_variants_stopped";
/// LoRA adapters of the default model (`adapters/budget.rs` in the engine): the plan's
/// reservation, the bytes admitted into it, the adapters llama.cpp holds, and how many were
/// unloaded because nothing referenced them and their room was needed.
pub const ADAPTER_BYTES_RESERVED: &str = "abserve_adapter_bytes_reserved";
pub const ADAPTER_BYTES_ADMITTED: &str = "abserve_adapter_bytes_admitted";
pub const ADAPTERS_LOADED: &str = "abserve_adapters_loaded";
pub const ADAPTER_UNLOADS: &str = "abserve_adapter_unloads_total";
/// Per adapter set of the default model (label `adapters`: `base`, or `file.gguf×scale` joined
/// by `+`; at most 64 sets, the rest as `other`): finished requests, their prompt tokens and
/// their generated tokens.
pub const ADAPTER_REQUESTS: &str = "abserve_adapter_requests_total";
pub const ADAPTER_PROMPT_TOKENS: &str = "abserve_adapter_prompt_tokens_total";
pub const ADAPTER_GENERATED_TOKENS: &str = "abserve_adapter_generated_tokens_total";
/// Per model (`model` label; every model of a server, the default too): its plan and its
/// engine's KV, queue and tokens.
pub const MODEL_BUDGET: &str = "abserve_model_budget_bytes";
pub const MODEL_PLANNED: &str = "abserve_model_planned_bytes";
pub const MODEL_KV_CELLS: &str = "abserve_model_kv_cells";
pub const MODEL_KV_CELLS_USED: &str = "abserve_model_kv_cells_used";
pub const MODEL_RUNNING: &str = "abserve_model_requests_running";
pub const MODEL_WAITING: &str = "abserve_model_requests_waiting";
pub const MODEL_PROMPT_TOKENS: &str = "abserve_model_prompt_tokens_total";
pub const MODEL_GENERATED_TOKENS: &str = "abserve_model_generated_tokens_total";
/// Per model: times one of its contexts (an adapter lane) was given another adapter set (each
/// makes llama.cpp reserve that context's compute graphs again; with lanes, rare).
pub const MODEL_ADAPTER_SET_CHANGES: &str = "abserve_model_adapter_set_changes_total";
/// Per model and priority class (labels `model`, `class`: interactive, fanout, batch): requests
/// waiting and running, and sequences preempted (for a more urgent class, or for memory).
pub const CLASS_WAITING: &str = "abserve_class_requests_waiting";
pub const CLASS_RUNNING: &str = "abserve_class_requests_running";
pub const CLASS_PREEMPTIONS: &str = "abserve_class_preemptions_total";
/// Time to first token per priority class (label `class`).
pub const CLASS_TIME_TO_FIRST_TOKEN: &str = "abserve_class_time_to_first_token_seconds";
pub const PREFIX: &str = "abserve_";

/// Models served elsewhere (`--upstream`): label `model` (the upstream's id), and `url` (one of
/// its replicas, as the operator configured it) where it says so.
/// Requests abserve has running at a replica (label `url`).
pub const UPSTREAM_REQUESTS_IN_FLIGHT: &str = "abserve_upstream_requests_in_flight";
/// Tokens (prompt + `max_tokens`) reserved at a replica (label `url`).
pub const UPSTREAM_TOKENS_RESERVED: &str = "abserve_upstream_tokens_reserved";
/// A replica's KV capacity in tokens and its sequence slots, as it said or as configured.
pub const UPSTREAM_TOKEN_CAPACITY: &str = "abserve_upstream_token_capacity";
pub const UPSTREAM_SEQ_SLOTS: &str = "abserve_upstream_seq_slots";
/// A replica's own saturation as scraped from its `/metrics` (0 to 1).
pub const UPSTREAM_SATURATION: &str = "abserve_upstream_saturation";
/// A replica is held back for saturation (1) or not (0).
pub const UPSTREAM_SATURATED: &str = "abserve_upstream_saturated";
/// A replica's circuit breaker: 0 closed, 1 open, 2 half-open.
pub const UPSTREAM_BREAKER_STATE: &str = "abserve_upstream_breaker_state";
pub const UPSTREAM_RETRIES: &str = "abserve_upstream_retries_total";
/// Label `class`: refused, bad_answer, unavailable, timeout.
pub const UPSTREAM_ERRORS: &str = "abserve_upstream_errors_total";
/// Spend at the configured prices (currency units).
pub const UPSTREAM_SPEND: &str = "abserve_upstream_spend_total";
pub const UPSTREAM_REQUEST_SECONDS: &str = "abserve_upstream_request_seconds";
pub const UPSTREAM_TTFT_SECONDS: &str = "abserve_upstream_time_to_first_token_seconds";
