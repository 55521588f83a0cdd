//! `abserve experiments create FILE` and `abserve experiments delete NAME`: the API's
//! experiment writes from the command line. An experiments file (TOML, as `serve --experiments`
//! reads) is checked, then
//!
//! - with `--url`: sent to a running server (`POST`, or `PUT` with `--replace`), which checks
//!   every variant as the request it will produce (templates rendered, grammars compiled,
//!   adapters and models admitted) and answers as the API does;
//! - without: written into the store (`--store` / `--data-dir`), checked by the experiment rules
//!   alone (the model is not loaded); servers sharing the store route it within their poll.

use abserve_ab::{parse_file, Store};

/// How `create` writes.
pub struct Create {
    pub file: std::path::PathBuf,
    pub url: Option<String>,
    pub api_key: Option<String>,
    pub replace: bool,
}

/// Creates (or replaces) every experiment of the file; a line per experiment.
pub async fn create(
    c: Create,
    store: impl std::future::Future<Output = anyhow::Result<Store>>,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&c.file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", c.file.display()))?;
    let all = parse_file(&text).map_err(|e| anyhow::anyhow!("{}: {}", c.file.display(), e.0))?;
    if let Some(url) = &c.url {
        let http = reqwest::Client::new();
        for e in &all {
            let base = format!("{}/v1/experiments", url.trim_end_matches('/'));
            let req = if c.replace {
                http.put(format!("{base}/{}", e.name))
            } else {
                http.post(&base)
            };
            let req = match &c.api_key {
                Some(k) => req.bearer_auth(k),
                None => req,
            };
            let r = req.json(e).send().await?;
            let status = r.status();
            let body = r.text().await?;
            if !status.is_success() {
                anyhow::bail!("experiment '{}': {status}: {body}", e.name);
            }
            println!(
                "{} {}",
                if c.replace { "replaced" } else { "created" },
                e.name
            );
        }
        return Ok(());
    }
    let store = store.await?;
    for e in &all {
        if c.replace {
            store.put_experiment(e).await?;
        } else if !store.create_experiment(e).await? {
            anyhow::bail!(
                "an experiment named '{}' exists (--replace replaces it)",
                e.name
            );
        }
        println!(
            "{} {} (checked without the model: `--url` has a server check its variants)",
            if c.replace { "replaced" } else { "created" },
            e.name
        );
    }
    Ok(())
}

/// Deletes an experiment (its exposures and events stay).
pub async fn delete(store: Store, name: &str) -> anyhow::Result<()> {
    if !store.delete_experiment(name).await? {
        anyhow::bail!("no experiment named '{name}'");
    }
    println!("deleted {name}");
    Ok(())
}
