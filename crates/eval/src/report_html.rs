//! `report.html`: one self-contained file (inline CSS, SVG and a few lines of JavaScript; no
//! network) with the charts — latency distribution per variant, score bars with 95% CIs, judge
//! win rate against control — and a side-by-side table of every input's outputs with a filter.

use std::collections::BTreeMap;

use minijinja::{context, Environment};
use serde::Serialize;

use crate::analysis::{fmt_num, fmt_p, Summary};
use crate::config::ScoreType;
use crate::dataset::Dataset;
use crate::error::EvalError;
use crate::results::{Judgment, ResultRow};

const TEMPLATE: &str = include_str!("../templates/report.html.j2");
const COLORS: &[&str] = &[
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn color(i: usize) -> &'static str {
    COLORS[i % COLORS.len()]
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.max(1e-9).log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// Box plot (p5–p95 whiskers, quartile box, median line) with every answer as a dot.
fn latency_chart(s: &Summary) -> String {
    let (w, left, row_h) = (720.0, 140.0, 44.0);
    let h = 40.0 + row_h * s.variants.len() as f64;
    let top = s
        .variants
        .iter()
        .flat_map(|v| v.latencies_ms.iter().copied())
        .fold(1.0f64, f64::max);
    let step = nice_step(top / 4.0);
    let max = (top / step).ceil() * step;
    let x = |ms: f64| left + (w - left - 30.0) * ms / max;
    let mut o = format!(
        r#"<svg id="latency-chart" class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="Latency distribution per variant">"#
    );
    let mut tick = 0.0;
    while tick <= max + 1e-9 {
        let label = if max >= 2000.0 {
            format!("{} s", tick / 1e3)
        } else {
            format!("{tick:.0} ms")
        };
        o.push_str(&format!(r##"<line x1="{0:.1}" x2="{0:.1}" y1="10" y2="{1:.1}" stroke="#ddd"/><text x="{0:.1}" y="{2:.1}" font-size="11" text-anchor="middle" fill="#555">{3}</text>"##, x(tick), h - 22.0, h - 8.0, label));
        tick += step;
    }
    for (i, v) in s.variants.iter().enumerate() {
        let cy = 30.0 + row_h * i as f64;
        o.push_str(&format!(
            r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">{}</text>"#,
            left - 8.0,
            cy + 4.0,
            esc(&v.id)
        ));
        if v.latencies_ms.is_empty() {
            continue;
        }
        let c = color(i);
        let [p5, p25, p50, p75, p95] =
            abserve_statistics::quantiles(&v.latencies_ms, &[0.05, 0.25, 0.5, 0.75, 0.95])[..]
        else {
            unreachable!("five quantiles asked")
        };
        o.push_str(&format!(
            r#"<g class="latency-box" data-variant="{}">"#,
            esc(&v.id)
        ));
        o.push_str(&format!(
            r#"<line x1="{:.1}" x2="{:.1}" y1="{cy:.1}" y2="{cy:.1}" stroke="{c}"/>"#,
            x(p5),
            x(p95)
        ));
        o.push_str(&format!(r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="16" fill="{c}" fill-opacity="0.25" stroke="{c}"/>"#, x(p25), cy - 8.0, (x(p75) - x(p25)).max(1.0)));
        o.push_str(&format!(r#"<line x1="{0:.1}" x2="{0:.1}" y1="{1:.1}" y2="{2:.1}" stroke="{c}" stroke-width="3"/>"#, x(p50), cy - 9.0, cy + 9.0));
        for (j, ms) in v.latencies_ms.iter().enumerate() {
            let jitter = ((j * 7919) % 13) as f64 - 6.0;
            o.push_str(&format!(r#"<circle cx="{:.1}" cy="{:.1}" r="2" fill="{c}" fill-opacity="0.6"><title>{:.0} ms</title></circle>"#, x(*ms), cy + 14.0 + jitter * 0.3, ms));
        }
        o.push_str("</g>");
    }
    o.push_str("</svg>");
    o
}

/// One chart per scorer: a bar per variant at its mean, whiskers at the 95% CI.
fn score_charts(s: &Summary) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for sc in s
        .scorers
        .iter()
        .filter(|x| x.score_type != ScoreType::Preference)
    {
        let (w, left, row_h) = (520.0, 140.0, 30.0);
        let h = 30.0 + row_h * s.variants.len() as f64;
        let vals: Vec<_> = s.variants.iter().map(|v| v.scores.get(&sc.name)).collect();
        let hi = vals
            .iter()
            .flatten()
            .map(|m| m.ci_high.max(m.mean))
            .filter(|x| x.is_finite())
            .fold(0.0f64, f64::max);
        let max = if sc.score_type == ScoreType::Binary {
            1.0
        } else {
            (hi * 1.1).max(1e-9)
        };
        let x = |v: f64| left + (w - left - 40.0) * (v / max).clamp(0.0, 1.0);
        let id = format!(
            "score-chart-{}",
            sc.name.replace(
                |c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'),
                "-"
            )
        );
        let mut o = format!(
            r#"<svg id="{id}" class="chart score-chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{} per variant">"#,
            esc(&sc.name)
        );
        for (i, (v, m)) in s.variants.iter().zip(&vals).enumerate() {
            let y = 10.0 + row_h * i as f64;
            o.push_str(&format!(
                r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">{}</text>"#,
                left - 8.0,
                y + 14.0,
                esc(&v.id)
            ));
            let Some(m) = m else { continue };
            if !m.mean.is_finite() {
                continue;
            }
            let c = color(i);
            o.push_str(&format!(r#"<rect class="score-bar" x="{left}" y="{y:.1}" width="{:.1}" height="18" fill="{c}"><title>{}: {} [{}, {}] (n={})</title></rect>"#, (x(m.mean) - left).max(1.0), esc(&v.id), fmt_num(m.mean), fmt_num(m.ci_low), fmt_num(m.ci_high), m.n));
            o.push_str(&format!(r##"<line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#222" stroke-width="1.5"/>"##, x(m.ci_low), x(m.ci_high), y + 9.0, y + 9.0));
            o.push_str(&format!(
                r##"<text x="{:.1}" y="{:.1}" font-size="11" fill="#222">{}</text>"##,
                x(m.ci_high.max(m.mean)) + 4.0,
                y + 13.0,
                fmt_num(m.mean)
            ));
        }
        o.push_str("</svg>");
        out.push((sc.name.clone(), o));
    }
    out
}

/// Win rate of each variant against control among decided pairs, with a 50% line.
fn winrate_chart(s: &Summary) -> Option<String> {
    let rows: Vec<_> = s
        .comparisons
        .iter()
        .filter(|c| c.score_type == ScoreType::Preference)
        .collect();
    if rows.is_empty() {
        return None;
    }
    let (w, left, row_h) = (520.0, 140.0, 30.0);
    let h = 36.0 + row_h * rows.len() as f64;
    let x = |r: f64| left + (w - left - 60.0) * r.clamp(0.0, 1.0);
    let mut o = format!(
        r#"<svg id="winrate-chart" class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="Judge win rate against control">"#
    );
    o.push_str(&format!(r##"<line x1="{0:.1}" x2="{0:.1}" y1="4" y2="{1:.1}" stroke="#999" stroke-dasharray="4 3"/><text x="{0:.1}" y="{2:.1}" font-size="11" text-anchor="middle" fill="#555">50%</text>"##, x(0.5), h - 18.0, h - 6.0));
    for (i, c) in rows.iter().enumerate() {
        let y = 6.0 + row_h * i as f64;
        let wr = c.win_rate.unwrap_or(f64::NAN);
        o.push_str(&format!(
            r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">{}</text>"#,
            left - 8.0,
            y + 14.0,
            esc(&c.variant)
        ));
        if !wr.is_finite() {
            continue;
        }
        let col = if wr >= 0.5 { "#59a14f" } else { "#e15759" };
        o.push_str(&format!(r#"<rect class="winrate-bar" x="{left}" y="{y:.1}" width="{:.1}" height="18" fill="{col}"><title>{}: wins {}, losses {}, ties {}, p={}</title></rect>"#, (x(wr) - left).max(1.0), esc(&c.variant), c.wins.unwrap_or(0), c.losses.unwrap_or(0), c.ties.unwrap_or(0), fmt_p(c.p_value)));
        if c.ci_low.is_finite() {
            o.push_str(&format!(
                r##"<line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#222"/>"##,
                x(c.ci_low + 0.5),
                x(c.ci_high + 0.5),
                y + 9.0,
                y + 9.0
            ));
        }
        o.push_str(&format!(
            r##"<text x="{:.1}" y="{:.1}" font-size="11">{:.0}%</text>"##,
            x(wr.max(c.ci_high + 0.5)) + 4.0,
            y + 13.0,
            wr * 100.0
        ));
    }
    o.push_str("</svg>");
    Some(o)
}

#[derive(Serialize)]
struct Cell {
    variant: String,
    output: String,
    error: Option<String>,
    scores: Vec<(String, String, bool)>,
    verdict: Option<String>,
    latency_ms: String,
}

#[derive(Serialize)]
struct TableRow {
    id: String,
    line: usize,
    input: String,
    expected: Option<String>,
    cells: Vec<Cell>,
    any_fail: bool,
}

/// One table row per dataset row: every variant's answer, scores (binary ones pass or fail),
/// verdict and latency.
fn table_rows(
    s: &Summary,
    ds: &Dataset,
    results: &BTreeMap<(String, String), ResultRow>,
    judgments: &BTreeMap<(String, String), Judgment>,
) -> Vec<TableRow> {
    let binary: Vec<&str> = s
        .scorers
        .iter()
        .filter(|x| x.score_type == ScoreType::Binary)
        .map(|x| x.name.as_str())
        .collect();
    let mut rows = Vec::new();
    for r in &ds.rows {
        let mut cells = Vec::new();
        let mut any_fail = false;
        for v in &s.variants {
            let res = results.get(&(r.id.clone(), v.id.clone()));
            let scores: Vec<(String, String, bool)> = res
                .map(|x| {
                    x.scores
                        .iter()
                        .map(|(k, val)| {
                            let pass = !binary.contains(&k.as_str()) || *val >= 0.5;
                            (k.clone(), fmt_num(*val), pass)
                        })
                        .collect()
                })
                .unwrap_or_default();
            any_fail |= scores.iter().any(|(_, _, p)| !p) || res.is_some_and(|x| !x.ok());
            cells.push(Cell {
                variant: v.id.clone(),
                output: res.and_then(|x| x.output.clone()).unwrap_or_default(),
                error: res.map_or(Some("not run".into()), |x| x.error.clone()),
                scores,
                verdict: judgments
                    .get(&(r.id.clone(), v.id.clone()))
                    .and_then(|j| j.verdict)
                    .map(|v| format!("{v:?}").to_lowercase()),
                latency_ms: res
                    .and_then(|x| x.latency_ms)
                    .map(|l| format!("{l:.0}"))
                    .unwrap_or_default(),
            });
        }
        rows.push(TableRow {
            id: r.id.clone(),
            line: r.line,
            input: r.input().into(),
            expected: r.expected(),
            cells,
            any_fail,
        });
    }
    rows
}

pub fn render(
    s: &Summary,
    ds: &Dataset,
    results: &BTreeMap<(String, String), ResultRow>,
    judgments: &BTreeMap<(String, String), Judgment>,
) -> Result<String, EvalError> {
    let rows = table_rows(s, ds, results, judgments);
    let mut env = Environment::new();
    env.add_template("report.html", TEMPLATE)
        .map_err(|e| EvalError::Report(e.to_string()))?;
    let comparisons: Vec<_> = s
        .comparisons
        .iter()
        .map(|c| {
            let diff = match c.score_type {
                ScoreType::Preference => format!("win rate {}", fmt_num(c.win_rate.unwrap_or(f64::NAN))),
                _ => format!("{} [{}, {}]", fmt_num(c.diff), fmt_num(c.ci_low), fmt_num(c.ci_high)),
            };
            context! { variant => c.variant, scorer => c.scorer, test => c.test, pairs => c.pairs, diff => diff, p => fmt_p(c.p_value), significant => c.p_value < 0.05 }
        })
        .collect();
    let variants: Vec<_> = s
        .variants
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let scores: Vec<_> = s
                .scorers
                .iter()
                .filter(|x| x.score_type != ScoreType::Preference)
                .map(|x| v.scores.get(&x.name).map(|m| format!("{} [{}, {}]", fmt_num(m.mean), fmt_num(m.ci_low), fmt_num(m.ci_high))).unwrap_or("—".into()))
                .collect();
            context! { id => v.id, control => v.control, answered => v.answered, errors => v.errors, p50 => format!("{:.0}", v.latency_p50_ms), p95 => format!("{:.0}", v.latency_p95_ms), ttft => format!("{:.0}", v.ttft_p50_ms), tokens => format!("{:.1}", v.mean_completion_tokens), scores => scores, color => color(i) }
        })
        .collect();
    let plain_scorers: Vec<&str> = s
        .scorers
        .iter()
        .filter(|x| x.score_type != ScoreType::Preference)
        .map(|x| x.name.as_str())
        .collect();
    env.get_template("report.html")
        .and_then(|t| {
            t.render(context! {
                s => s,
                variants => variants,
                plain_scorers => plain_scorers,
                comparisons => comparisons,
                latency_chart => minijinja::Value::from_safe_string(latency_chart(s)),
                score_charts => score_charts(s).into_iter().map(|(n, svg)| (n, minijinja::Value::from_safe_string(svg))).collect::<Vec<_>>(),
                winrate_chart => winrate_chart(s).map(minijinja::Value::from_safe_string),
                rows => rows,
                memory => s.peak_memory_bytes.map(abserve_engine::plan::human_bytes),
                judge_warning => crate::analysis::judge_warning(s),
                wall => format!("{:.1}", s.wall_seconds),
            })
        })
        .map_err(|e| EvalError::Report(e.to_string()))
}
