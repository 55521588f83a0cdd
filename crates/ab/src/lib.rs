//! abserve's A/B layer: GrowthBook-compatible assignment and the statistics of results.
//! (Experiments, storage and routing are built on these; see issue 4's note.)

pub mod assign;
pub mod stats;
