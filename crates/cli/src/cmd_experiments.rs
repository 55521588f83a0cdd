//! `abserve experiments`: read experiments and their results straight from the store
//! (`--store`, or the SQLite file in `--data-dir`), with or without a running server.

use std::path::PathBuf;

use abserve_ab::{Location, Store};
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
    },
}

pub fn run(a: ExperimentsArgs) -> anyhow::Result<()> {
    let at = crate::args::store_location(a.store.as_deref(), &a.data_dir)?;
    if let Location::Sqlite(f) = &at {
        if !f.exists() {
            anyhow::bail!(
                "no abserve store at {} (start `abserve serve --data-dir {}` first)",
                f.display(),
                a.data_dir.display()
            );
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
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
        ExperimentsCommand::Results { name, json } => {
            let e = store
                .experiment(&name)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no experiment named '{name}'"))?;
            let r = store.results(&e).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
                return Ok(());
            }
            println!("experiment {} (control: {})", r.experiment, r.control);
            if let Some(s) = &r.srm {
                println!(
                    "sample ratio: chi2 {:.3}, p {:.4}{}",
                    s.chi2,
                    s.p_value,
                    if s.mismatch {
                        "  ** MISMATCH: check assignment and logging **"
                    } else {
                        ""
                    }
                );
            }
            for v in &r.variants {
                println!(
                    "\n{}{}: {} units, {} exposures",
                    v.id,
                    if v.is_control { " (control)" } else { "" },
                    v.units,
                    v.exposures
                );
                for (m, res) in &v.metrics {
                    let s = &res.summary;
                    let mut line = format!(
                        "  {m:<16} n {:>5}  mean {:>10.3}  sd {:>9.3}  95% CI [{:.3}, {:.3}]",
                        s.n, s.mean, s.sd, s.ci_low, s.ci_high
                    );
                    if let Some(c) = &res.vs_control {
                        line.push_str(&format!(
                            "  lift {:+.3} ({:+.1}%)  p {:.4}  CI [{:.3}, {:.3}]  P(beat) {:.1}%",
                            c.diff,
                            c.relative_lift * 100.0,
                            c.p_value,
                            c.ci_low,
                            c.ci_high,
                            c.chance_to_beat_control * 100.0
                        ));
                    }
                    println!("{line}");
                }
            }
        }
    }
    Ok(())
}
