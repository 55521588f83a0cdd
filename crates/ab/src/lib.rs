//! abserve's A/B layer: experiment definitions, GrowthBook-compatible assignment, durable
//! storage of exposures and outcome events, and the statistics of results. No HTTP here.

pub mod assign;
pub mod experiment;
pub mod paired;
pub mod stats;
pub mod variant;
pub mod store;
