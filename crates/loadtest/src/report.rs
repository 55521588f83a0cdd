//! The outcome of a load test: counts by class, throughput, latency percentiles, memory and KV
//! over time (abserve targets), the server's own counters for the same run, and the no-OOM
//! verdict.

use std::collections::BTreeMap;

use abserve_protocol::{names, Samples};
use serde::Serialize;

use crate::client::{Class, Record};
use crate::scrape::Sample;

pub struct RunFacts {
    pub target: String,
    pub mode: String,
    pub workload: String,
    pub load_seconds: f64,
    pub stream: bool,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Percentiles {
    pub n: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

fn pct(xs: Vec<f64>, scale: f64) -> Percentiles {
    if xs.is_empty() {
        return Percentiles::default();
    }
    let q = abserve_statistics::quantiles(&xs, &[0.5, 0.95, 0.99, 1.0]);
    Percentiles {
        n: xs.len(),
        p50: q[0] * scale,
        p95: q[1] * scale,
        p99: q[2] * scale,
        max: q[3] * scale,
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Memory {
    /// With layers offloaded: the most device memory abserve used, and its device budget.
    pub peak_device_bytes: Option<f64>,
    pub device_budget_bytes: Option<f64>,
    pub peak_rss_bytes: f64,
    /// The server's own high-water mark (VmHWM), which sampling cannot miss.
    pub peak_rss_server_bytes: Option<f64>,
    pub final_rss_bytes: f64,
    pub peak_kv_cells: f64,
    pub final_kv_cells: f64,
    pub final_running: f64,
    pub final_waiting: f64,
    pub kv_cells_total: Option<f64>,
    pub planned_bytes: Option<f64>,
    pub budget_bytes: Option<f64>,
    pub samples: Vec<Sample>,
}

impl Memory {
    /// The memory figures of a run: from the samples taken during it and the target's metrics
    /// after it.
    fn from_run(a: &Samples, samples: Vec<Sample>) -> Memory {
        let last = samples.last().copied().unwrap_or_default();
        Memory {
            peak_device_bytes: samples
                .iter()
                .filter_map(|s| s.device_in_use_bytes)
                .reduce(f64::max),
            device_budget_bytes: a
                .has_prefix(names::DEVICE_MEMORY_BUDGET)
                .then(|| a.sum(names::DEVICE_MEMORY_BUDGET)),
            peak_rss_bytes: samples.iter().map(|s| s.rss_bytes).fold(0.0, f64::max),
            peak_rss_server_bytes: a.get(names::MEMORY_PEAK_RESIDENT),
            final_rss_bytes: last.rss_bytes,
            peak_kv_cells: samples.iter().map(|s| s.kv_cells_used).fold(0.0, f64::max),
            final_kv_cells: last.kv_cells_used,
            final_running: last.running,
            final_waiting: last.waiting,
            kv_cells_total: a.get(names::KV_CELLS_TOTAL),
            // every component: weights, KV, compute buffers and the prefix store
            planned_bytes: Some(a.sum(names::MEMORY_PLANNED)).filter(|b| *b > 0.0),
            budget_bytes: a.get(names::MEMORY_BUDGET),
            samples,
        }
    }

    /// The device side of the no-OOM verdict: abserve's peak use of the device above its device
    /// budget (only when the target offloads layers).
    pub fn device_over_budget(&self) -> Option<String> {
        let (peak, budget) = (self.peak_device_bytes?, self.device_budget_bytes?);
        (peak > budget).then(|| format!("device memory used by abserve peaked at {peak:.0} B, above its device budget {budget:.0} B"))
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub target: String,
    pub mode: String,
    pub workload: String,
    pub stream: bool,
    pub load_seconds: f64,
    pub sent: usize,
    pub by_class: BTreeMap<String, usize>,
    pub requests_per_second: f64,
    pub generated_tokens: u64,
    pub prompt_tokens: u64,
    pub generated_tokens_per_second: f64,
    pub ttft_ms: Percentiles,
    pub latency_ms: Percentiles,
    pub inter_token_ms: Percentiles,
    /// abserve targets: what the server counted during the run (deltas of its /metrics).
    pub server: Option<BTreeMap<String, f64>>,
    pub memory: Option<Memory>,
    /// First few failure messages, by class.
    pub examples: BTreeMap<String, Vec<String>>,
    pub failures: Vec<String>,
}

impl Report {
    pub fn build(
        f: RunFacts,
        records: Vec<Record>,
        samples: Vec<Sample>,
        before: Option<Samples>,
        after: Option<Samples>,
    ) -> Report {
        let mut by_class: BTreeMap<String, usize> = [
            Class::Ok,
            Class::Http429,
            Class::Http4xx,
            Class::Http5xx,
            Class::Timeout,
            Class::Connection,
            Class::Oom,
        ]
        .iter()
        .map(|c| (c.name().to_string(), 0))
        .collect();
        let mut examples: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in &records {
            *by_class.entry(r.class.name().into()).or_default() += 1;
            if let Some(m) = &r.message {
                let e = examples.entry(r.class.name().into()).or_default();
                if e.len() < 3 {
                    e.push(m.clone());
                }
            }
        }
        let ok: Vec<&Record> = records.iter().filter(|r| r.class == Class::Ok).collect();
        let generated: u64 = ok.iter().map(|r| r.completion_tokens).sum();
        let secs = f.load_seconds.max(1e-9);
        let server = server_counts(before.as_ref(), after.as_ref());
        let memory = after.as_ref().map(|a| Memory::from_run(a, samples));
        Report {
            target: f.target,
            mode: f.mode,
            workload: f.workload,
            stream: f.stream,
            load_seconds: f.load_seconds,
            sent: records.len(),
            requests_per_second: ok.len() as f64 / secs,
            generated_tokens: generated,
            prompt_tokens: ok.iter().map(|r| r.prompt_tokens).sum(),
            generated_tokens_per_second: generated as f64 / secs,
            ttft_ms: pct(ok.iter().filter_map(|r| r.ttft).collect(), 1e3),
            latency_ms: pct(ok.iter().map(|r| r.latency).collect(), 1e3),
            inter_token_ms: pct(ok.iter().flat_map(|r| r.itl.iter().copied()).collect(), 1e3),
            by_class,
            server,
            memory,
            examples,
            failures: Vec::new(),
        }
    }

    pub fn count(&self, c: Class) -> usize {
        self.by_class.get(c.name()).copied().unwrap_or(0)
    }

    /// The no-OOM verdict: any 5xx, OOM text, timeout or lost connection fails, and so does
    /// memory above `max_memory` (the server's own high-water mark when it reports one). 429s
    /// are allowed: pushing back is the point.
    pub fn check_no_oom(&mut self, max_memory: Option<f64>) {
        for (c, what) in [
            (Class::Http5xx, "server errors (5xx)"),
            (Class::Oom, "answers that mention running out of memory"),
            (Class::Timeout, "timeouts"),
            (Class::Connection, "lost connections"),
        ] {
            let n = self.count(c);
            if n > 0 {
                let ex = self
                    .examples
                    .get(c.name())
                    .and_then(|e| e.first())
                    .map(|m| format!(" (e.g. {m})"))
                    .unwrap_or_default();
                self.failures.push(format!("{n} {what}{ex}"));
            }
        }
        if let Some(over) = self.memory.as_ref().and_then(Memory::device_over_budget) {
            self.failures.push(over);
        }
        if let Some(limit) = max_memory {
            match &self.memory {
                Some(m) => {
                    let peak = m.peak_rss_server_bytes.unwrap_or(0.0).max(m.peak_rss_bytes);
                    if peak > limit {
                        self.failures.push(format!(
                            "peak resident memory {peak:.0} B is above --max-memory {limit:.0} B"
                        ));
                    }
                }
                None => self
                    .failures
                    .push("--max-memory needs an abserve target (its /metrics)".into()),
            }
        }
    }

    pub fn table(&self) -> String {
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
        t.set_header(vec!["", "value"]);
        let p = |x: &Percentiles| {
            format!(
                "p50 {:.1}  p95 {:.1}  p99 {:.1}  max {:.1}  (n={})",
                x.p50, x.p95, x.p99, x.max, x.n
            )
        };
        t.add_row(vec![
            "target".into(),
            format!("{} ({}, {})", self.target, self.workload, self.mode),
        ]);
        t.add_row(vec![
            "requests".into(),
            format!("{} sent in {:.1} s", self.sent, self.load_seconds),
        ]);
        t.add_row(vec![
            "outcome".into(),
            self.by_class
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
        ]);
        t.add_row(vec![
            "throughput".into(),
            format!(
                "{:.2} req/s, {:.1} generated tok/s",
                self.requests_per_second, self.generated_tokens_per_second
            ),
        ]);
        t.add_row(vec!["TTFT ms".into(), p(&self.ttft_ms)]);
        t.add_row(vec!["latency ms".into(), p(&self.latency_ms)]);
        if self.stream {
            t.add_row(vec!["inter-token ms".into(), p(&self.inter_token_ms)]);
        }
        if let Some(m) = &self.memory {
            memory_rows(&mut t, m);
        }
        if let Some(s) = &self.server {
            t.add_row(vec![
                "server counted".into(),
                s.iter()
                    .filter(|(_, v)| **v != 0.0)
                    .map(|(k, v)| format!("{k} {v:.0}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ]);
        }
        t.to_string()
    }
}

/// What the server counted during the run (the difference of its `/metrics` after and before),
/// when both were scraped.
fn server_counts(
    before: Option<&Samples>,
    after: Option<&Samples>,
) -> Option<BTreeMap<String, f64>> {
    let (b, a) = (before?, after?);
    let d = |k: &str| a.or_zero(k) - b.or_zero(k);
    let mut s = BTreeMap::new();
    let chat = |status: &str| {
        format!(
            "{}{{endpoint=\"chat_completions\",status=\"{status}\"}}",
            names::REQUESTS
        )
    };
    let rejected = |reason: &str| format!("{}{{reason=\"{reason}\"}}", names::REJECTIONS);
    for (name, key) in [
        ("chat_200", chat("200")),
        ("chat_429", chat("429")),
        ("chat_500", chat("500")),
        ("chat_503", chat("503")),
        ("generated_tokens", names::GENERATED_TOKENS.to_string()),
        ("prompt_tokens", names::PROMPT_TOKENS.to_string()),
        ("preemptions", names::PREEMPTIONS.to_string()),
        ("rejected_queue_full", rejected("queue_full")),
        ("rejected_queue_timeout", rejected("queue_timeout")),
    ] {
        s.insert(name.to_string(), d(&key));
    }
    Some(s)
}

/// The memory rows of the table: resident memory against the plan, KV cells, the device.
fn memory_rows(t: &mut comfy_table::Table, m: &Memory) {
    let mb = |b: f64| format!("{:.1} MB", b / 1e6);
    t.add_row(vec![
        "memory".into(),
        format!(
            "peak {} (server high-water {}), final {}; plan {}, budget {}",
            mb(m.peak_rss_bytes),
            m.peak_rss_server_bytes.map(mb).unwrap_or("?".into()),
            mb(m.final_rss_bytes),
            m.planned_bytes.map(mb).unwrap_or("?".into()),
            m.budget_bytes.map(mb).unwrap_or("?".into())
        ),
    ]);
    t.add_row(vec![
        "KV cells".into(),
        format!(
            "peak {:.0}, final {:.0} of {}",
            m.peak_kv_cells,
            m.final_kv_cells,
            m.kv_cells_total
                .map(|k| format!("{k:.0}"))
                .unwrap_or("?".into())
        ),
    ]);
    if let (Some(peak), Some(budget)) = (m.peak_device_bytes, m.device_budget_bytes) {
        t.add_row(vec![
            "device memory".into(),
            format!(
                "peak used by abserve {}, device budget {}",
                mb(peak),
                mb(budget)
            ),
        ]);
    }
}

#[cfg(test)]
mod tests {
    use super::Memory;

    #[test]
    fn device_memory_above_the_device_budget_fails_the_no_oom_check() {
        let mut m = Memory {
            device_budget_bytes: Some(1000.0),
            peak_device_bytes: Some(1000.0),
            ..Default::default()
        };
        assert_eq!(m.device_over_budget(), None, "at the budget is within it");
        m.peak_device_bytes = Some(1001.0);
        let msg = m.device_over_budget().unwrap();
        assert!(msg.contains("1001") && msg.contains("1000"), "{msg}");
        // a CPU target has no device figures: nothing to judge
        assert_eq!(
            Memory {
                peak_device_bytes: Some(5.0),
                ..Default::default()
            }
            .device_over_budget(),
            None
        );
    }
}
