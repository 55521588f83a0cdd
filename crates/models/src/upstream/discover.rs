//! What an upstream says about itself at start: which engine it is, its sequence slots, its KV
//! capacity in tokens and the context of one request, where it says them, and how its prompts
//! are counted:
//!
//! | engine | where | slots | tokens | context | counting |
//! |---|---|---|---|---|---|
//! | llama.cpp's server | `GET /props` | `total_slots` | slots × `n_ctx` | `default_generation_settings.n_ctx` | `/apply-template` + `/tokenize` |
//! | abserve | `GET /ready` | `plan.seq_slots` | `plan.kv_cells` | `plan.context` | upper bound |
//! | SGLang | `GET /get_server_info` | `max_running_requests` | `max_total_num_tokens` | `context_length` | upper bound |
//! | TGI | `GET /info` | `max_concurrent_requests` | `max_batch_total_tokens` | `max_total_tokens` | upper bound |
//! | vLLM | `GET /metrics` (`vllm:cache_config_info`) | configured | `num_gpu_blocks` × `block_size` | `/v1/models` `max_model_len` | `POST /tokenize` |
//! | anything else | — | configured | configured | configured | upper bound |
//!
//! A configured value lowers what the upstream says, never raises it. The upper bound for a
//! prompt abserve cannot count there ([`bound`]): one token per UTF-8 byte of every message
//! (no tokenizer in use maps fewer than one byte to a token of text) plus 16 tokens per message
//! for its template's markers.

use serde_json::{json, Value};

use super::pool::Limits;
use super::UpstreamConfig;

/// How prompts are counted at an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// llama.cpp's `/apply-template` then `/tokenize`.
    LlamaCpp,
    /// vLLM's `/tokenize` with the messages.
    Vllm,
    /// [`bound`].
    Bound,
}

/// What the upstream is, as found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub engine: &'static str,
    pub limits: Limits,
    pub counting: Counting,
    /// The context of a request was said by the upstream or configured (else it is
    /// [`DEFAULT_CONTEXT`], a guess: an unset `max_tokens` is then left to the upstream).
    pub context_known: bool,
}

/// Requests at once at an upstream that says nothing and is not configured (a hosted API).
pub const DEFAULT_CONCURRENCY: usize = 64;
/// Context of a request at an upstream that says nothing and is not configured.
pub const DEFAULT_CONTEXT: usize = 128 * 1024;

/// Template tokens counted per message by [`bound`].
pub const PER_MESSAGE: usize = 16;

/// The upper bound on a prompt's tokens where the upstream cannot count them.
pub fn bound<'a>(texts: impl Iterator<Item = &'a str>) -> usize {
    texts.map(|t| t.len() + PER_MESSAGE).sum::<usize>() + PER_MESSAGE
}

/// The URL without a trailing `/v1` (where llama.cpp, SGLang and TGI serve their own routes).
pub fn root(url: &str) -> String {
    let u = url.trim_end_matches('/');
    u.strip_suffix("/v1").unwrap_or(u).to_string()
}

/// The OpenAI-style base (`…/v1`).
pub fn base(url: &str) -> String {
    format!("{}/v1", root(url))
}

async fn get_json(http: &reqwest::Client, url: String) -> Option<Value> {
    let r = http.get(url).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

async fn post_json(http: &reqwest::Client, url: String, body: &Value) -> Option<Value> {
    let r = http.post(url).json(body).send().await.ok()?;
    r.error_for_status().ok()?.json().await.ok()
}

fn num(v: &Value, path: &[&str]) -> Option<usize> {
    let mut v = v;
    for p in path {
        v = v.get(p)?;
    }
    v.as_u64().map(|n| n as usize).filter(|&n| n > 0)
}

/// Reads what the upstream says about itself (see the module's table).
pub async fn discover(http: &reqwest::Client, url: &str, model: &str, c: &UpstreamConfig) -> Found {
    let root = root(url);
    let said = said(http, &root, model).await;
    let (engine, seqs, tokens, context, counting) =
        said.unwrap_or(("openai-compatible", None, None, None, Counting::Bound));
    let lower = |said: Option<usize>, conf: Option<usize>, default: usize| match (said, conf) {
        (Some(s), Some(c)) => s.min(c),
        (Some(s), None) => s,
        (None, Some(c)) => c,
        (None, None) => default,
    };
    let context_known = context.is_some() || c.context.is_some();
    let seqs = lower(seqs, c.max_concurrency, DEFAULT_CONCURRENCY);
    let context = lower(context, c.context, DEFAULT_CONTEXT);
    let tokens = lower(tokens, c.token_capacity, seqs.saturating_mul(context));
    Found {
        engine,
        limits: Limits {
            seqs,
            tokens,
            context: context.min(tokens),
        },
        counting,
        context_known,
    }
}

type Said = (
    &'static str,
    Option<usize>,
    Option<usize>,
    Option<usize>,
    Counting,
);

async fn said(http: &reqwest::Client, root: &str, model: &str) -> Option<Said> {
    if let Some(p) = get_json(http, format!("{root}/props")).await {
        if let Some(slots) = num(&p, &["total_slots"]) {
            let ctx = num(&p, &["default_generation_settings", "n_ctx"]);
            let counting = match counts_like_llama_cpp(http, root).await {
                true => Counting::LlamaCpp,
                false => Counting::Bound,
            };
            return Some((
                "llama.cpp",
                Some(slots),
                ctx.map(|c| c * slots),
                ctx,
                counting,
            ));
        }
    }
    if let Some(r) = get_json(http, format!("{root}/ready")).await {
        if let Some(slots) = num(&r, &["plan", "seq_slots"]) {
            let cells = num(&r, &["plan", "kv_cells"]);
            let ctx = num(&r, &["plan", "context"]);
            return Some(("abserve", Some(slots), cells, ctx, Counting::Bound));
        }
    }
    if let Some(s) = get_json(http, format!("{root}/get_server_info")).await {
        if let Some(tokens) = num(&s, &["max_total_num_tokens"]) {
            let seqs = num(&s, &["max_running_requests"]);
            let ctx = num(&s, &["context_length"]);
            return Some(("sglang", seqs, Some(tokens), ctx, Counting::Bound));
        }
    }
    if let Some(i) = get_json(http, format!("{root}/info")).await {
        if let Some(tokens) = num(&i, &["max_batch_total_tokens"]) {
            let seqs = num(&i, &["max_concurrent_requests"]);
            let ctx = num(&i, &["max_total_tokens"]);
            return Some(("tgi", seqs, Some(tokens), ctx, Counting::Bound));
        }
    }
    let metrics = http.get(format!("{root}/metrics")).send().await.ok()?;
    let text = metrics.text().await.ok()?;
    let tokens = vllm_capacity(&text)?;
    let models = get_json(http, format!("{root}/v1/models")).await;
    let ctx = models.as_ref().and_then(|m| {
        m["data"]
            .as_array()?
            .iter()
            .find(|d| d["id"] == model)
            .and_then(|d| num(d, &["max_model_len"]))
    });
    Some(("vllm", None, Some(tokens), ctx, Counting::Vllm))
}

async fn counts_like_llama_cpp(http: &reqwest::Client, root: &str) -> bool {
    let r = http
        .post(format!("{root}/apply-template"))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await;
    matches!(r, Ok(r) if r.status().is_success())
}

/// vLLM's KV capacity from its `vllm:cache_config_info` series: GPU blocks × block size.
pub fn vllm_capacity(metrics: &str) -> Option<usize> {
    let line = metrics
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))?;
    let label = |name: &str| -> Option<usize> {
        let at = line.find(&format!("{name}=\""))? + name.len() + 2;
        let end = line[at..].find('"')? + at;
        line[at..end].parse().ok()
    };
    Some(label("num_gpu_blocks")? * label("block_size")?)
}

/// Counts a prompt at the upstream (`None` when it cannot: the caller uses [`bound`]).
pub async fn count(
    http: &reqwest::Client,
    url: &str,
    counting: Counting,
    model: &str,
    messages: &Value,
) -> Option<usize> {
    let root = root(url);
    match counting {
        Counting::Bound => None,
        Counting::LlamaCpp => {
            let body = json!({"messages": messages});
            let t = post_json(http, format!("{root}/apply-template"), &body).await?;
            let prompt = t["prompt"].as_str()?;
            let body = json!({"content": prompt, "add_special": true, "parse_special": true});
            let t = post_json(http, format!("{root}/tokenize"), &body).await?;
            Some(t["tokens"].as_array()?.len())
        }
        Counting::Vllm => {
            let body = json!({"model": model, "messages": messages});
            let t = post_json(http, format!("{root}/tokenize"), &body).await?;
            num(&t, &["count"])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_capacity_is_blocks_times_block_size() {
        // as vLLM 0.10 writes it
        let m = "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\",num_gpu_blocks=\"27548\",num_gpu_blocks_override=\"None\",sliding_window=\"None\",swap_space_bytes=\"4294967296\"} 1.0\n";
        assert_eq!(vllm_capacity(m), Some(27548 * 16));
        assert_eq!(vllm_capacity("vllm:num_requests_waiting 0\n"), None);
    }

    #[test]
    fn roots_and_bases() {
        assert_eq!(root("http://h:8/v1/"), "http://h:8");
        assert_eq!(base("http://h:8"), "http://h:8/v1");
        assert_eq!(
            base("https://api.openai.com/v1"),
            "https://api.openai.com/v1"
        );
    }

    #[test]
    fn the_bound_is_never_below_the_bytes() {
        let b = bound(["héllo", "world"].into_iter());
        assert_eq!(b, 6 + 5 + 3 * PER_MESSAGE);
    }
}
