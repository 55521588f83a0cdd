//! `--upstream ID=URL` and `--upstreams FILE`: models served elsewhere, beside the engines of
//! this process in one registry (`serve`, `worker`).

use std::path::PathBuf;
use std::sync::Arc;

use abserve_models::{Entry, Registry, Upstream, UpstreamConfig};
use clap::Args;

#[derive(Args, Debug, Clone, Default)]
pub struct UpstreamArgs {
    /// A model served elsewhere, `ID=URL` (an OpenAI-compatible base URL: vLLM, SGLang, TGI,
    /// llama.cpp's server, Ollama, another abserve, a hosted API): requests and variants name it
    /// by ID. Repeatable; --upstreams takes every other setting (docs/upstreams.md).
    #[arg(long = "upstream")]
    pub upstream: Vec<String>,
    /// A TOML file of `[[upstream]]` tables (several URLs, API keys from the environment or a
    /// file, timeouts, retries, capacity, prices, headers, `protocol = "anthropic"`).
    #[arg(long)]
    pub upstreams: Option<PathBuf>,
}

impl UpstreamArgs {
    pub fn configs(&self) -> anyhow::Result<Vec<UpstreamConfig>> {
        let mut out = vec![];
        for f in &self.upstream {
            out.push(UpstreamConfig::from_flag(f).map_err(anyhow::Error::msg)?);
        }
        if let Some(path) = &self.upstreams {
            out.extend(UpstreamConfig::from_file(path).map_err(anyhow::Error::msg)?);
        }
        Ok(out)
    }

    /// `registry` with every upstream after its models, each connected (its capacity read).
    pub async fn extend(
        &self,
        registry: Registry,
        max_queue: Option<usize>,
    ) -> anyhow::Result<Registry> {
        let mut entries = vec![];
        for c in self.configs()? {
            let id = c.id.clone();
            let u = Upstream::connect(c, max_queue)
                .await
                .map_err(anyhow::Error::msg)?;
            let cap = abserve_models::Model::capacity(&u);
            tracing::info!(
                "upstream '{id}': {} ({}), {} slots, context {}",
                abserve_models::Model::origin(&u),
                u.engine(),
                cap.seq_slots,
                cap.context
            );
            entries.push(Entry {
                id,
                model: Arc::new(u),
            });
        }
        registry.extended(entries).map_err(anyhow::Error::msg)
    }
}
