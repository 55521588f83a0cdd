//! Follows an abserve target's /metrics during a run: resident memory, KV cells in use and the
//! queue, sampled every 250 ms, plus the server's own counters before and after (so the report
//! can be checked against what the server counted).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct Sample {
    pub t: f64,
    pub rss_bytes: f64,
    pub kv_tokens_used: f64,
    pub running: f64,
    pub waiting: f64,
}

/// `name{labels}` → value, for every sample line of a Prometheus text page.
pub fn parse(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

pub struct Scraper {
    http: reqwest::Client,
    url: String,
    key: Option<String>,
}

impl Scraper {
    pub fn new(http: reqwest::Client, base: &str, key: Option<String>) -> Scraper {
        Scraper { http, url: format!("{base}/metrics"), key }
    }

    pub async fn fetch(&self) -> Option<BTreeMap<String, f64>> {
        let mut r = self.http.get(&self.url).timeout(Duration::from_secs(5));
        if let Some(k) = &self.key {
            r = r.bearer_auth(k);
        }
        let r = r.send().await.ok()?;
        if !r.status().is_success() {
            return None;
        }
        let m = parse(&r.text().await.ok()?);
        m.keys().any(|k| k.starts_with("abserve_")).then_some(m)
    }

    pub fn sample(m: &BTreeMap<String, f64>, t: f64) -> Sample {
        let g = |k: &str| m.get(k).copied().unwrap_or(0.0);
        Sample {
            t,
            rss_bytes: g("process_resident_memory_bytes"),
            kv_tokens_used: g("abserve_kv_tokens_used"),
            running: g("abserve_requests_running"),
            waiting: g("abserve_requests_waiting"),
        }
    }

    /// Samples until `stop` is set.
    pub fn spawn(self: Arc<Self>, t0: Instant, out: Arc<Mutex<Vec<Sample>>>, stop: Arc<std::sync::atomic::AtomicBool>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(m) = self.fetch().await {
                    out.lock().unwrap_or_else(|e| e.into_inner()).push(Self::sample(&m, t0.elapsed().as_secs_f64()));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    }
}
