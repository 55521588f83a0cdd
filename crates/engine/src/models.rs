//! Several base models in one process (`--model id=path`, repeated): one memory budget divided
//! between them before any of them loads.
//!
//! Each model gets its fixed part — its weights and its adapters, on the host and on the device
//! as its layers are offloaded — and a share of what is left, for its own KV cache, compute
//! buffers and prefix store: equal shares, or in proportion to each model's `share` weight
//! (`--model-share id=N`, default 1). Invariants:
//! - the shares sum to the budget (host and device alike), and every model's plan is made
//!   within its share by the one planner (`plan`), so the models together never exceed the
//!   budget, and the margin is the budget's margin;
//! - a combination whose weights alone do not fit beside the margin is refused here, with every
//!   model's number, before anything is loaded; one that leaves a model no room for a single
//!   sequence is refused by that model's plan (`DoesNotFit`, every number), also before loading.
//!
//! Equal shares of the rest are the default: two models of one A/B test get the same number of
//! sequences only when their KV per token is equal; `abserve plan` shows each model's slots,
//! and weights give a model with more KV per token (or more traffic) the larger part.

use std::sync::Arc;

use crate::config::{EngineConfig, EngineError};
use crate::engine::Engine;
use crate::plan::{human_bytes, Budget, MemoryPlan};

/// A model a process serves: the id requests and variants name it by, and its engine settings.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub id: String,
    pub config: EngineConfig,
    /// Its weight in the division of what the models' fixed parts leave (1 unless set).
    pub share: f64,
}

impl ModelConfig {
    /// `id=path`, or a bare path whose id is the file name without its extension.
    pub fn parse(spec: &str, base: &EngineConfig) -> Result<ModelConfig, String> {
        let (id, path) = match spec.split_once('=') {
            Some((id, path)) => (id.trim().to_string(), path.trim()),
            None => (String::new(), spec.trim()),
        };
        if path.is_empty() {
            return Err(format!("--model '{spec}' names no file"));
        }
        let path = std::path::PathBuf::from(path);
        let id = if id.is_empty() {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "default".into())
        } else {
            id
        };
        if id.starts_with("experiment:") || id == "default" {
            return Err(format!(
                "--model id '{id}' is reserved (`default` names the first model, `experiment:` an experiment)"
            ));
        }
        let mut config = base.clone();
        config.model = path;
        Ok(ModelConfig {
            id,
            config,
            share: 1.0,
        })
    }

    /// Sets the share weights of `specs` (`id=N`, N a positive number) on `models`.
    pub fn set_shares(models: &mut [ModelConfig], specs: &[String]) -> Result<(), String> {
        for spec in specs {
            let (id, n) = spec
                .split_once('=')
                .ok_or_else(|| format!("--model-share '{spec}' is not ID=N"))?;
            let (id, n) = (id.trim(), n.trim());
            let share = n
                .parse::<f64>()
                .ok()
                .filter(|w| w.is_finite() && *w > 0.0)
                .ok_or_else(|| {
                    format!("--model-share {id}: the weight must be a positive number, got '{n}'")
                })?;
            let ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
            let ids = ids.join(", ");
            let m = models.iter_mut().find(|m| m.id == id).ok_or_else(|| {
                format!("--model-share names '{id}', which no --model has (ids: {ids})")
            })?;
            m.share = share;
        }
        Ok(())
    }
}

/// What one model holds of the budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub id: String,
    /// Weights and adapters on the host, and its host budget (fixed part + its share of the
    /// rest).
    pub host_fixed: u64,
    pub host_budget: u64,
    /// The same on the device, when layers are offloaded (0 otherwise).
    pub device_fixed: u64,
    pub device_budget: u64,
}

/// Divides the models' common budget (the first model's `budget` and `device_budget`, which all
/// share) between them, setting each one's budgets in bytes. Reads GGUF headers only.
pub fn divide_budget(models: &mut [ModelConfig]) -> Result<Vec<Share>, EngineError> {
    let Some(first) = models.first() else {
        return Ok(vec![]);
    };
    if models.len() == 1 {
        let (_, p) = first.config.plan()?;
        return Ok(vec![share_of(
            &first.id,
            &p,
            p.budget_bytes,
            device_budget(&p),
        )]);
    }
    let mut ids = std::collections::HashSet::new();
    if let Some(dup) = models.iter().find(|m| !ids.insert(m.id.as_str())) {
        return Err(EngineError::Models(format!(
            "two --model flags name the id '{}'",
            dup.id
        )));
    }
    let probes: Vec<MemoryPlan> = models
        .iter()
        .map(|m| m.config.plan().map(|(_, p)| p))
        .collect::<Result<_, _>>()?;
    // every model was planned under the one budget: its resolved bytes are the process's
    let (host_total, device_total) = (probes[0].budget_bytes, device_budget(&probes[0]));
    let fixed: Vec<Share> = models
        .iter()
        .zip(&probes)
        .map(|(m, p)| share_of(&m.id, p, 0, 0))
        .collect();
    let margin = models[0].config.margin.clamp(0.0, 0.9);
    let check = |total: u64, part: fn(&Share) -> u64, what: &str| {
        let need: u64 = fixed.iter().map(part).sum();
        let usable = total - (total as f64 * margin) as u64;
        if need > usable {
            let each: Vec<String> = fixed
                .iter()
                .map(|s| format!("{} {}", s.id, human_bytes(part(s))))
                .collect();
            return Err(EngineError::Models(format!(
                "the models' weights and adapters need {} of {what} memory ({}), more than the {} usable of the budget {} (margin {:.0}%); drop a model or raise the budget",
                human_bytes(need),
                each.join(", "),
                human_bytes(usable),
                human_bytes(total),
                margin * 100.0
            )));
        }
        Ok(total - need)
    };
    let host_rest = check(host_total, |s| s.host_fixed, "host")?;
    let device_rest = if device_total > 0 {
        check(device_total, |s| s.device_fixed, "device")?
    } else {
        0
    };
    let weights: Vec<f64> = models.iter().map(|m| m.share).collect();
    let host_parts = parts(host_rest, &weights);
    let device_parts = parts(device_rest, &weights);
    let mut shares = Vec::with_capacity(models.len());
    for (i, (m, f)) in models.iter_mut().zip(fixed).enumerate() {
        let s = Share {
            host_budget: f.host_fixed + host_parts[i],
            device_budget: if device_total > 0 {
                f.device_fixed + device_parts[i]
            } else {
                0
            },
            ..f
        };
        m.config.budget = Budget::Bytes(s.host_budget);
        if device_total > 0 {
            m.config.device_budget = Budget::Bytes(s.device_budget);
        }
        shares.push(s);
    }
    Ok(shares)
}

/// `rest` divided in proportion to `weights`, in whole bytes that sum to `rest` (the last part
/// takes what rounding down left).
fn parts(rest: u64, weights: &[f64]) -> Vec<u64> {
    let total: f64 = weights.iter().sum();
    let mut out: Vec<u64> = weights
        .iter()
        .map(|w| (rest as f64 * (w / total)).floor() as u64)
        .collect();
    let given: u64 = out.iter().sum();
    if let Some(last) = out.last_mut() {
        *last += rest.saturating_sub(given);
    }
    out
}

fn device_budget(p: &MemoryPlan) -> u64 {
    p.device.as_ref().map_or(0, |d| d.budget_bytes)
}

/// A model's fixed parts from its plan, with the budgets given.
fn share_of(id: &str, p: &MemoryPlan, host_budget: u64, device_budget: u64) -> Share {
    let device_fixed = p.device.as_ref().map_or(0, |d| d.weights_bytes);
    Share {
        id: id.to_string(),
        host_fixed: (p.weights_bytes + p.adapter_bytes).saturating_sub(device_fixed),
        host_budget,
        device_fixed,
        device_budget,
    }
}

/// Plans every model under its share and refuses, before anything loads, the first that does
/// not fit (its plan's numbers, named by its id).
pub fn check_all(models: &[ModelConfig]) -> Result<Vec<MemoryPlan>, EngineError> {
    models
        .iter()
        .map(|m| {
            let (_, p) = m.config.plan()?;
            p.check_fits().map_err(|e| {
                EngineError::Models(format!("model '{}' does not fit its share: {e}", m.id))
            })?;
            Ok(p)
        })
        .collect()
}

/// Checks every model's plan, then loads each once (`generate`, `eval` in process, `worker`).
pub fn start_all(models: Vec<ModelConfig>) -> Result<Vec<(String, Arc<Engine>)>, EngineError> {
    check_all(&models)?;
    models
        .into_iter()
        .map(|m| Ok((m.id, Arc::new(Engine::start(m.config)?))))
        .collect()
}
