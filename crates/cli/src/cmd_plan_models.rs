//! `abserve plan` with several `--model`s: the budget divided between them (`models.rs`),
//! each model's plan under its share, and which combinations of the models fit — the naive
//! harness's question one level up (which models can share one device or host).

use abserve_engine::models::{check_all, divide_budget, ModelConfig, Share};
use abserve_engine::plan::{human_bytes, MemoryPlan};
use serde::Serialize;

/// One combination of the models: whether it fits, and each model's sequence slots when it does.
#[derive(Serialize)]
struct Combination {
    models: Vec<String>,
    fits: bool,
    /// Per model (in `models`' order): full-context sequences it can run at once.
    sequences: Vec<u64>,
    /// Why it does not fit, with every number.
    refused: Option<String>,
}

/// Divides and plans `models` (each with the whole budget); Err says why they do not fit.
fn plan_together(mut models: Vec<ModelConfig>) -> Result<(Vec<Share>, Vec<MemoryPlan>), String> {
    let shares = divide_budget(&mut models).map_err(|e| e.to_string())?;
    let plans = check_all(&models).map_err(|e| e.to_string())?;
    Ok((shares, plans))
}

/// Every non-empty subset of the models (at most 6 models: 63 combinations), smallest first.
fn combinations(models: &[ModelConfig]) -> Vec<Combination> {
    let n = models.len().min(6);
    let mut masks: Vec<u32> = (1..(1u32 << n)).collect();
    masks.sort_by_key(|m| (m.count_ones(), *m));
    masks
        .into_iter()
        .map(|mask| {
            let subset: Vec<ModelConfig> = (0..n)
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| models[i].clone())
                .collect();
            let ids = subset.iter().map(|m| m.id.clone()).collect();
            match plan_together(subset) {
                Ok((_, plans)) => Combination {
                    models: ids,
                    fits: true,
                    sequences: plans.iter().map(|p| p.full_context_sequences).collect(),
                    refused: None,
                },
                Err(e) => Combination {
                    models: ids,
                    fits: false,
                    sequences: vec![],
                    refused: Some(e),
                },
            }
        })
        .collect()
}

pub fn run(models: Vec<ModelConfig>, json: bool) -> anyhow::Result<()> {
    let combos = combinations(&models);
    let sources: Vec<String> = models
        .iter()
        .map(|m| m.config.model.display().to_string())
        .collect();
    let ids: Vec<String> = models.iter().map(|m| m.id.clone()).collect();
    let weights: Vec<f64> = models.iter().map(|m| m.share).collect();
    let total: f64 = weights.iter().sum();
    let part = |i: usize| weights[i] / total;
    let together = plan_together(models);
    if json {
        let v = serde_json::json!({
            "models": match &together {
                Ok((shares, plans)) => ids.iter().zip(&sources).zip(shares.iter().zip(plans)).enumerate().map(|(i, ((id, src), (s, p)))| {
                    serde_json::json!({"id": id, "model": src, "share_weight": weights[i],
                        "host_share_bytes": s.host_budget, "device_share_bytes": s.device_budget, "plan": p})
                }).collect::<Vec<_>>(),
                Err(_) => vec![],
            },
            "fits": together.is_ok(),
            "refused": together.as_ref().err(),
            "combinations": combos,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    match &together {
        Ok((shares, plans)) => {
            for (i, ((id, src), (s, p))) in ids
                .iter()
                .zip(&sources)
                .zip(shares.iter().zip(plans))
                .enumerate()
            {
                println!("== model '{id}': its share {}", share_text(s, part(i)));
                let rows = crate::plan_table::host_rows(p, src.clone());
                for (k, v) in rows.into_iter().chain(crate::plan_table::device_rows(p)) {
                    println!("  {k:<26} {v}");
                }
            }
            let planned: u64 = plans.iter().map(|p| p.planned_bytes).sum();
            let budget: u64 = shares.iter().map(|s| s.host_budget + s.device_budget).sum();
            println!(
                "\nall {} models: planned {} of the budget {}; fits: yes",
                ids.len(),
                human_bytes(planned),
                human_bytes(budget)
            );
        }
        Err(e) => println!("all {} models together do NOT fit: {e}", ids.len()),
    }
    println!(
        "\ncombinations (each model's full-context sequences; adapters belong to the first model):"
    );
    for c in &combos {
        let what = if c.fits {
            let each: Vec<String> = c
                .models
                .iter()
                .zip(&c.sequences)
                .map(|(m, n)| format!("{m} {n}"))
                .collect();
            format!("fits: {}", each.join(", "))
        } else {
            format!("NO: {}", c.refused.as_deref().unwrap_or(""))
        };
        println!("  {:<32} {what}", c.models.join(" + "));
    }
    Ok(())
}

/// `part`: the model's fraction of what the fixed parts leave (`--model-share`).
fn share_text(s: &Share, part: f64) -> String {
    let host = format!(
        "{} of host memory ({} weights and adapters + {:.0}% of the rest)",
        human_bytes(s.host_budget),
        human_bytes(s.host_fixed),
        part * 100.0
    );
    if s.device_budget > 0 {
        format!(
            "{host}, {} of the device ({} weights)",
            human_bytes(s.device_budget),
            human_bytes(s.device_fixed)
        )
    } else {
        host
    }
}
