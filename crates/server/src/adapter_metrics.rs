//! The default model's LoRA adapters in `/metrics`: the plan's reservation, the bytes admitted,
//! the adapters llama.cpp holds and the unloads (names in `abserve_protocol::names`).

use abserve_engine::adapters::AdapterBudget;
use abserve_protocol::names;
use prometheus::{IntCounter, IntGauge};

use crate::metrics::Metrics;

/// Adds the adapter series of `budget` to `metrics`, copied at every scrape.
pub fn add(metrics: &Metrics, budget: AdapterBudget) -> prometheus::Result<()> {
    let reserved = IntGauge::new(
        names::ADAPTER_BYTES_RESERVED,
        "Memory the plan reserved for LoRA adapters",
    )?;
    let admitted = IntGauge::new(
        names::ADAPTER_BYTES_ADMITTED,
        "Bytes of the LoRA adapters admitted into the reservation",
    )?;
    let loaded = IntGauge::new(names::ADAPTERS_LOADED, "LoRA adapters llama.cpp holds")?;
    let unloads = IntCounter::new(
        names::ADAPTER_UNLOADS,
        "LoRA adapters unloaded because nothing referenced them and their room was needed",
    )?;
    reserved.set(budget.reserved() as i64);
    for c in [&reserved, &admitted, &loaded] {
        metrics.register(c.clone())?;
    }
    metrics.register(unloads.clone())?;
    metrics.on_render(move || {
        admitted.set(budget.used() as i64);
        loaded.set(budget.loaded().len() as i64);
        unloads.inc_by(budget.unloads().saturating_sub(unloads.get()));
    });
    Ok(())
}
