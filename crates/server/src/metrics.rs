//! Prometheus metrics, all prefixed `abserve_`, plus the standard process collector
//! (`process_resident_memory_bytes`). Label values are bounded: endpoints and status codes,
//! rejection reasons and memory components; never prompts or user ids.

use std::sync::Arc;
use std::time::Duration;

use abserve_engine::plan::MemoryPlan;
use abserve_engine::scheduler::EngineStats;
use abserve_protocol::names;
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    stats: Arc<EngineStats>,
    pub requests_total: IntCounterVec,
    pub rejections_total: IntCounterVec,
    pub ttft: Histogram,
    pub request_duration: Histogram,
    pub time_per_output_token: Histogram,
    pub engine_step: Histogram,
    kv_tokens_used: IntGauge,
    running: IntGauge,
    waiting: IntGauge,
    preemptions: IntCounter,
    cancellations: IntCounter,
    prompt_tokens: IntCounter,
    generated_tokens: IntCounter,
    experiment_kv: IntGaugeVec,
    experiment_kv_peak: IntGaugeVec,
    peak_resident: IntGauge,
    kv_tokens_cached: IntGauge,
    prompt_tokens_computed: IntCounter,
    prompt_tokens_reused: IntCounter,
    prefix_copies: IntCounter,
    itl_held: IntGauge,
    prefix_store_bytes: IntGauge,
    prefix_store_entries: IntGauge,
    prefix_restores: IntCounter,
}

fn latency_buckets() -> Vec<f64> {
    vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]
}

impl Metrics {
    pub fn new(plan: &MemoryPlan, stats: Arc<EngineStats>, engine_step: Histogram) -> Arc<Metrics> {
        let r = Registry::new();
        let reg = |c: Box<dyn prometheus::core::Collector>| r.register(c).expect("metric names are unique");
        let budget = IntGauge::new(names::MEMORY_BUDGET, "Memory budget the plan was made for").unwrap();
        budget.set(plan.budget_bytes as i64);
        reg(Box::new(budget));
        let planned = IntGaugeVec::new(
            Opts::new(names::MEMORY_PLANNED, "Planned memory per component"),
            &["component"],
        )
        .unwrap();
        planned.with_label_values(&["weights"]).set(plan.weights_bytes as i64);
        planned.with_label_values(&["kv"]).set(plan.kv_bytes as i64);
        planned.with_label_values(&["compute"]).set(plan.compute_bytes as i64);
        planned.with_label_values(&["prefix_store"]).set(plan.prefix_store_bytes as i64);
        reg(Box::new(planned));
        // a constant, typed as a counter because Prometheus reserves the _total suffix for them
        let kv_total = IntCounter::new(names::KV_TOKENS_TOTAL, "KV cache cells (tokens) the plan allocated; constant").unwrap();
        kv_total.inc_by(plan.kv_tokens);
        reg(Box::new(kv_total));
        let max_seq = IntGauge::new(names::MAX_SEQUENCES, "Concurrent sequences of the full context that fit").unwrap();
        max_seq.set(plan.max_sequences as i64);
        reg(Box::new(max_seq));
        let slots = IntGauge::new(names::KV_SLOTS, "Sequence slots (llama.cpp n_seq_max); with split KV streams, one stream each").unwrap();
        slots.set(plan.seq_slots as i64);
        reg(Box::new(slots));
        let per_slot = IntGauge::new(
            names::KV_CELLS_PER_SLOT,
            "KV cells of one slot's stream (split streams: fixed, no borrowing; unified: the whole pool)",
        )
        .unwrap();
        per_slot.set(plan.kv_cells_per_slot as i64);
        reg(Box::new(per_slot));
        let unified = IntGauge::new(names::KV_UNIFIED, "1 when all sequences share one KV pool, 0 with one stream per slot").unwrap();
        unified.set(plan.kv_unified as i64);
        reg(Box::new(unified));

        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).unwrap();
            r.register(Box::new(g.clone())).unwrap();
            g
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).unwrap();
            r.register(Box::new(c.clone())).unwrap();
            c
        };
        let hist = |name: &str, help: &str, buckets: Vec<f64>| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).unwrap();
            r.register(Box::new(h.clone())).unwrap();
            h
        };
        let requests_total = IntCounterVec::new(
            Opts::new(names::REQUESTS, "HTTP requests by endpoint and status code"),
            &["endpoint", "status"],
        )
        .unwrap();
        r.register(Box::new(requests_total.clone())).unwrap();
        let rejections_total = IntCounterVec::new(
            Opts::new(names::REJECTIONS, "Requests turned away, by reason"),
            &["reason"],
        )
        .unwrap();
        r.register(Box::new(rejections_total.clone())).unwrap();
        for reason in ["queue_full", "queue_timeout", "too_long", "shutting_down", "not_ready"] {
            rejections_total.with_label_values(&[reason]);
        }
        let experiment_kv = IntGaugeVec::new(
            Opts::new(names::EXPERIMENT_KV_TOKENS_USED, "KV cells held by an experiment's running sequences"),
            &["experiment"],
        )
        .unwrap();
        r.register(Box::new(experiment_kv.clone())).unwrap();
        let experiment_kv_peak = IntGaugeVec::new(
            Opts::new(names::EXPERIMENT_KV_TOKENS_PEAK, "Most KV cells an experiment's running sequences held at once"),
            &["experiment"],
        )
        .unwrap();
        r.register(Box::new(experiment_kv_peak.clone())).unwrap();
        let m = Metrics {
            experiment_kv,
            experiment_kv_peak,
            kv_tokens_used: gauge(names::KV_TOKENS_USED, "KV cache cells in use"),
            peak_resident: gauge(names::MEMORY_PEAK_RESIDENT, "Most resident memory the process has held (VmHWM)"),
            kv_tokens_cached: gauge(names::KV_TOKENS_CACHED, "KV cells held by cached prompt prefixes of finished requests (freed on demand)"),
            running: gauge(names::REQUESTS_RUNNING, "Sequences in the running batch"),
            waiting: gauge(names::REQUESTS_WAITING, "Sequences waiting for admission"),
            preemptions: counter(names::PREEMPTIONS, "Sequences preempted to free KV cells"),
            cancellations: counter(names::CANCELLATIONS, "Sequences cancelled by their client"),
            prompt_tokens: counter(names::PROMPT_TOKENS, "Prompt tokens admitted"),
            generated_tokens: counter(names::GENERATED_TOKENS, "Tokens generated"),
            prompt_tokens_computed: counter(
                names::PROMPT_TOKENS_COMPUTED,
                "Prompt positions the model computed (the rest came from cached or running prefixes)",
            ),
            prompt_tokens_reused: counter(
                names::PROMPT_TOKENS_REUSED,
                "Prompt tokens whose KV was reused from a cached slot or another running sequence",
            ),
            prefix_copies: counter(names::PREFIX_COPIES, "KV streams copied from one slot to another to reuse a prefix"),
            prefix_store_bytes: gauge(names::PREFIX_STORE_BYTES, "Host memory held by saved prompt prefixes"),
            prefix_store_entries: gauge(names::PREFIX_STORE_ENTRIES, "Prompt prefixes saved in host memory"),
            prefix_restores: counter(names::PREFIX_RESTORES, "Prompt prefixes restored from host memory into a slot"),
            itl_held: gauge(
                names::REQUESTS_HELD_FOR_LATENCY,
                "Waiting requests held back at the last step by the inter-token latency target (--max-itl-ms)",
            ),
            ttft: hist(names::TIME_TO_FIRST_TOKEN, "Time from request to first token", latency_buckets()),
            request_duration: hist(names::REQUEST_DURATION, "Time from request to last token", latency_buckets()),
            time_per_output_token: hist(
                names::TIME_PER_OUTPUT_TOKEN,
                "Mean time between output tokens of a request",
                vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0],
            ),
            engine_step: {
                r.register(Box::new(engine_step.clone())).unwrap();
                engine_step
            },
            requests_total,
            rejections_total,
            registry: r,
            stats,
        };
        let pc = prometheus::process_collector::ProcessCollector::for_self();
        m.registry.register(Box::new(pc)).expect("process collector");
        Arc::new(m)
    }

    /// The engine-step histogram exists before the engine starts (its observer feeds it).
    pub fn engine_step_histogram() -> Histogram {
        Histogram::with_opts(
            HistogramOpts::new(names::ENGINE_STEP, "Duration of one engine step (one batched decode)")
                .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]),
        )
        .unwrap()
    }

    pub fn observe_step(&self, d: Duration) {
        self.engine_step.observe(d.as_secs_f64());
    }

    /// Copies the engine's counters into the registry and renders the text format.
    pub fn render(&self) -> String {
        let s = self.stats.snapshot();
        self.peak_resident.set(abserve_engine::plan::peak_rss() as i64);
        self.kv_tokens_used.set(s.kv_tokens_used as i64);
        self.kv_tokens_cached.set(s.kv_tokens_cached as i64);
        self.running.set(s.running as i64);
        self.waiting.set(s.waiting as i64);
        let bump = |c: &IntCounter, v: u64| {
            let cur = c.get();
            if v > cur {
                c.inc_by(v - cur);
            }
        };
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
        // experiment names are defined by the operator, so this label stays bounded
        for (name, now, peak) in self.stats.groups() {
            self.experiment_kv.with_label_values(&[name.as_str()]).set(now as i64);
            self.experiment_kv_peak.with_label_values(&[name.as_str()]).set(peak as i64);
        }
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf).expect("encode metrics");
        String::from_utf8(buf).expect("metrics are UTF-8")
    }

    pub fn count(&self, endpoint: &str, status: u16) {
        self.requests_total.with_label_values(&[endpoint, &status.to_string()]).inc();
    }

    pub fn reject(&self, reason: &str) {
        self.rejections_total.with_label_values(&[reason]).inc();
    }
}
