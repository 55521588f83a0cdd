//! `abserve experiments`: read experiments and their results straight from the store
//! (`--store`, or the SQLite file in `--data-dir`), with or without a running server.

use std::path::PathBuf;

use abserve_ab::Store;
use abserve_protocol::location::Location;
use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub struct ExperimentsArgs {
    /// Where `abserve serve` keeps experiments, exposures and events.
    #[arg(long, default_value = "abserve-data", global = true)]
    pub data_dir: PathBuf,
    /// The store `abserve serve --store` uses (postgres://…, sqlite://FILE or a directory).
    #[arg(long, env = "ABSERVE_STORE", hide_env_values = true, global = true)]
    pub store: Option<String>,
    #[command(subcommand)]
    pub command: ExperimentsCommand,
}

#[derive(Subcommand, Debug)]
pub enum ExperimentsCommand {
    /// List the stored experiments.
    List,
    /// Per-variant results with statistics against the control.
    Results {
        name: String,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Automatic metrics (latency, tokens, errors) one observation per request instead of
        /// per unit (units are what is randomised: the per-unit analysis is the default).
        #[arg(long)]
        per_request: bool,
    },
    /// Create the experiments of a TOML file (as `serve --experiments` reads): sent to a server
    /// with --url (which checks every variant against its model), else written into the store.
    Create {
        file: PathBuf,
        /// A running server (http://host:port): it checks and stores them.
        #[arg(long)]
        url: Option<String>,
        #[arg(long, env = "ABSERVE_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// Replace experiments of the same name instead of refusing them.
        #[arg(long)]
        replace: bool,
    },
    /// Delete an experiment from the store (its exposures and events stay).
    Delete { name: String },
    /// Write an experiment's sampled conversations as a dataset `abserve eval` takes as it is
    /// (JSON lines: id, input, unit, variant, sampled_answer), newest first.
    Samples {
        name: String,
        /// The dataset file to write.
        #[arg(long)]
        out: PathBuf,
        /// Only this variant's samples.
        #[arg(long)]
        variant: Option<String>,
    },
}

pub fn run(a: ExperimentsArgs) -> anyhow::Result<()> {
    let at = crate::args::store_location(a.store.as_deref(), &a.data_dir)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let ExperimentsCommand::Create {
        file,
        url,
        api_key,
        replace,
    } = a.command
    {
        // creating makes the store when there is none yet
        let c = crate::cmd_experiments_create::Create {
            file,
            url,
            api_key,
            replace,
        };
        let store = async { Ok(Store::connect(&at).await?) };
        return rt.block_on(crate::cmd_experiments_create::create(c, store));
    }
    if let Location::Sqlite(f) = &at {
        if !f.exists() {
            anyhow::bail!(
                "no abserve store at {} (start `abserve serve --data-dir {}` first)",
                f.display(),
                a.data_dir.display()
            );
        }
    }
    rt.block_on(show(a.command, at))
}

async fn show(command: ExperimentsCommand, at: Location) -> anyhow::Result<()> {
    let store = Store::connect(&at).await?;
    match command {
        ExperimentsCommand::List => {
            for e in store.experiments().await? {
                let ids: Vec<&str> = e.variants.iter().map(|v| v.id.as_str()).collect();
                println!("{:<24} {:?} variants: {}", e.name, e.status, ids.join(", "));
            }
        }
        ExperimentsCommand::Results {
            name,
            json,
            per_request,
        } => {
            let e = store
                .experiment(&name)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no experiment named '{name}'"))?;
            let analysis = if per_request {
                abserve_ab::Analysis::Request
            } else {
                abserve_ab::Analysis::Unit
            };
            let r = store.results_by(&e, analysis).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
                return Ok(());
            }
            print!("{}", table(&r));
        }
        ExperimentsCommand::Delete { name } => {
            crate::cmd_experiments_create::delete(store, &name).await?
        }
        ExperimentsCommand::Samples { name, out, variant } => {
            export_samples(&store, &name, &out, variant).await?
        }
        ExperimentsCommand::Create { .. } => anyhow::bail!("create is run by `run`"),
    }
    Ok(())
}

/// Writes every sample of `name` (of `variant`) to `out` as dataset rows; says how many.
async fn export_samples(
    store: &Store,
    name: &str,
    out: &std::path::Path,
    variant: Option<String>,
) -> anyhow::Result<()> {
    if store.experiment(name).await?.is_none() {
        anyhow::bail!("no experiment named '{name}'");
    }
    let q = abserve_ab::SampleQuery {
        variant,
        ..Default::default()
    };
    let (text, n) = store.dataset(name, &q).await?;
    std::fs::write(out, text)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", out.display()))?;
    eprintln!("{n} samples of '{name}' written to {}", out.display());
    Ok(())
}

/// The results as text: per variant and metric the summary, then against control the
/// fixed-horizon test, the always-valid sequence, the Bayesian read-out and, when more than one
/// comparison is made, the adjusted p-values. The same numbers as `--json` and the API.
pub fn table(r: &abserve_ab::Results) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "experiment {} (control: {}); one observation per {}; {:.0}% intervals; sequential tuning {} units; {} comparisons",
        r.experiment,
        r.control,
        match r.analysis {
            abserve_ab::Analysis::Unit => "unit",
            abserve_ab::Analysis::Request => "request",
        },
        (1.0 - r.alpha) * 100.0,
        r.sequential_tuning,
        r.comparisons
    );
    if let Some(s) = &r.srm {
        let flag = if s.mismatch {
            "  ** MISMATCH: check assignment and logging **"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "sample ratio: chi2 {:.3}, p {:.4}{flag}",
            s.chi2, s.p_value
        );
    }
    if let Some(b) = &r.bandit {
        bandit_lines(&mut out, b);
    }
    for v in &r.variants {
        let control = if v.is_control { " (control)" } else { "" };
        let _ = writeln!(
            out,
            "\n{}{control}: weight {:.3}, {} units, {} exposures",
            v.id, v.weight, v.units, v.exposures
        );
        for (m, res) in &v.metrics {
            metric_lines(&mut out, m, res);
        }
    }
    out
}

/// A bandit's arms (period-weighted estimate, chance of being best, weight) and its winner.
fn bandit_lines(out: &mut String, b: &abserve_statistics::BanditResults) {
    use std::fmt::Write;
    let _ = writeln!(
        out,
        "bandit on {}: {} weight updates; {}",
        b.decision_metric,
        b.periods,
        match &b.winner {
            Some(w) => format!("winner {} at {} units", w.variant, w.units),
            None => "no winner yet".into(),
        }
    );
    for a in &b.arms {
        let cost = a
            .cost
            .map(|c| format!("  cost {:.6} ± {:.6}", c.mean, c.variance.sqrt()))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:<18} estimate {:>10.4} ± {:.4}  units {:>6}  chance best {:>5.1}%  weight {:>5.1}%{cost}",
            a.variant,
            a.estimate.mean,
            a.estimate.variance.sqrt(),
            a.estimate.units,
            a.chance_best * 100.0,
            a.weight * 100.0
        );
    }
}

/// A treatment's CUPED read-out: the adjusted difference, its interval and p, θ and the
/// variance removed.
fn cuped_line(out: &mut String, c: &abserve_statistics::Cuped) {
    use std::fmt::Write;
    let w = c.vs_control.as_ref();
    let _ = writeln!(
        out,
        "    CUPED           diff {:+.4}  CI [{:.4}, {:.4}]  p {:.4}  theta {:.4}  variance -{:.1}%",
        c.mean - c.control_mean,
        w.map_or(f64::NAN, |w| w.ci_low),
        w.map_or(f64::NAN, |w| w.ci_high),
        w.map_or(f64::NAN, |w| w.p_value),
        c.theta,
        c.variance_reduction * 100.0
    );
}

/// One variant's lines for metric `m`: its summary, then against control whatever was computed.
fn metric_lines(out: &mut String, m: &str, res: &abserve_ab::MetricResult) {
    use std::fmt::Write;
    let pct = |x: f64| x * 100.0;
    let s = &res.summary;
    let ratio = res
        .ratio
        .as_ref()
        .map(|q| format!("  ({} / {})", q.numerator, q.denominator))
        .unwrap_or_default();
    // a defined metric: its aggregation, direction and cap
    let ratio = match &res.definition {
        Some(d) => format!(
            "{ratio}  ({} per unit, {} is better{})",
            format!("{:?}", d.aggregation).to_lowercase(),
            match d.direction {
                abserve_statistics::Direction::Higher => "higher",
                abserve_statistics::Direction::Lower => "lower",
            },
            res.cap_value
                .map(|c| format!(", capped at {c:.4}"))
                .unwrap_or_default()
                + if d.cuped { ", CUPED" } else { "" }
        ),
        None => ratio,
    };
    let _ = writeln!(
        out,
        "  {m:<18} n {:>6}  mean {:>11.4}  sd {:>10.4}  CI [{:.4}, {:.4}]{ratio}",
        s.n, s.mean, s.sd, s.ci_low, s.ci_high
    );
    if let Some(c) = &res.vs_control {
        let _ = writeln!(
            out,
            "    fixed horizon   diff {:+.4} ({:+.2}%)  CI [{:.4}, {:.4}]  p {:.4}",
            c.diff,
            pct(c.relative_lift),
            c.ci_low,
            c.ci_high,
            c.p_value
        );
    }
    if let Some(q) = &res.sequential {
        let _ = writeln!(
            out,
            "    sequential      diff {:+.4}  CS [{:.4}, {:.4}]  always-valid p {:.4}",
            q.diff, q.ci_low, q.ci_high, q.p_value
        );
    }
    if let Some(b) = &res.bayesian {
        let _ = writeln!(
                out,
                "    bayesian        P(beat control) {:.1}%  uplift {:+.2}% [{:+.2}%, {:+.2}%]  risk: control {:.4}%, this {:.4}%",
                pct(b.chance_to_beat_control),
                pct(b.uplift),
                pct(b.ci_low),
                pct(b.ci_high),
                pct(b.risk_control),
                pct(b.risk_treatment)
            );
    }
    if let Some(c) = &res.cuped {
        cuped_line(out, c);
    }
    if let Some(a) = &res.adjusted {
        let _ = writeln!(
            out,
            "    adjusted        Holm p {:.4}  BH p {:.4}  sequential Holm p {:.4}",
            a.holm, a.bh, a.sequential_holm
        );
    }
}
