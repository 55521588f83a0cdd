//! Turns a run's rows into its summary: per variant and scorer the mean with a 95% CI, latency
//! percentiles, and against control the paired difference on the rows both answered, with the
//! test that fits the score (paired t, McNemar, sign test for the judge).

use std::collections::BTreeMap;

use abserve_statistics::summarize;
use abserve_statistics::{mcnemar, paired_t, quantile, quantiles, sign_test};
use serde::Serialize;

use crate::config::{Better, EvalConfig, ScoreType, Scorer};
use crate::dataset::{BadRow, Dataset};
use crate::results::{tally, Judgment, ResultRow};

#[derive(Debug, Clone, Serialize)]
pub struct ScoreSummary {
    pub n: usize,
    pub mean: f64,
    pub ci_low: f64,
    pub ci_high: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct VariantSummary {
    pub id: String,
    pub control: bool,
    pub answered: usize,
    pub errors: usize,
    pub latency_p50_ms: f64,
    pub latency_p95_ms: f64,
    pub ttft_p50_ms: f64,
    pub mean_completion_tokens: f64,
    pub scores: BTreeMap<String, ScoreSummary>,
    /// Latencies (ms) of every answer, for the report's distribution chart.
    pub latencies_ms: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub variant: String,
    pub scorer: String,
    pub score_type: ScoreType,
    pub better: Better,
    /// "paired_t", "mcnemar" or "sign".
    pub test: String,
    pub pairs: usize,
    /// Variant − control (mean of paired differences; for the judge, win rate − 0.5).
    pub diff: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    pub p_value: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wins: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub losses: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ties: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub win_rate: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScorerInfo {
    pub name: String,
    pub score_type: ScoreType,
    pub better: Better,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub experiment: String,
    pub control: String,
    pub target: String,
    pub concurrency: usize,
    pub concurrency_source: String,
    pub rows: usize,
    pub variants: Vec<VariantSummary>,
    pub scorers: Vec<ScorerInfo>,
    pub comparisons: Vec<Comparison>,
    pub skipped_rows: Vec<BadRow>,
    pub errors: Vec<String>,
    pub generated_tokens: u64,
    pub wall_seconds: f64,
    pub peak_memory_bytes: Option<u64>,
    /// Share of the judge's replies that picked the answer shown first ("A"): far from 0.5, it
    /// follows the position, not the answers.
    pub judge_chose_first: Option<f64>,
    /// Share of pairs whose two orders gave the same verdict (only those count: `judge.rs`).
    pub judge_agreement: Option<f64>,
}

/// A note on the judge: how often its two orders agreed, and its position bias when strong.
pub fn judge_warning(s: &Summary) -> Option<String> {
    let first = s.judge_chose_first?;
    let agreed = s.judge_agreement.map(|a| {
        format!(
            "The judge's two orders agreed on {:.0}% of pairs; only those verdicts count. ",
            a * 100.0
        )
    });
    let bias = (!(0.2..=0.8).contains(&first)).then(|| format!("It picked the answer shown first in {:.0}% of its replies: it follows the position, not the answers. Use a stronger judge (url/model in the judge scorer).", first * 100.0));
    (agreed.is_some() || bias.is_some())
        .then(|| agreed.unwrap_or_default() + &bias.unwrap_or_default())
}

/// Wilson score interval (95%) of a pass rate: stays inside [0, 1] and is sensible at 0 or n.
pub fn wilson(p: f64, n: usize) -> (f64, f64) {
    if n == 0 || !p.is_finite() {
        return (f64::NAN, f64::NAN);
    }
    let (z, n) = (1.959963984540054f64, n as f64);
    let denom = 1.0 + z * z / n;
    let centre = (p + z * z / (2.0 * n)) / denom;
    let half = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt() / denom;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

fn nan_to(x: f64, d: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        d
    }
}

/// Everything but the run's facts (target, concurrency, timing), which the caller fills in.
/// How the run went, as the caller measured it (the summary carries it into the reports).
#[derive(Debug, Clone, Default)]
pub struct RunFacts {
    pub target: String,
    pub concurrency: usize,
    pub concurrency_source: String,
    pub wall_seconds: f64,
    pub peak_memory_bytes: Option<u64>,
}

type Keyed<T> = BTreeMap<(String, String), T>;

pub fn summarize_run(
    cfg: &EvalConfig,
    ds: &Dataset,
    results: &Keyed<ResultRow>,
    judgments: &Keyed<Judgment>,
    run: RunFacts,
) -> Summary {
    let control = cfg.control().to_string();
    let mut errors = Vec::new();
    let variants = cfg
        .experiment
        .variants
        .iter()
        .map(|v| variant_summary(cfg, ds, results, &v.id, &control, &mut errors))
        .collect();
    let mut comparisons = Vec::new();
    for v in cfg.experiment.variants.iter().filter(|v| v.id != control) {
        for s in &cfg.scorers {
            comparisons.push(compare(s, ds, results, judgments, &v.id, &control));
        }
    }
    Summary {
        experiment: cfg.experiment.name.clone(),
        control,
        target: run.target,
        concurrency: run.concurrency,
        concurrency_source: run.concurrency_source,
        rows: ds.rows.len(),
        variants,
        scorers: cfg
            .scorers
            .iter()
            .map(|s| ScorerInfo {
                name: s.name.clone(),
                score_type: s.score_type(),
                better: s.better(),
            })
            .collect(),
        comparisons,
        skipped_rows: ds.bad.clone(),
        errors,
        generated_tokens: results.values().map(|r| r.completion_tokens).sum(),
        wall_seconds: run.wall_seconds,
        peak_memory_bytes: run.peak_memory_bytes,
        judge_chose_first: crate::judge::position_stats(judgments.values()).0,
        judge_agreement: crate::judge::position_stats(judgments.values()).1,
    }
}

/// One variant's answers, latencies and mean scores; its failed rows go to `errors`.
fn variant_summary(
    cfg: &EvalConfig,
    ds: &Dataset,
    results: &Keyed<ResultRow>,
    id: &str,
    control: &str,
    errors: &mut Vec<String>,
) -> VariantSummary {
    let rs: Vec<&ResultRow> = ds
        .rows
        .iter()
        .filter_map(|r| results.get(&(r.id.clone(), id.to_string())))
        .collect();
    let ok: Vec<&&ResultRow> = rs.iter().filter(|r| r.ok()).collect();
    for r in rs.iter().filter(|r| !r.ok()) {
        errors.push(format!(
            "row {} (line {}) × {}: {}",
            r.row,
            r.line,
            r.variant,
            r.error.as_deref().unwrap_or("no output")
        ));
    }
    let lat: Vec<f64> = ok.iter().filter_map(|r| r.latency_ms).collect();
    let lat_q = quantiles(&lat, &[0.5, 0.95]);
    let ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_ms).collect();
    let toks: Vec<f64> = ok.iter().map(|r| r.completion_tokens as f64).collect();
    let mut scores = BTreeMap::new();
    for s in cfg
        .scorers
        .iter()
        .filter(|s| s.score_type() != ScoreType::Preference)
    {
        let xs: Vec<f64> = ok
            .iter()
            .filter_map(|r| r.scores.get(&s.name).copied())
            .collect();
        let m = summarize(&xs);
        let (lo, hi) = if s.score_type() == ScoreType::Binary {
            wilson(m.mean, m.n)
        } else {
            (nan_to(m.ci_low, m.mean), nan_to(m.ci_high, m.mean))
        };
        scores.insert(
            s.name.clone(),
            ScoreSummary {
                n: m.n,
                mean: m.mean,
                ci_low: lo,
                ci_high: hi,
            },
        );
    }
    VariantSummary {
        id: id.to_string(),
        control: id == control,
        answered: ok.len(),
        errors: rs.len() - ok.len(),
        latency_p50_ms: lat_q[0],
        latency_p95_ms: lat_q[1],
        ttft_p50_ms: quantile(&ttft, 0.5),
        mean_completion_tokens: summarize(&toks).mean,
        scores,
        latencies_ms: lat,
    }
}

/// A judged scorer: the sign test of the variant's wins over control's, with a normal
/// approximation of the win rate's interval among decided pairs.
fn preference(base: Comparison, judgments: &Keyed<Judgment>, id: &str) -> Comparison {
    let (w, l, t) = tally(judgments, id);
    let st = sign_test(w, l, t);
    let n = (w + l) as f64;
    let half = if n > 0.0 {
        1.96 * (st.win_rate * (1.0 - st.win_rate) / n).sqrt()
    } else {
        f64::NAN
    };
    Comparison {
        test: "sign".into(),
        pairs: (w + l + t) as usize,
        diff: st.win_rate - 0.5,
        ci_low: st.win_rate - half - 0.5,
        ci_high: st.win_rate + half - 0.5,
        p_value: st.p_value,
        wins: Some(w),
        losses: Some(l),
        ties: Some(t),
        win_rate: Some(st.win_rate),
        ..base
    }
}

/// Control's and the variant's scores of `s` on every row both answered and both were scored.
fn paired_scores(
    s: &Scorer,
    ds: &Dataset,
    results: &Keyed<ResultRow>,
    id: &str,
    control: &str,
) -> (Vec<f64>, Vec<f64>) {
    let get = |row: &str, v: &str| results.get(&(row.to_string(), v.to_string()));
    let (mut c, mut t) = (Vec::new(), Vec::new());
    for row in &ds.rows {
        let (Some(a), Some(b)) = (get(&row.id, control), get(&row.id, id)) else {
            continue;
        };
        if let (Some(x), Some(y)) = (a.scores.get(&s.name), b.scores.get(&s.name)) {
            if a.ok() && b.ok() {
                c.push(*x);
                t.push(*y);
            }
        }
    }
    (c, t)
}

/// Variant `id` against control on one scorer: a sign test of the judge's verdicts, McNemar
/// for binary scores, a paired t-test otherwise (pairs: rows both answered).
fn compare(
    s: &Scorer,
    ds: &Dataset,
    results: &Keyed<ResultRow>,
    judgments: &Keyed<Judgment>,
    id: &str,
    control: &str,
) -> Comparison {
    let base = Comparison {
        variant: id.to_string(),
        scorer: s.name.clone(),
        score_type: s.score_type(),
        better: s.better(),
        test: String::new(),
        pairs: 0,
        diff: f64::NAN,
        ci_low: f64::NAN,
        ci_high: f64::NAN,
        p_value: f64::NAN,
        wins: None,
        losses: None,
        ties: None,
        win_rate: None,
    };
    if s.score_type() == ScoreType::Preference {
        return preference(base, judgments, id);
    }
    let (c, t) = paired_scores(s, ds, results, id, control);
    let pt = paired_t(&c, &t);
    let n = c.len();
    let mean_diff = if n > 0 {
        t.iter().zip(&c).map(|(y, x)| y - x).sum::<f64>() / n as f64
    } else {
        f64::NAN
    };
    let (lo, hi) = pt
        .map(|p| (p.ci_low, p.ci_high))
        .unwrap_or((mean_diff, mean_diff));
    if s.score_type() == ScoreType::Binary {
        let m = mcnemar(
            &c.iter().map(|x| *x >= 0.5).collect::<Vec<_>>(),
            &t.iter().map(|x| *x >= 0.5).collect::<Vec<_>>(),
        );
        return Comparison {
            test: "mcnemar".into(),
            pairs: n,
            diff: mean_diff,
            ci_low: lo,
            ci_high: hi,
            p_value: m.p_value,
            ..base
        };
    }
    let p = pt
        .map(|p| p.p_value)
        .unwrap_or(if n > 0 { 1.0 } else { f64::NAN });
    Comparison {
        test: "paired_t".into(),
        pairs: n,
        diff: mean_diff,
        ci_low: lo,
        ci_high: hi,
        p_value: p,
        ..base
    }
}

/// The terminal table: one line per variant.
pub fn table(s: &Summary) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
    let mut header = vec![
        "variant".to_string(),
        "answered".into(),
        "p50 ms".into(),
        "p95 ms".into(),
    ];
    for sc in &s.scorers {
        header.push(match sc.score_type {
            ScoreType::Preference => format!("{} win rate", sc.name),
            _ => sc.name.clone(),
        });
    }
    t.set_header(header);
    for v in &s.variants {
        let mut line = vec![
            if v.control {
                format!("{} (control)", v.id)
            } else {
                v.id.clone()
            },
            format!(
                "{}{}",
                v.answered,
                if v.errors > 0 {
                    format!(" ({} errors)", v.errors)
                } else {
                    String::new()
                }
            ),
            format!("{:.0}", v.latency_p50_ms),
            format!("{:.0}", v.latency_p95_ms),
        ];
        for sc in &s.scorers {
            let cmp = s
                .comparisons
                .iter()
                .find(|c| c.variant == v.id && c.scorer == sc.name);
            let cell = match (sc.score_type, v.scores.get(&sc.name)) {
                (ScoreType::Preference, _) => match cmp {
                    Some(c) => format!(
                        "{:.0}% (W{} L{} T{}, {})",
                        c.win_rate.unwrap_or(f64::NAN) * 100.0,
                        c.wins.unwrap_or(0),
                        c.losses.unwrap_or(0),
                        c.ties.unwrap_or(0),
                        p_is(c.p_value)
                    ),
                    None => "—".into(),
                },
                (_, Some(m)) => {
                    let mut cell = format!(
                        "{} [{}, {}]",
                        fmt_num(m.mean),
                        fmt_num(m.ci_low),
                        fmt_num(m.ci_high)
                    );
                    if let Some(c) = cmp {
                        cell.push_str(&format!(
                            "\nΔ {}{} {}",
                            if c.diff >= 0.0 { "+" } else { "" },
                            fmt_num(c.diff),
                            p_is(c.p_value)
                        ));
                    }
                    cell
                }
                (_, None) => "—".into(),
            };
            line.push(cell);
        }
        t.add_row(line);
    }
    t.to_string()
}

pub fn fmt_num(x: f64) -> String {
    if !x.is_finite() {
        "—".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

/// "p=0.123" or "p<0.001".
pub fn p_is(p: f64) -> String {
    let f = fmt_p(p);
    if f.starts_with('<') {
        format!("p{f}")
    } else {
        format!("p={f}")
    }
}

pub fn fmt_p(p: f64) -> String {
    if !p.is_finite() {
        "—".into()
    } else if p < 0.001 {
        "<0.001".into()
    } else {
        format!("{p:.3}")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::config::EvalConfig;
    use crate::dataset::Dataset;
    use crate::results::{Judgment, ResultRow, Verdict};

    #[test]
    fn comparisons_are_paired_on_rows_both_answered() {
        let cfg = EvalConfig::parse(
            "[[experiment]]\nname='t'\n[[experiment.variants]]\nid='c'\n[[experiment.variants]]\nid='v'\n[[scorer]]\ntype='contains'\n[[scorer]]\ntype='length'\n[[scorer]]\ntype='judge'\n",
            std::path::Path::new("."),
        )
        .unwrap();
        let text: String = (0..10)
            .map(|i| format!("{{\"id\": \"r{i}\", \"input\": \"q\", \"expected\": \"x\"}}\n"))
            .collect();
        let ds = Dataset::from_jsonl(&text);
        // control passes rows 0-5, the variant rows 3-9; row 9 of the variant failed outright
        let mut results = BTreeMap::new();
        for i in 0..10 {
            for (v, pass) in [("c", i <= 5), ("v", i >= 3)] {
                let mut r = ResultRow {
                    row: format!("r{i}"),
                    line: i + 1,
                    variant: v.into(),
                    input: "q".into(),
                    expected: Some("x".into()),
                    output: Some("out".into()),
                    prompt_tokens: 1,
                    completion_tokens: 2,
                    ttft_ms: Some(1.0),
                    latency_ms: Some(10.0 * (i + 1) as f64),
                    finish_reason: Some("stop".into()),
                    scores: [
                        ("contains".to_string(), if pass { 1.0 } else { 0.0 }),
                        (
                            "length".to_string(),
                            i as f64 + if v == "v" { 2.0 } else { 0.0 },
                        ),
                    ]
                    .into(),
                    score_errors: Default::default(),
                    error: None,
                    attempts: 1,
                };
                if v == "v" && i == 9 {
                    r.error = Some("boom".into());
                    r.output = None;
                }
                results.insert((r.row.clone(), v.to_string()), r);
            }
        }
        let judgments: BTreeMap<_, _> = (0..9)
            .map(|i| {
                let j = Judgment {
                    row: format!("r{i}"),
                    variant: "v".into(),
                    control: "c".into(),
                    variant_position: if i % 2 == 0 { "A" } else { "B" }.into(),
                    reply: Some("A".into()),
                    reply_swapped: None,
                    verdict: Some(if i % 2 == 0 {
                        Verdict::Win
                    } else {
                        Verdict::Loss
                    }),
                    error: None,
                };
                ((j.row.clone(), j.variant.clone()), j)
            })
            .collect();
        let s = super::summarize_run(&cfg, &ds, &results, &judgments, super::RunFacts::default());
        assert_eq!(s.variants[1].answered, 9);
        assert_eq!(s.variants[1].errors, 1);
        let get = |name: &str| s.comparisons.iter().find(|c| c.scorer == name).unwrap();
        let c = get("contains");
        assert_eq!((c.test.as_str(), c.pairs), ("mcnemar", 9));
        // pairs 0-8: control-only passes rows 0-2, variant-only rows 6-8
        let m = abserve_statistics::mcnemar(
            &[true, true, true, true, true, true, false, false, false],
            &[false, false, false, true, true, true, true, true, true],
        );
        assert_eq!(c.p_value, m.p_value);
        assert!((c.diff - 0.0).abs() < 1e-12);
        let l = get("length");
        assert_eq!(l.test, "paired_t");
        assert!(
            (l.diff - 2.0).abs() < 1e-12 && (l.ci_low - 2.0).abs() < 1e-12,
            "constant difference: no spread"
        );
        let j = get("judge");
        assert_eq!((j.wins, j.losses, j.ties), (Some(5), Some(4), Some(0)));
        assert_eq!(s.judge_chose_first, Some(1.0));
        assert!(super::judge_warning(&s).unwrap().contains("100%"));
    }

    #[test]
    fn wilson_matches_statsmodels() {
        // statsmodels.stats.proportion.proportion_confint(3, 8, method="wilson")
        let (lo, hi) = super::wilson(3.0 / 8.0, 8);
        assert!(
            (lo - 0.13684).abs() < 1e-4 && (hi - 0.69425).abs() < 1e-4,
            "{lo} {hi}"
        );
        let (lo, hi) = super::wilson(0.0, 10);
        assert_eq!(lo, 0.0);
        assert!((hi - 0.27753).abs() < 1e-4, "{hi}");
    }
}
