//! Follows an abserve target's /metrics during a run: resident memory, KV cells in use and the
//! queue, sampled every 250 ms, plus the server's own counters before and after (so the report
//! can be checked against what the server counted).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use abserve_protocol::{names, Samples};
use serde::Serialize;

#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct Sample {
    pub t: f64,
    pub rss_bytes: f64,
    pub kv_cells_used: f64,
    pub running: f64,
    pub waiting: f64,
    /// With layers offloaded: device memory abserve uses (in use now, less what was in use
    /// before it started).
    pub device_in_use_bytes: Option<f64>,
}

pub struct Scraper {
    api: abserve_protocol::Client,
}

impl Scraper {
    pub fn new(api: abserve_protocol::Client) -> Scraper {
        Scraper { api }
    }

    /// The target's metrics when it is abserve (it exports `abserve_` series).
    pub async fn fetch(&self) -> Option<Samples> {
        let m = self.api.metrics(Duration::from_secs(5)).await?;
        m.has_prefix(names::PREFIX).then_some(m)
    }

    pub fn sample(m: &Samples, t: f64) -> Sample {
        Sample {
            t,
            rss_bytes: m.or_zero(names::PROCESS_RESIDENT_MEMORY),
            kv_cells_used: m.or_zero(names::KV_CELLS_USED),
            running: m.or_zero(names::REQUESTS_RUNNING),
            waiting: m.or_zero(names::REQUESTS_WAITING),
            device_in_use_bytes: m.has_prefix(names::DEVICE_MEMORY_USED).then(|| {
                m.sum(names::DEVICE_MEMORY_USED) - m.sum(names::DEVICE_MEMORY_USED_BEFORE)
            }),
        }
    }

    /// Samples until `stop` is set.
    pub fn spawn(
        self: Arc<Self>,
        t0: Instant,
        out: Arc<Mutex<Vec<Sample>>>,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(m) = self.fetch().await {
                    out.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Self::sample(&m, t0.elapsed().as_secs_f64()));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    }
}
