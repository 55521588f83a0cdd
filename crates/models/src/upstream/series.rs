//! The `/metrics` series of one upstream, each with the constant label `model` (its id): the
//! server registers them beside its own (`Model::collectors`). Gauges per replica move as
//! requests are reserved and released, as its saturation is scraped and as its breaker turns.

use abserve_protocol::names;
use prometheus::core::Collector;
use prometheus::{
    Counter, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGaugeVec, Opts,
};

pub struct Series {
    pub in_flight: IntGaugeVec,
    pub tokens: IntGaugeVec,
    pub token_capacity: IntGaugeVec,
    pub seq_slots: IntGaugeVec,
    pub saturation: GaugeVec,
    pub saturated: IntGaugeVec,
    pub breaker: IntGaugeVec,
    pub retries: IntCounter,
    pub errors: IntCounterVec,
    pub spend: Counter,
    pub latency: Histogram,
    pub ttft: Histogram,
}

const BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

impl Series {
    pub fn new(model: &str) -> Series {
        let o = |name: &str, help: &str| Opts::new(name, help).const_label("model", model);
        let h = |name: &str, help: &str| {
            HistogramOpts::new(name, help)
                .const_label("model", model)
                .buckets(BUCKETS.to_vec())
        };
        let url = &["url"];
        // the options are fixed and valid: these constructors fail only on bad names
        let gauge = |name: &str, help: &str| IntGaugeVec::new(o(name, help), url).expect("valid");
        Series {
            in_flight: gauge(
                names::UPSTREAM_REQUESTS_IN_FLIGHT,
                "Requests abserve has running at an upstream replica",
            ),
            tokens: gauge(
                names::UPSTREAM_TOKENS_RESERVED,
                "Tokens (prompt + max_tokens) reserved at an upstream replica",
            ),
            token_capacity: gauge(
                names::UPSTREAM_TOKEN_CAPACITY,
                "An upstream replica's KV capacity in tokens",
            ),
            seq_slots: gauge(
                names::UPSTREAM_SEQ_SLOTS,
                "An upstream replica's sequence slots",
            ),
            saturation: GaugeVec::new(
                o(
                    names::UPSTREAM_SATURATION,
                    "An upstream replica's own saturation, scraped (0 to 1)",
                ),
                url,
            )
            .expect("valid"),
            saturated: gauge(
                names::UPSTREAM_SATURATED,
                "An upstream replica is held back for saturation",
            ),
            breaker: gauge(
                names::UPSTREAM_BREAKER_STATE,
                "An upstream replica's circuit breaker: 0 closed, 1 open, 2 half-open",
            ),
            retries: IntCounter::with_opts(o(
                names::UPSTREAM_RETRIES,
                "Requests sent again to an upstream",
            ))
            .expect("valid"),
            errors: IntCounterVec::new(
                o(names::UPSTREAM_ERRORS, "Failed upstream requests by class"),
                &["class"],
            )
            .expect("valid"),
            spend: Counter::with_opts(o(
                names::UPSTREAM_SPEND,
                "Spend at an upstream at its configured prices",
            ))
            .expect("valid"),
            latency: Histogram::with_opts(h(
                names::UPSTREAM_REQUEST_SECONDS,
                "Upstream requests from admission to their last token",
            ))
            .expect("valid"),
            ttft: Histogram::with_opts(h(
                names::UPSTREAM_TTFT_SECONDS,
                "Upstream requests from admission to their first token",
            ))
            .expect("valid"),
        }
    }

    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.in_flight.clone()),
            Box::new(self.tokens.clone()),
            Box::new(self.token_capacity.clone()),
            Box::new(self.seq_slots.clone()),
            Box::new(self.saturation.clone()),
            Box::new(self.saturated.clone()),
            Box::new(self.breaker.clone()),
            Box::new(self.retries.clone()),
            Box::new(self.errors.clone()),
            Box::new(self.spend.clone()),
            Box::new(self.latency.clone()),
            Box::new(self.ttft.clone()),
        ]
    }
}
