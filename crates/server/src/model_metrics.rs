//! Per-model series of `/metrics` (label `model`): every model of the registry, the default
//! too, with its plan where this process runs it (budget, planned bytes, KV cells) and its
//! KV cells in use, queue and tokens, and its queue per priority class. The unlabelled engine series (`abserve_kv_cells_used`, …) stay the
//! default model's, as they were before a server could hold several. The label's values are
//! the `--model` ids: bounded by the operator.

use std::sync::Mutex;

use abserve_engine::Class;
use abserve_models::Entry;
use abserve_protocol::names;
use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

/// Moves a counter up to `v`, an engine's count (counters never go down).
pub(crate) fn bump(c: &IntCounter, v: u64) {
    c.inc_by(v.saturating_sub(c.get()));
}

pub(crate) struct ModelSeries {
    budget: IntGaugeVec,
    planned: IntGaugeVec,
    kv_cells: IntGaugeVec,
    kv_cells_used: IntGaugeVec,
    running: IntGaugeVec,
    waiting: IntGaugeVec,
    prompt_tokens: IntCounterVec,
    generated_tokens: IntCounterVec,
    set_changes: IntCounterVec,
    class_waiting: IntGaugeVec,
    class_running: IntGaugeVec,
    class_preemptions: IntCounterVec,
    models: Mutex<Vec<Entry>>,
}

impl ModelSeries {
    pub(crate) fn register(registry: &Registry) -> prometheus::Result<ModelSeries> {
        let gauge = |name: &str, help: &str| -> prometheus::Result<IntGaugeVec> {
            let g = IntGaugeVec::new(Opts::new(name, help), &["model"])?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let counter = |name: &str, help: &str| -> prometheus::Result<IntCounterVec> {
            let c = IntCounterVec::new(Opts::new(name, help), &["model"])?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let by_class = ["model", "class"];
        let class_gauge = |name: &str, help: &str| -> prometheus::Result<IntGaugeVec> {
            let g = IntGaugeVec::new(Opts::new(name, help), &by_class)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let class_preemptions = IntCounterVec::new(
            Opts::new(
                names::CLASS_PREEMPTIONS,
                "Sequences of a class preempted: for a more urgent class, or for memory",
            ),
            &by_class,
        )?;
        registry.register(Box::new(class_preemptions.clone()))?;
        Ok(ModelSeries {
            budget: gauge(names::MODEL_BUDGET, "A model's share of the memory budget")?,
            planned: gauge(
                names::MODEL_PLANNED,
                "Memory planned for a model: weights, adapters, KV, compute, prefix store",
            )?,
            kv_cells: gauge(names::MODEL_KV_CELLS, "KV cells of a model's cache")?,
            kv_cells_used: gauge(
                names::MODEL_KV_CELLS_USED,
                "KV cells of a model's cache in use",
            )?,
            running: gauge(names::MODEL_RUNNING, "Sequences in a model's running batch")?,
            waiting: gauge(
                names::MODEL_WAITING,
                "Sequences waiting for admission to a model",
            )?,
            prompt_tokens: counter(
                names::MODEL_PROMPT_TOKENS,
                "Prompt tokens admitted to a model",
            )?,
            generated_tokens: counter(names::MODEL_GENERATED_TOKENS, "Tokens a model generated")?,
            set_changes: counter(
                names::MODEL_ADAPTER_SET_CHANGES,
                "Times a model's context (an adapter lane) was given another adapter set",
            )?,
            class_waiting: class_gauge(
                names::CLASS_WAITING,
                "Sequences of a priority class waiting for admission to a model",
            )?,
            class_running: class_gauge(
                names::CLASS_RUNNING,
                "Sequences of a priority class in a model's running batch",
            )?,
            class_preemptions,
            models: Default::default(),
        })
    }

    /// Adds a model: its plan's constants now (a model this process runs), its figures at
    /// every scrape.
    pub(crate) fn add(&self, model: Entry) {
        let id = [model.id.as_str()];
        if let Some(plan) = model.plan() {
            self.budget
                .with_label_values(&id)
                .set(plan.budget_bytes as i64 + plan.device_budget_bytes.unwrap_or(0) as i64);
            self.planned
                .with_label_values(&id)
                .set(plan.planned_bytes as i64);
            self.kv_cells
                .with_label_values(&id)
                .set(plan.kv_cells as i64);
        }
        self.models
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(model);
    }

    /// Copies every model's engine figures (before rendering).
    pub(crate) fn copy(&self) {
        for m in self.models.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let s = m.stats();
            let id = [m.id.as_str()];
            self.kv_cells_used
                .with_label_values(&id)
                .set(s.kv_cells_used as i64);
            self.running.with_label_values(&id).set(s.running as i64);
            self.waiting.with_label_values(&id).set(s.waiting as i64);
            for (class, n) in Class::ALL.iter().zip(s.classes) {
                let l = [m.id.as_str(), class.as_str()];
                self.class_waiting
                    .with_label_values(&l)
                    .set(n.waiting as i64);
                self.class_running
                    .with_label_values(&l)
                    .set(n.running as i64);
                bump(&self.class_preemptions.with_label_values(&l), n.preemptions);
            }
            for (c, v) in [
                (&self.prompt_tokens, s.prompt_tokens),
                (&self.generated_tokens, s.generated_tokens),
                (&self.set_changes, s.adapter_set_changes),
            ] {
                bump(&c.with_label_values(&id), v);
            }
        }
    }
}
