//! The upstream's own load, scraped from its Prometheus `/metrics` every
//! [`SCRAPE_INTERVAL`]: other clients share an upstream, so abserve's reservations alone do not
//! say how full it is. A replica is saturated while the share read here is at or above the
//! upstream's `saturation_threshold`; the pool admits nothing new to it meanwhile.
//!
//! The share: KV-cache use where the engine reports it (vLLM `vllm:kv_cache_usage_perc` or
//! `vllm:gpu_cache_usage_perc`, SGLang `sglang:token_usage`, llama.cpp
//! `llamacpp:kv_cache_usage_ratio`), else the share of llama.cpp's slots busy with other clients'
//! requests (`llamacpp:requests_processing` less abserve's own, over its slots: abserve's own
//! are already bounded by the pool); and 1 whenever the engine has requests waiting in its own queue
//! (`vllm:num_requests_waiting`, `sglang:num_queue_reqs`, `tgi_queue_size`,
//! `llamacpp:requests_deferred`) — it is already deferring work. An upstream without
//! `/metrics` (a hosted API) is never held back by this.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use abserve_protocol::{parse_prometheus as parse, Samples};

use super::Shared;

pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);

/// The share of the upstream in use, from its metrics (`None`: it reports none of them).
/// `ours`: the requests abserve has running there now.
pub fn share(s: &Samples, slots: usize, ours: usize) -> Option<f64> {
    let queued = [
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "tgi_queue_size",
        "llamacpp:requests_deferred",
    ]
    .iter()
    .filter_map(|n| s.has_prefix(n).then(|| s.sum(n)))
    .fold(None, |a: Option<f64>, v| Some(a.unwrap_or(0.0) + v));
    let kv = [
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
        "llamacpp:kv_cache_usage_ratio",
    ]
    .iter()
    .find(|n| s.has_prefix(n))
    .map(|n| s.sum(n))
    .or_else(|| {
        s.has_prefix("llamacpp:requests_processing").then(|| {
            (s.sum("llamacpp:requests_processing") - ours as f64).max(0.0) / slots.max(1) as f64
        })
    });
    match (kv, queued) {
        (_, Some(q)) if q > 0.0 => Some(1.0),
        (Some(k), _) => Some(k),
        (None, Some(_)) => Some(0.0),
        (None, None) => None,
    }
}

/// Scrapes every replica of `sh` until the upstream is dropped.
pub(crate) fn spawn(sh: &Arc<Shared>) {
    let weak: Weak<Shared> = Arc::downgrade(sh);
    tokio::spawn(async move {
        let mut silent = false;
        loop {
            tokio::time::sleep(SCRAPE_INTERVAL).await;
            let Some(sh) = weak.upgrade() else { return };
            let mut any = false;
            for r in &sh.pool.replicas {
                let url = format!("{}/metrics", super::discover::root(&r.url));
                let got = async {
                    let resp = sh
                        .http
                        .get(&url)
                        .timeout(Duration::from_secs(2))
                        .send()
                        .await
                        .ok()?;
                    if !resp.status().is_success() {
                        return None;
                    }
                    Some(parse(&resp.text().await.ok()?))
                };
                let share = got
                    .await
                    .and_then(|s| share(&s, r.limits.seqs, r.in_flight().0));
                any |= share.is_some();
                let share = share.unwrap_or(0.0);
                r.saturation_ppm
                    .store((share * 1e6) as u64, Ordering::SeqCst);
                let now = share >= sh.config.saturation_threshold;
                let was = r.saturated.swap(now, Ordering::SeqCst);
                let url = [r.url.as_str()];
                sh.series.saturation.with_label_values(&url).set(share);
                sh.series.saturated.with_label_values(&url).set(now as i64);
                // an open breaker half-opens by time alone: show it as it is now
                r.breaker.admits(std::time::Instant::now());
                r.show_breaker(&sh.series);
                if was && share < sh.config.saturation_threshold {
                    sh.pool.poke();
                }
            }
            // an upstream without metrics is asked again only now and then
            if !any && !silent {
                silent = true;
            }
            if silent && !any {
                tokio::time::sleep(SCRAPE_INTERVAL * 29).await;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_is_kv_use_else_busy_slots_and_full_while_the_engine_queues() {
        let s = parse("vllm:kv_cache_usage_perc{model_name=\"m\"} 0.42\nvllm:num_requests_waiting{model_name=\"m\"} 0\n");
        assert_eq!(share(&s, 8, 0), Some(0.42));
        let s = parse("vllm:kv_cache_usage_perc{model_name=\"m\"} 0.42\nvllm:num_requests_waiting{model_name=\"m\"} 3\n");
        assert_eq!(share(&s, 8, 0), Some(1.0));
        let s = parse("llamacpp:requests_processing 3\nllamacpp:requests_deferred 0\n");
        assert_eq!(share(&s, 4, 0), Some(0.75));
        // abserve's own requests are not another client's load
        assert_eq!(share(&s, 4, 2), Some(0.25));
        let s = parse("sglang:token_usage{model_name=\"m\"} 0.9\n");
        assert_eq!(share(&s, 4, 0), Some(0.9));
        assert_eq!(share(&parse("abserve_running 1\n"), 4, 0), None);
    }
}
