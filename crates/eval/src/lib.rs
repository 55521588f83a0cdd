//! `abserve eval`: offline A/B runs. Every variant of an experiment answers every row of a
//! dataset on one shared model (in-process engine or any OpenAI-compatible endpoint), results
//! stream to a resumable JSONL file, scorers grade each answer, paired statistics compare each
//! variant with control, and the outcome is written as a terminal table, JSON, Markdown and a
//! self-contained HTML report.

pub mod analysis;
pub mod config;
pub mod dataset;
pub mod judge;
pub mod progress;
pub mod report_html;
pub mod report_md;
pub mod results;
pub mod runner;
pub mod scorers;
pub mod target;
