//! `report.md`: the summary as Markdown, for pull requests and wikis.

use crate::analysis::{fmt_num, fmt_p, Summary};
use crate::config::{Better, ScoreType};

pub fn render(s: &Summary) -> String {
    let mut o = String::new();
    o.push_str(&format!("# Evaluation: {}\n\n", s.experiment));
    o.push_str(&format!(
        "{} rows × {} variants on {} ({} at once, from {}); {} tokens generated; this run took {:.1} s{}.\n\n",
        s.rows,
        s.variants.len(),
        s.target,
        s.concurrency,
        s.concurrency_source,
        s.generated_tokens,
        s.wall_seconds,
        s.peak_memory_bytes.map(|b| format!("; peak memory {}", abserve_engine::plan::human_bytes(b))).unwrap_or_default()
    ));
    variants_table(s, &mut o);
    comparisons_table(s, &mut o);
    if let Some(w) = crate::analysis::judge_warning(s) {
        o.push_str(&format!("\n> **Judge:** {w}\n"));
    }
    if !s.skipped_rows.is_empty() {
        o.push_str("\n## Dataset rows left out\n\n");
        for b in &s.skipped_rows {
            o.push_str(&format!("- line {}: {}\n", b.line, b.reason));
        }
    }
    if !s.errors.is_empty() {
        o.push_str(&format!("\n## Errors ({})\n\n", s.errors.len()));
        for e in s.errors.iter().take(50) {
            o.push_str(&format!("- {e}\n"));
        }
    }
    o
}

/// The variants: answers, errors, latencies, tokens and each plain scorer's mean with its CI.
fn variants_table(s: &Summary, o: &mut String) {
    o.push_str("## Variants\n\n| variant | answered | errors | latency p50 (ms) | latency p95 (ms) | TTFT p50 (ms) | mean tokens |");
    let plain: Vec<_> = s
        .scorers
        .iter()
        .filter(|x| x.score_type != ScoreType::Preference)
        .collect();
    for sc in &plain {
        o.push_str(&format!(" {} (95% CI) |", sc.name));
    }
    o.push_str("\n|---|---:|---:|---:|---:|---:|---:|");
    o.push_str(&"---|".repeat(plain.len()));
    o.push('\n');
    for v in &s.variants {
        o.push_str(&format!(
            "| {}{} | {} | {} | {:.0} | {:.0} | {:.0} | {:.1} |",
            v.id,
            if v.control { " (control)" } else { "" },
            v.answered,
            v.errors,
            v.latency_p50_ms,
            v.latency_p95_ms,
            v.ttft_p50_ms,
            v.mean_completion_tokens
        ));
        for sc in &plain {
            match v.scores.get(&sc.name) {
                Some(m) => o.push_str(&format!(
                    " {} [{}, {}] |",
                    fmt_num(m.mean),
                    fmt_num(m.ci_low),
                    fmt_num(m.ci_high)
                )),
                None => o.push_str(" — |"),
            }
        }
        o.push('\n');
    }
}

/// Each variant against control, paired on the same rows: test, pairs, difference, p-value.
fn comparisons_table(s: &Summary, o: &mut String) {
    o.push_str(&format!(
        "\n## Against control ({}), paired on the same rows\n\n",
        s.control
    ));
    o.push_str("| variant | scorer | test | pairs | difference (95% CI) | p-value | better |\n|---|---|---|---:|---|---:|---|\n");
    for c in &s.comparisons {
        let diff = match c.score_type {
            ScoreType::Preference => format!(
                "win rate {} (W {} / L {} / T {})",
                fmt_num(c.win_rate.unwrap_or(f64::NAN)),
                c.wins.unwrap_or(0),
                c.losses.unwrap_or(0),
                c.ties.unwrap_or(0)
            ),
            _ => format!(
                "{} [{}, {}]",
                fmt_num(c.diff),
                fmt_num(c.ci_low),
                fmt_num(c.ci_high)
            ),
        };
        let better = match c.better {
            Better::Higher => "higher",
            Better::Lower => "lower",
            Better::Neither => "—",
        };
        o.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            c.variant,
            c.scorer,
            c.test,
            c.pairs,
            diff,
            fmt_p(c.p_value),
            better
        ));
    }
}
