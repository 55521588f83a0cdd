//! Step-time model for the inter-token-latency target (`--max-itl-ms`).
//!
//! Decode-only steps are timed per number of sequences in the batch (an exponential moving
//! average per count) and a line `t(n) = a + b·n` is fitted through those averages. Admitting one
//! more decoding sequence is refused when the predicted step time passes the target AND the
//! predicted throughput gain `((n+1)/t(n+1)) / (n/t(n))` is under 5%: more sequences than that
//! only stretch every stream's inter-token latency for no extra tokens per second. Until two
//! different counts have been measured the model allows everything (it must see to predict).

use std::time::Duration;

const ALPHA: f64 = 0.2;
/// Throughput gain below which a longer step is not worth it.
const MIN_GAIN: f64 = 1.05;

#[derive(Debug, Default)]
pub(super) struct StepModel {
    /// EMA of the step seconds, indexed by decode batch size.
    ema: Vec<Option<f64>>,
}

impl StepModel {
    pub fn observe(&mut self, n: usize, dt: Duration) {
        if n == 0 {
            return;
        }
        if self.ema.len() <= n {
            self.ema.resize(n + 1, None);
        }
        let t = dt.as_secs_f64();
        let e = &mut self.ema[n];
        *e = Some(e.map_or(t, |old| old + ALPHA * (t - old)));
    }

    /// Least-squares line through the per-count averages; None with fewer than two counts.
    fn line(&self) -> Option<(f64, f64)> {
        let pts: Vec<(f64, f64)> = self
            .ema
            .iter()
            .enumerate()
            .filter_map(|(n, e)| e.map(|t| (n as f64, t)))
            .collect();
        if pts.len() < 2 {
            return None;
        }
        let k = pts.len() as f64;
        let mx = pts.iter().map(|p| p.0).sum::<f64>() / k;
        let my = pts.iter().map(|p| p.1).sum::<f64>() / k;
        let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let b = (sxy / sxx).max(0.0);
        Some((my - b * mx, b))
    }

    pub fn predict(&self, n: usize) -> Option<f64> {
        if let Some(Some(t)) = self.ema.get(n) {
            return Some(*t);
        }
        self.line().map(|(a, b)| (a + b * n as f64).max(1e-6))
    }

    /// What one more row in a step of `n` decoding sequences costs, as a share of the time per
    /// token of that step: the line's slope over t(n)/n (`None` until two sizes are measured).
    /// A draft token is worth its row only if it is accepted with at least this probability.
    pub fn row_share(&self, n: usize) -> Option<f64> {
        let (_, b) = self.line()?;
        let t = self.predict(n.max(1))?;
        Some(b * n.max(1) as f64 / t)
    }

    /// May a batch of `n` decoding sequences become `n + 1` under `target`?
    pub fn allows_one_more(&self, n: usize, target: Duration) -> bool {
        if n == 0 {
            return true;
        }
        let (Some(now), Some(next)) = (self.predict(n), self.predict(n + 1)) else {
            return true;
        };
        if next <= target.as_secs_f64() {
            return true;
        }
        let gain = ((n + 1) as f64 / next) / (n as f64 / now);
        gain >= MIN_GAIN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_only_when_the_step_passes_the_target_and_throughput_is_flat() {
        let mut m = StepModel::default();
        let ms = Duration::from_millis;
        assert!(m.allows_one_more(4, ms(10)), "nothing measured: explore");
        // 2 cores: a fixed cost plus a per-sequence cost that dominates (throughput saturates)
        for n in [1usize, 2, 4, 8] {
            for _ in 0..10 {
                m.observe(n, Duration::from_secs_f64(0.004 + 0.006 * n as f64));
            }
        }
        assert!(
            m.allows_one_more(1, ms(60)),
            "2 sequences: 16 ms, under the target"
        );
        assert!(
            m.allows_one_more(8, ms(60)),
            "9 sequences: 58 ms, under the target"
        );
        assert!(
            !m.allows_one_more(9, ms(60)),
            "10 sequences: 64 ms and only 1% more tokens/s"
        );
        // a step dominated by a fixed cost: one more sequence is nearly free throughput
        let mut g = StepModel::default();
        for n in [1usize, 2, 4] {
            g.observe(n, Duration::from_secs_f64(0.080 + 0.001 * n as f64));
        }
        assert!(
            g.allows_one_more(4, ms(60)),
            "over the target but +24% tokens/s"
        );
        // a row's cost against a token's time: 6 of 10 ms alone, 48 of 52 ms with 8
        assert!((m.row_share(1).unwrap() - 0.6).abs() < 1e-6);
        assert!((m.row_share(8).unwrap() - 48.0 / 52.0).abs() < 1e-6);
        assert_eq!(StepModel::default().row_share(1), None);
    }
}
