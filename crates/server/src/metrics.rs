//! Prometheus metrics, all prefixed `abserve_`, plus the standard process collector
//! (`process_resident_memory_bytes`). Label values are bounded: endpoints and status codes,
//! rejection reasons and memory components; never prompts or user ids.

use std::sync::Arc;

use abserve_engine::plan::MemoryPlan;
use abserve_engine::EngineStats;
use abserve_protocol::names;
use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::model_metrics::bump;

pub struct Metrics {
    registry: Registry,
    stats: Arc<EngineStats>,
    /// The device and its gauges (total, free, used), read at every scrape.
    device: Option<(Arc<dyn abserve_engine::device::Device>, [IntGauge; 3])>,
    pub requests_total: IntCounterVec,
    pub store_errors: IntCounterVec,
    /// Sampled conversations by outcome (`experiments::samples`).
    pub samples: IntCounterVec,
    pub generation_errors: IntCounterVec,
    pub experiment_srm: GaugeVec,
    /// Treatments stopped by guardrails, and per experiment the variants stopped now.
    pub guardrail_stops: IntCounter,
    pub experiment_stopped: IntGaugeVec,
    pub rejections_total: IntCounterVec,
    pub ttft: Histogram,
    /// Time to first token per priority class (label `class`).
    pub class_ttft: HistogramVec,
    pub request_duration: Histogram,
    pub time_per_output_token: Histogram,
    pub engine_step: Histogram,
    kv_cells_used: IntGauge,
    running: IntGauge,
    waiting: IntGauge,
    preemptions: IntCounter,
    cancellations: IntCounter,
    prompt_tokens: IntCounter,
    generated_tokens: IntCounter,
    experiment_kv: IntGaugeVec,
    experiment_kv_peak: IntGaugeVec,
    peak_resident: IntGauge,
    kv_cells_cached: IntGauge,
    prompt_tokens_computed: IntCounter,
    prompt_tokens_reused: IntCounter,
    prefix_copies: IntCounter,
    itl_held: IntGauge,
    prefix_store_bytes: IntGauge,
    prefix_store_entries: IntGauge,
    prefix_restores: IntCounter,
    drafts: DraftMetrics,
    engine_faults: IntCounter,
    grammar: GrammarMetrics,
    /// Per-model series (`model` label).
    models: crate::model_metrics::ModelSeries,
    /// Run at every scrape before rendering: copy figures kept elsewhere (the worker's job
    /// counts) into collectors registered with [`Metrics::register`].
    hooks: std::sync::Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
}

fn latency_buckets() -> Vec<f64> {
    vec![
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    ]
}

/// Registers metrics on one registry; every registration error (a duplicate name, a bad name
/// or label) is returned, never a panic.
struct Reg<'a>(&'a Registry);

impl Reg<'_> {
    fn add<C: prometheus::core::Collector + Clone + 'static>(&self, c: C) -> prometheus::Result<C> {
        self.0.register(Box::new(c.clone()))?;
        Ok(c)
    }
    fn gauge(&self, name: &str, help: &str) -> prometheus::Result<IntGauge> {
        self.add(IntGauge::new(name, help)?)
    }
    /// A gauge holding a constant of the plan.
    fn constant(&self, name: &str, help: &str, v: u64) -> prometheus::Result<IntGauge> {
        let g = self.gauge(name, help)?;
        g.set(v as i64);
        Ok(g)
    }
    fn counter(&self, name: &str, help: &str) -> prometheus::Result<IntCounter> {
        self.add(IntCounter::new(name, help)?)
    }
    fn hist(&self, name: &str, help: &str, buckets: Vec<f64>) -> prometheus::Result<Histogram> {
        self.add(Histogram::with_opts(
            HistogramOpts::new(name, help).buckets(buckets),
        )?)
    }
    /// Latency histograms by `label`.
    fn hists(&self, name: &str, help: &str, label: &str) -> prometheus::Result<HistogramVec> {
        let opts = HistogramOpts::new(name, help).buckets(latency_buckets());
        self.add(HistogramVec::new(opts, &[label])?)
    }
    fn gauges(&self, name: &str, help: &str, label: &str) -> prometheus::Result<IntGaugeVec> {
        self.add(IntGaugeVec::new(Opts::new(name, help), &[label])?)
    }
    fn counters(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::Result<IntCounterVec> {
        self.add(IntCounterVec::new(Opts::new(name, help), labels)?)
    }
    /// A counter by one label that starts at 0 for every known value (so rates exist at once).
    fn known(
        &self,
        name: &str,
        help: &str,
        label: &str,
        values: &[&str],
    ) -> prometheus::Result<IntCounterVec> {
        let c = self.counters(name, help, &[label])?;
        for v in values {
            c.with_label_values(&[*v]);
        }
        Ok(c)
    }
}

/// The plan's figures, constant for the life of the process.
fn register_plan(reg: &Reg, plan: &MemoryPlan) -> prometheus::Result<()> {
    reg.constant(
        names::MEMORY_BUDGET,
        "Memory budget the plan was made for",
        plan.budget_bytes,
    )?;
    let planned = reg.gauges(
        names::MEMORY_PLANNED,
        "Planned host memory per component (they sum to the host plan)",
        "component",
    )?;
    // with layers offloaded, the device's part is exported apart (abserve_device_memory_*)
    let (dw, dk) = plan
        .device
        .as_ref()
        .map_or((0, 0), |d| (d.weights_bytes, d.kv_bytes));
    let (weights, kv) = (plan.weights_bytes - dw, plan.kv_bytes - dk);
    for (c, v) in [
        ("weights", weights),
        ("kv", kv),
        (
            "compute",
            plan.host_planned_bytes - weights - kv - plan.prefix_store_bytes,
        ),
        ("prefix_store", plan.prefix_store_bytes),
    ] {
        planned.with_label_values(&[c]).set(v as i64);
    }
    // a constant, typed as a counter because Prometheus reserves the _total suffix for them
    reg.counter(
        names::KV_CELLS_TOTAL,
        "KV cache cells (tokens) the plan allocated; constant",
    )?
    .inc_by(plan.kv_cells);
    reg.constant(
        names::FULL_CONTEXT_SEQUENCES,
        "Concurrent sequences of the full context that fit",
        plan.full_context_sequences,
    )?;
    reg.constant(
        names::KV_SLOTS,
        "Sequence slots (llama.cpp n_seq_max); with split KV streams, one stream each",
        plan.seq_slots,
    )?;
    reg.constant(
        names::KV_CELLS_PER_SLOT,
        "KV cells of one slot's stream (split streams: fixed, no borrowing; unified: the whole pool)",
        plan.kv_cells_per_slot,
    )?;
    reg.constant(
        names::KV_UNIFIED,
        "1 when all sequences share one KV pool, 0 with one stream per slot",
        plan.kv_unified as u64,
    )?;
    Ok(())
}

/// The device's gauges: the plan's device budget and planned bytes (constants) and the
/// device's total, free and used memory (read at every scrape), labelled with its name.
fn register_device(
    reg: &Reg,
    p: &abserve_engine::plan::DevicePlan,
) -> prometheus::Result<[IntGauge; 3]> {
    let label = |name: &str, help: &str| {
        IntGauge::with_opts(Opts::new(name, help).const_label("device", p.name.as_str()))
    };
    let constant = |name: &str, help: &str, v: u64| -> prometheus::Result<()> {
        let g = reg.add(label(name, help)?)?;
        g.set(v as i64);
        Ok(())
    };
    constant(
        names::DEVICE_MEMORY_BUDGET,
        "Device memory budget the plan was made for",
        p.budget_bytes,
    )?;
    constant(
        names::DEVICE_MEMORY_PLANNED,
        "Device memory the plan places there (weights + KV + compute)",
        p.planned_bytes,
    )?;
    constant(
        names::DEVICE_MEMORY_USED_BEFORE,
        "Device memory in use before abserve loaded (other processes)",
        p.used_before_bytes,
    )?;
    Ok([
        reg.add(label(names::DEVICE_MEMORY_TOTAL, "Device memory in all")?)?,
        reg.add(label(names::DEVICE_MEMORY_FREE, "Device memory free now")?)?,
        reg.add(label(
            names::DEVICE_MEMORY_USED,
            "Device memory in use now, by every process",
        )?)?,
    ])
}

/// The series with labels, every known label present from the start (so that rates exist at
/// once): rejections by reason, store errors by operation, generation errors by kind, and the
/// SRM p-value of each experiment.
struct Labelled {
    rejections_total: IntCounterVec,
    store_errors: IntCounterVec,
    samples: IntCounterVec,
    generation_errors: IntCounterVec,
    experiment_srm: GaugeVec,
}

impl Labelled {
    fn register(reg: &Reg, registry: &Registry) -> prometheus::Result<Labelled> {
        let rejections_total = reg.known(
            names::REJECTIONS,
            "Requests turned away, by reason",
            "reason",
            &[
                "queue_full",
                "queue_timeout",
                "too_long",
                "shutting_down",
                "not_ready",
            ],
        )?;
        let store_errors = reg.known(
            names::STORE_ERRORS,
            "Experiment-store writes that failed (disk full, unwritable, busy), by operation",
            "operation",
            &["exposure", "events", "experiment", "audit", "samples"],
        )?;
        let samples = reg.known(
            names::SAMPLES,
            "Sampled conversations, by outcome: written, or dropped (queue_full, daily_cap, store_error)",
            "outcome",
            &["written", "queue_full", "daily_cap", "store_error"],
        )?;
        let generation_errors = reg.known(
            names::GENERATION_ERRORS,
            "Generations that ended in an error after admission, by kind",
            "kind",
            &[
                "out_of_memory",
                "no_slot",
                "decode",
                "shutting_down",
                "engine_stopped",
                "internal",
            ],
        )?;
        let experiment_srm = GaugeVec::new(
            prometheus::Opts::new(names::EXPERIMENT_SRM_P_VALUE, "p-value of each experiment's sample-ratio-mismatch test (chi-squared; below 0.001 is a mismatch)"),
            &["experiment"],
        )?;
        registry.register(Box::new(experiment_srm.clone()))?;
        Ok(Labelled {
            rejections_total,
            store_errors,
            samples,
            generation_errors,
            experiment_srm,
        })
    }
}

impl Metrics {
    pub fn new(
        plan: &MemoryPlan,
        stats: Arc<EngineStats>,
        engine_step: Histogram,
        device: Option<Arc<dyn abserve_engine::device::Device>>,
    ) -> prometheus::Result<Arc<Metrics>> {
        let registry = Registry::new();
        let reg = Reg(&registry);
        register_plan(&reg, plan)?;
        let device = match (device, &plan.device) {
            (Some(d), Some(p)) => Some((d, register_device(&reg, p)?)),
            _ => None,
        };
        let Labelled {
            rejections_total,
            store_errors,
            samples,
            generation_errors,
            experiment_srm,
        } = Labelled::register(&reg, &registry)?;
        let m = Metrics {
            device,
            generation_errors,
            experiment_srm,
            store_errors,
            samples,
            requests_total: reg.counters(names::REQUESTS, "HTTP requests by endpoint and status code", &["endpoint", "status"])?,
            rejections_total,
            guardrail_stops: reg.counter(names::GUARDRAIL_STOPS, "Treatments stopped by a guardrail (significantly worse than control on a guardrail metric)")?,
            experiment_stopped: reg.gauges(names::EXPERIMENT_VARIANTS_STOPPED, "Variants of an experiment stopped by guardrails", "experiment")?,
            experiment_kv: reg.gauges(names::EXPERIMENT_KV_CELLS_USED, "KV cells held by an experiment's running sequences", "experiment")?,
            experiment_kv_peak: reg.gauges(names::EXPERIMENT_KV_CELLS_PEAK, "Most KV cells an experiment's running sequences held at once", "experiment")?,
            kv_cells_used: reg.gauge(names::KV_CELLS_USED, "KV cache cells in use")?,
            peak_resident: reg.gauge(names::MEMORY_PEAK_RESIDENT, "Most resident memory the process has held (VmHWM)")?,
            kv_cells_cached: reg.gauge(names::KV_CELLS_CACHED, "KV cells held by cached prompt prefixes of finished requests (freed on demand)")?,
            running: reg.gauge(names::REQUESTS_RUNNING, "Sequences in the running batch")?,
            waiting: reg.gauge(names::REQUESTS_WAITING, "Sequences waiting for admission")?,
            preemptions: reg.counter(names::PREEMPTIONS, "Sequences preempted to free KV cells")?,
            cancellations: reg.counter(names::CANCELLATIONS, "Sequences cancelled by their client")?,
            prompt_tokens: reg.counter(names::PROMPT_TOKENS, "Prompt tokens admitted")?,
            generated_tokens: reg.counter(names::GENERATED_TOKENS, "Tokens generated")?,
            prompt_tokens_computed: reg.counter(
                names::PROMPT_TOKENS_COMPUTED,
                "Prompt positions the model computed (the rest came from cached or running prefixes)",
            )?,
            prompt_tokens_reused: reg.counter(
                names::PROMPT_TOKENS_REUSED,
                "Prompt tokens whose KV was reused from a cached slot or another running sequence",
            )?,
            prefix_copies: reg.counter(names::PREFIX_COPIES, "KV streams copied from one slot to another to reuse a prefix")?,
            prefix_store_bytes: reg.gauge(names::PREFIX_STORE_BYTES, "Host memory held by saved prompt prefixes")?,
            prefix_store_entries: reg.gauge(names::PREFIX_STORE_ENTRIES, "Prompt prefixes saved in host memory")?,
            prefix_restores: reg.counter(names::PREFIX_RESTORES, "Prompt prefixes restored from host memory into a slot")?,
            grammar: GrammarMetrics::new(&reg)?,
            drafts: DraftMetrics::new(&reg)?,
            models: crate::model_metrics::ModelSeries::register(&registry)?,
            engine_faults: reg.counter(names::ENGINE_FAULTS, "Impossible engine states met (each failed one request) and engine panics caught (each failed every request in flight)")?,
            itl_held: reg.gauge(
                names::REQUESTS_HELD_FOR_LATENCY,
                "Waiting requests held back at the last step by the inter-token latency target (--max-itl-ms)",
            )?,
            ttft: reg.hist(names::TIME_TO_FIRST_TOKEN, "Time from request to first token", latency_buckets())?,
            class_ttft: reg.hists(names::CLASS_TIME_TO_FIRST_TOKEN, "Time from request to first token per priority class", "class")?,
            request_duration: reg.hist(names::REQUEST_DURATION, "Time from request to last token", latency_buckets())?,
            time_per_output_token: reg.hist(
                names::TIME_PER_OUTPUT_TOKEN,
                "Mean time between output tokens of a request",
                vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0],
            )?,
            engine_step: reg.add(engine_step)?,
            stats,
            registry: registry.clone(),
            hooks: Default::default(),
        };
        m.registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(Arc::new(m))
    }

    /// The engine-step histogram exists before the engine starts (its observer feeds it).
    pub fn engine_step_histogram() -> prometheus::Result<Histogram> {
        Histogram::with_opts(
            HistogramOpts::new(
                names::ENGINE_STEP,
                "Duration of one engine step (one batched decode)",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
        )
    }

    /// Adds the series of every model of the registry (label `model`), the default too.
    pub fn add_models(&self, registry: &abserve_models::Registry) {
        for e in registry.iter() {
            self.models.add(e.clone());
            for c in e.collectors() {
                if let Err(err) = self.registry.register(c) {
                    tracing::warn!(
                        "the series of model '{}' could not be registered: {err}",
                        e.id
                    );
                }
            }
        }
    }

    /// Adds the collector of another part of the process (the worker's job counters).
    pub fn register(
        &self,
        c: impl prometheus::core::Collector + 'static,
    ) -> prometheus::Result<()> {
        self.registry.register(Box::new(c))
    }

    /// Runs `hook` at every scrape, before rendering (to copy counts kept in atomics elsewhere
    /// into collectors added with [`Metrics::register`]).
    pub fn on_render(&self, hook: impl Fn() + Send + Sync + 'static) {
        self.hooks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::new(hook));
    }

    /// Copies the engine's counters into the registry and renders the text format.
    pub fn render(&self) -> prometheus::Result<String> {
        for hook in self.hooks.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            hook();
        }
        let s = self.stats.snapshot();
        if let Some((d, [total, free, used])) = &self.device {
            let m = d.memory();
            total.set(m.total_bytes as i64);
            free.set(m.free_bytes as i64);
            used.set(m.used_bytes() as i64);
        }
        self.peak_resident
            .set(abserve_engine::plan::peak_rss() as i64);
        self.kv_cells_used.set(s.kv_cells_used as i64);
        self.kv_cells_cached.set(s.kv_cells_cached as i64);
        self.running.set(s.running as i64);
        self.waiting.set(s.waiting as i64);
        bump(&self.preemptions, s.preemptions);
        bump(&self.cancellations, s.cancellations);
        bump(&self.prompt_tokens, s.prompt_tokens);
        bump(&self.generated_tokens, s.generated_tokens);
        bump(&self.prompt_tokens_computed, s.prompt_tokens_computed);
        bump(&self.prompt_tokens_reused, s.shared_prompt_tokens);
        bump(&self.prefix_copies, s.prefix_copies);
        self.itl_held.set(s.itl_held as i64);
        self.prefix_store_bytes.set(s.prefix_store_bytes as i64);
        self.prefix_store_entries.set(s.prefix_store_entries as i64);
        bump(&self.prefix_restores, s.prefix_restores);
        self.drafts.copy(&s);
        bump(&self.engine_faults, s.faults);
        self.grammar.copy(&s);
        self.models.copy();
        // experiment names are defined by the operator, so this label stays bounded
        for (name, now, peak) in self.stats.groups() {
            self.experiment_kv
                .with_label_values(&[name.as_str()])
                .set(now as i64);
            self.experiment_kv_peak
                .with_label_values(&[name.as_str()])
                .set(peak as i64);
        }
        let mut buf = String::new();
        TextEncoder::new().encode_utf8(&self.registry.gather(), &mut buf)?;
        Ok(buf)
    }

    /// Per experiment: KV cells its running sequences hold now, and at most so far.
    pub fn experiment_kv(&self) -> Vec<(String, u64, u64)> {
        self.stats.groups()
    }

    pub fn count(&self, endpoint: &str, status: u16) {
        self.requests_total
            .with_label_values(&[endpoint, &status.to_string()])
            .inc();
    }

    pub fn generation_error(&self, e: &abserve_engine::GenerationError) {
        self.generation_errors.with_label_values(&[e.kind()]).inc();
    }

    pub fn store_error(&self, operation: &str) {
        self.store_errors.with_label_values(&[operation]).inc();
    }

    pub fn reject(&self, reason: &str) {
        self.rejections_total.with_label_values(&[reason]).inc();
    }
}

/// Speculative decoding: draft tokens verified and accepted (acceptance = accepted / tokens).
struct DraftMetrics {
    tokens: IntCounter,
    accepted: IntCounter,
    model_tokens: IntCounter,
    model_accepted: IntCounter,
}

impl DraftMetrics {
    fn new(reg: &Reg<'_>) -> prometheus::Result<Self> {
        Ok(DraftMetrics {
            tokens: reg.counter(
                names::DRAFT_TOKENS,
                "Draft tokens verified by speculative decoding (prompt lookup and draft model)",
            )?,
            accepted: reg.counter(
                names::DRAFT_ACCEPTED,
                "Draft tokens accepted (each a token gained without a step of its own)",
            )?,
            model_tokens: reg.counter(
                names::DRAFT_MODEL_TOKENS,
                "Draft tokens proposed by the draft model (--draft-model), of those verified",
            )?,
            model_accepted: reg.counter(
                names::DRAFT_MODEL_ACCEPTED,
                "Draft tokens proposed by the draft model and accepted",
            )?,
        })
    }

    fn copy(&self, s: &abserve_engine::StatsSnapshot) {
        bump(&self.tokens, s.draft_tokens);
        bump(&self.accepted, s.draft_accepted);
        bump(&self.model_tokens, s.draft_model_tokens);
        bump(&self.model_accepted, s.draft_model_accepted);
    }
}

/// Structured outputs: compile and mask time, forced-token share, rejections.
struct GrammarMetrics {
    compiles: IntCounter,
    compile_seconds: prometheus::Counter,
    rejections: IntCounter,
    masks: IntCounter,
    mask_seconds: prometheus::Counter,
    constrained_tokens: IntCounter,
    forced_tokens: IntCounter,
    running: IntGauge,
    matcher_bytes: IntGauge,
}

impl GrammarMetrics {
    fn new(reg: &Reg<'_>) -> prometheus::Result<Self> {
        let seconds = |name: &str, help: &str| reg.add(prometheus::Counter::new(name, help)?);
        Ok(GrammarMetrics {
            compiles: reg.counter(names::GRAMMAR_COMPILES, "Grammars compiled for structured outputs (response_format, tools)")?,
            compile_seconds: seconds(names::GRAMMAR_COMPILE_SECONDS, "Seconds spent compiling grammars (with their first mask)")?,
            rejections: reg.counter(names::GRAMMAR_REJECTIONS, "Grammars refused at compile time (400) or failed by a per-step limit during generation")?,
            masks: reg.counter(names::GRAMMAR_MASKS, "Token masks computed for constrained sequences")?,
            mask_seconds: seconds(names::GRAMMAR_MASK_SECONDS, "Seconds spent computing token masks (mask time per token = this / masks)")?,
            constrained_tokens: reg.counter(names::CONSTRAINED_TOKENS, "Tokens generated under a grammar (sampled or forced)")?,
            forced_tokens: reg.counter(names::FORCED_TOKENS, "Tokens a grammar forced and that were appended without sampling (fast-forward)")?,
            running: reg.gauge(names::CONSTRAINED_SEQUENCES, "Constrained sequences running (each holds one grammar matcher)")?,
            matcher_bytes: reg.gauge(names::MATCHER_BYTES, "Bytes of the running matchers' lexer tables (llguidance's estimate; bounded by the lexer-state limit)")?,
        })
    }

    fn copy(&self, s: &abserve_engine::StatsSnapshot) {
        let secs = |c: &prometheus::Counter, micros: u64| {
            let v = micros as f64 / 1e6;
            if v > c.get() {
                c.inc_by(v - c.get());
            }
        };
        bump(&self.compiles, s.grammar_compiles);
        secs(&self.compile_seconds, s.grammar_compile_micros);
        bump(&self.rejections, s.grammar_rejections);
        bump(&self.masks, s.grammar_masks);
        secs(&self.mask_seconds, s.grammar_mask_micros);
        bump(&self.constrained_tokens, s.constrained_tokens);
        bump(&self.forced_tokens, s.forced_tokens);
        self.running.set(s.constrained_running as i64);
        self.matcher_bytes.set(s.matcher_bytes as i64);
    }
}
