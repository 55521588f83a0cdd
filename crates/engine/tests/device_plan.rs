//! The device side of the memory plan on a fake device (no GPU needed): the budget comes from
//! the device's free memory, layers split weights and KV between device and host by the GGUF
//! tensor table, and a device too small for the offloaded weights is refused before loading,
//! with every number.

mod common;

use std::sync::Arc;

use abserve_engine::device::FakeDevice;
use abserve_engine::gguf::{GgufHeader, ModelShape};
use abserve_engine::plan::{current_rss, Budget};
use abserve_engine::{DeviceHandle, Engine, EngineConfig, EngineError, GpuLayers};

const GIB: u64 = 1 << 30;

fn on_device(total: u64, used: u64) -> EngineConfig {
    let mut c = common::config();
    c.device = Some(DeviceHandle(Arc::new(FakeDevice::new(
        "Fake0", total, used,
    ))));
    c
}

fn header() -> (GgufHeader, ModelShape) {
    let h = GgufHeader::read(&common::model_path()).unwrap();
    let s = ModelShape::from_header(&h).unwrap();
    (h, s)
}

#[test]
fn the_device_budget_is_a_share_of_its_free_memory() {
    let mut cfg = on_device(8 * GIB, 6 * GIB);
    cfg.device_budget = Budget::Fraction(0.5);
    let (_, plan) = cfg.plan().unwrap();
    let d = plan.device.as_ref().expect("a device part");
    assert_eq!((d.free_bytes, d.used_before_bytes), (2 * GIB, 6 * GIB));
    assert_eq!(
        d.budget_bytes, GIB,
        "half of the 2 GiB free, not of the 8 GiB total"
    );
    assert_eq!(d.margin_bytes, GIB / 10);
    assert_eq!(d.usable_bytes, GIB - GIB / 10);
    assert!(d.planned_bytes <= d.usable_bytes && plan.fits);
    assert_eq!(plan.device_budget_bytes, Some(GIB));
    assert_eq!(plan.device_planned_bytes, Some(d.planned_bytes));
    assert_eq!(
        plan.planned_bytes,
        plan.host_planned_bytes + d.planned_bytes
    );
    // a smaller budget holds fewer KV cells: the device, not the host, sizes the cache
    let mut small = on_device(8 * GIB, 6 * GIB);
    small.device_budget = Budget::Bytes(300 << 20);
    small.kv_cells_cap = None;
    let (_, p2) = small.plan().unwrap();
    let mut big = on_device(8 * GIB, 0);
    big.kv_cells_cap = None;
    let (_, p3) = big.plan().unwrap();
    assert!(
        p2.kv_cells < p3.kv_cells,
        "{} cells on 300 MiB vs {} on 8 GiB",
        p2.kv_cells,
        p3.kv_cells
    );
    assert!(p2.device.as_ref().unwrap().planned_bytes <= p2.device.as_ref().unwrap().usable_bytes);
}

#[test]
fn a_partial_offload_splits_weights_and_kv_by_layer() {
    let (h, s) = header();
    let mut cfg = on_device(8 * GIB, 0);
    cfg.gpu_layers = Some(GpuLayers::Count(10));
    let (_, plan) = cfg.plan().unwrap();
    let d = plan.device.as_ref().unwrap();
    assert_eq!((d.layers_offloaded, d.n_layer), (10, s.n_layer));
    // the last 10 layers' tensors, read from the tensor table
    let first = s.n_layer - 10;
    let want: u64 = h
        .tensors
        .iter()
        .filter(|t| {
            t.name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next())
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|i| i >= first)
        })
        .map(|t| t.bytes)
        .sum();
    assert!(want > 0);
    assert_eq!(d.weights_bytes, want);
    // KV cells per layer: a third of the layers, a third of the KV
    assert_eq!(
        d.kv_bytes,
        plan.kv_cells * (plan.kv_bytes_per_token * 10 / s.n_layer)
    );
    let host_kv = plan.kv_bytes - d.kv_bytes;
    assert!(host_kv > d.kv_bytes, "20 layers' KV stay on the host");
    assert!(
        plan.host_planned_bytes >= (h.weights_bytes() - want) + host_kv,
        "host: the other layers' weights and KV"
    );
    assert_eq!(
        plan.planned_bytes,
        plan.host_planned_bytes + d.planned_bytes
    );
    // all layers: the output layer too (tied embeddings: a copy of token_embd goes to the device)
    let mut all = on_device(8 * GIB, 0);
    all.gpu_layers = Some(GpuLayers::All);
    let (_, pa) = all.plan().unwrap();
    let da = pa.device.as_ref().unwrap();
    assert_eq!(da.layers_offloaded, s.n_layer);
    assert_eq!(da.kv_bytes, pa.kv_bytes, "every layer's KV on the device");
    assert_eq!(
        da.weights_bytes,
        h.offloaded_bytes(s.n_layer, s.n_layer + 1)
    );
    assert!(
        da.weights_bytes > h.offloaded_bytes(s.n_layer, s.n_layer),
        "the output layer goes too"
    );
    // no device: no device part, everything on the host as before
    let (_, host_only) = common::config().plan().unwrap();
    assert!(host_only.device.is_none());
    assert_eq!(host_only.planned_bytes, host_only.host_planned_bytes);
}

#[test]
fn a_device_too_small_for_the_offloaded_weights_is_refused_before_loading_with_every_number() {
    let (h, s) = header();
    let mut cfg = on_device(4 * GIB, 4 * GIB - (64 << 20));
    cfg.device_budget = Budget::Bytes(40 << 20);
    let rss = current_rss();
    let err = match Engine::start(cfg) {
        Err(e) => e,
        Ok(_) => panic!("a 40 MiB device budget cannot hold the weights"),
    };
    assert!(matches!(err, EngineError::DoesNotFit(_)), "{err}");
    let grew = current_rss().saturating_sub(rss);
    assert!(
        grew < h.weights_bytes() / 2,
        "refused before the weights were loaded (RSS grew {grew} B)"
    );
    let text = err.to_string();
    let weights = h.offloaded_bytes(s.n_layer, s.n_layer + 1);
    let budget: u64 = 40 << 20;
    let margin = budget / 10;
    for n in [weights, budget, margin, budget - margin, 64 << 20, 4 * GIB] {
        assert!(text.contains(&n.to_string()), "{n} missing from: {text}");
    }
    assert!(
        text.contains("device budget of Fake0")
            && text.contains(&format!("{} layers of {}", s.n_layer, s.n_layer)),
        "{text}"
    );
}
