//! Durable storage of experiments, exposures and outcome events, and the results computed from
//! them, in SQLite (embedded, the default) or PostgreSQL (shared by several replicas), through
//! `sqlx` with one set of statements and versioned migrations per backend.
//!
//! Invariants, on both backends:
//! - every write is committed before it returns, so anything a caller acknowledged survives a
//!   kill -9 (SQLite: WAL with synchronous=FULL);
//! - an event batch may carry an id; a retried batch with the same id is not counted twice, from
//!   any replica (a primary key decides, inside the batch's transaction);
//! - results are aggregated by the database (`results`), never by loading every row;
//! - on PostgreSQL every experiment change is announced with NOTIFY on [`CHANNEL`], so replicas
//!   can reload at once (`watch`); polling `experiments` bounds the delay when a notification
//!   is missed.

mod cuped;
mod error;
mod results;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

pub use audit::AuditEntry;
pub use bandit::next_bandit;
pub use error::{StoreCondition, StoreError};
pub use evals::{EvalRun, HEARTBEAT as EVAL_HEARTBEAT};
pub use results::{
    Adjusted, Analysis, HistoryPoint, MetricResult, RatioParts, Results, VariantResult,
    VariantState,
};
pub use samples::{Erased, Sample, SampleQuery};

use abserve_protocol::location::Location;

use crate::experiment::Experiment;

/// SQL counting the rows of a group whose `column` is not 0 (a binary metric's conversions).
fn nonzero(column: &str) -> String {
    format!("SUM(CASE WHEN {column} <> 0 THEN 1 ELSE 0 END)")
}

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("migrations/postgres");

/// The PostgreSQL channel that announces experiment changes (the payload is the name).
pub const CHANNEL: &str = "abserve_experiments";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OutcomeEvent {
    pub unit: String,
    pub metric: String,
    pub value: f64,
    /// Seconds since the Unix epoch; default: now.
    pub timestamp: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Exposure {
    pub variant: String,
    pub unit: String,
    pub forced: bool,
    pub latency_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub output_tokens: Option<u64>,
    pub error: Option<String>,
    /// The answer was constrained by a grammar (`response_format` or tools).
    #[serde(default)]
    pub constrained: bool,
    /// A constrained answer finished as a complete match of its grammar.
    #[serde(default)]
    pub grammar_complete: Option<bool>,
    /// Prompt tokens of the answer (as its model counted them).
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    /// What the answer cost at its model's configured prices (models served elsewhere).
    #[serde(default)]
    pub cost: Option<f64>,
    /// The priority class the request ran in (`None`: recorded before classes existed).
    #[serde(default)]
    pub service_tier: Option<abserve_protocol::Class>,
    /// The answer's id (its sample's too, when sampled).
    #[serde(default)]
    pub request_id: Option<String>,
    /// The name of the key whose request it was (`None`: recorded before keys were kept).
    #[serde(default)]
    pub caller: Option<String>,
}

/// An exposure as stored, with when it was recorded (seconds since the Unix epoch).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RecordedExposure {
    pub at: f64,
    #[serde(flatten)]
    pub exposure: Exposure,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
/// Which database a store is on.
pub enum Database {
    Sqlite,
    Postgres,
}

#[derive(Clone)]
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// A handle on the store; clones share one connection pool.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    location: String,
}

/// Runs `$body` with `$p` bound to the concrete pool of either backend (the statements are the
/// same text; sqlx checks the types per backend).
macro_rules! on_pool {
    ($store:expr, $p:ident => $body:expr) => {
        match &$store.pool {
            Pool::Sqlite($p) => $body,
            Pool::Postgres($p) => $body,
        }
    };
}

// after the macro, which it uses
mod audit;
mod bandit;
mod callers;
mod evals;
mod samples;
mod spend;

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Whether a SQLite connection given back to the pool may serve again: only when neither SQLite
/// nor sqlx holds a transaction open on it; otherwise it is closed, which ends the transaction.
///
/// sqlx counts the transactions it opened; SQLite ends one by itself after some errors (a full
/// disk, I/O errors), and the two then disagree. sqlx's rollback of a transaction SQLite already
/// ended fails and leaves its count at 1, so its next "transaction" on that connection is a
/// savepoint whose rollback does not end SQLite's transaction: the connection kept SQLite's
/// write lock, every other writer waited out the busy timeout ("database is locked" long after
/// the disk had space again), and writes it answered as done were never committed. Seen in
/// `store::tests::a_full_disk_leaves_no_transaction_open`.
async fn release_sqlite(conn: &mut sqlx::SqliteConnection) -> Result<bool, sqlx::Error> {
    use sqlx::Connection;
    // the handle is taken through the connection's worker, after any rollback queued on it
    let mut handle = conn.lock_handle().await?;
    // SAFETY: the handle is locked for this call: no other statement runs on it meanwhile
    let sqlite_open =
        unsafe { libsqlite3_sys::sqlite3_get_autocommit(handle.as_raw_handle().as_ptr()) } == 0;
    drop(handle);
    let sqlx_open = conn.is_in_transaction();
    let reuse = !sqlite_open && !sqlx_open;
    if !reuse {
        tracing::warn!(
            sqlite_open,
            sqlx_open,
            "closing a SQLite connection left inside a transaction (after a write failed)"
        );
    }
    Ok(reuse)
}

impl Store {
    /// The SQLite store `abserve.db` in `dir` (created when missing).
    pub async fn open(dir: &Path) -> Result<Store, StoreError> {
        Store::connect(&Location::Sqlite(dir.join("abserve.db"))).await
    }

    /// Connects (SQLite: creates the file) and migrates the schema to this version. Several
    /// replicas may start at once: PostgreSQL migrations hold an advisory lock.
    pub async fn connect(at: &Location) -> Result<Store, StoreError> {
        let location = at.describe();
        let pool = match at {
            Location::Sqlite(file) => {
                if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)?;
                }
                let opts = SqliteConnectOptions::new()
                    .filename(file)
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Full)
                    .busy_timeout(Duration::from_secs(10));
                let pool = SqlitePoolOptions::new()
                    .max_connections(4)
                    .after_release(|conn, _| Box::pin(release_sqlite(conn)))
                    .connect_with(opts)
                    .await?;
                SQLITE_MIGRATIONS.run(&pool).await?;
                Pool::Sqlite(pool)
            }
            Location::Postgres(url) => {
                let pool = PgPoolOptions::new()
                    .max_connections(8)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect(url)
                    .await
                    .map_err(|e| {
                        StoreError::Config(format!("cannot connect to {location}: {e}"))
                    })?;
                POSTGRES_MIGRATIONS.run(&pool).await?;
                Pool::Postgres(pool)
            }
        };
        Ok(Store { pool, location })
    }

    pub fn database(&self) -> Database {
        match self.pool {
            Pool::Sqlite(_) => Database::Sqlite,
            Pool::Postgres(_) => Database::Postgres,
        }
    }

    /// Where the store is (no password).
    pub fn describe(&self) -> &str {
        &self.location
    }

    /// How many migrations the schema has had.
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        let q = "SELECT COUNT(*) FROM _sqlx_migrations WHERE success";
        Ok(on_pool!(self, p => sqlx::query_scalar::<_, i64>(q).fetch_one(p).await?))
    }

    async fn announce(&self, name: &str) -> Result<(), StoreError> {
        if let Pool::Postgres(p) = &self.pool {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(CHANNEL)
                .bind(name)
                .execute(p)
                .await?;
        }
        Ok(())
    }

    pub async fn put_experiment(&self, e: &Experiment) -> Result<(), StoreError> {
        let q = "INSERT INTO experiments (name, definition, updated_at) VALUES ($1, $2, $3)
                 ON CONFLICT (name) DO UPDATE SET definition = excluded.definition, updated_at = excluded.updated_at";
        let def = serde_json::to_string(e)?;
        on_pool!(self, p => sqlx::query(q).bind(&e.name).bind(&def).bind(now()).execute(p).await?.rows_affected());
        self.announce(&e.name).await
    }

    /// Stores a new experiment; `false` (and nothing written) when one of that name exists. One
    /// statement, so of two concurrent creates (on any replicas) exactly one succeeds.
    pub async fn create_experiment(&self, e: &Experiment) -> Result<bool, StoreError> {
        let q = "INSERT INTO experiments (name, definition, updated_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING";
        let def = serde_json::to_string(e)?;
        let n = on_pool!(self, p => sqlx::query(q).bind(&e.name).bind(&def).bind(now()).execute(p).await?.rows_affected());
        if n == 1 {
            self.announce(&e.name).await?;
        }
        Ok(n == 1)
    }

    pub async fn experiments(&self) -> Result<Vec<Experiment>, StoreError> {
        let q = "SELECT definition FROM experiments ORDER BY name";
        let defs: Vec<String> = on_pool!(self, p => sqlx::query_scalar(q).fetch_all(p).await?);
        defs.iter()
            .map(|d| serde_json::from_str(d).map_err(StoreError::from))
            .collect()
    }

    pub async fn experiment(&self, name: &str) -> Result<Option<Experiment>, StoreError> {
        let q = "SELECT definition FROM experiments WHERE name = $1";
        let d: Option<String> =
            on_pool!(self, p => sqlx::query_scalar(q).bind(name).fetch_optional(p).await?);
        Ok(match d {
            Some(d) => Some(serde_json::from_str(&d)?),
            None => None,
        })
    }

    pub async fn delete_experiment(&self, name: &str) -> Result<bool, StoreError> {
        let q = "DELETE FROM experiments WHERE name = $1";
        let n = on_pool!(self, p => sqlx::query(q).bind(name).execute(p).await?.rows_affected());
        if n > 0 {
            self.announce(name).await?;
        }
        Ok(n > 0)
    }

    pub async fn record_exposure(&self, experiment: &str, x: &Exposure) -> Result<(), StoreError> {
        let q = "INSERT INTO exposures (experiment, variant, unit, forced, ts, latency_ms, ttft_ms, output_tokens, error, constrained, grammar_complete, prompt_tokens, cost, service_tier, request_id, caller)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)";
        let tokens = x.output_tokens.map(|t| t.min(i64::MAX as u64) as i64);
        let prompt = x.prompt_tokens.map(|t| t.min(i64::MAX as u64) as i64);
        on_pool!(self, p => sqlx::query(q)
            .bind(experiment).bind(&x.variant).bind(&x.unit).bind(x.forced).bind(now())
            .bind(x.latency_ms).bind(x.ttft_ms).bind(tokens).bind(&x.error)
            .bind(x.constrained).bind(x.grammar_complete).bind(prompt).bind(x.cost)
            .bind(x.service_tier.map(|c| c.as_str())).bind(&x.request_id).bind(&x.caller)
            .execute(p).await?.rows_affected());
        Ok(())
    }

    /// The latest `limit` exposures, newest first (forced ones too, marked). No prompt text is
    /// ever stored, so none can be shown.
    pub async fn recent_exposures(
        &self,
        experiment: &str,
        limit: u32,
    ) -> Result<Vec<RecordedExposure>, StoreError> {
        let q = "SELECT ts, variant, unit, forced, latency_ms, ttft_ms, output_tokens, error, constrained, grammar_complete, prompt_tokens, cost, service_tier, request_id, caller FROM exposures
                 WHERE experiment = $1 ORDER BY id DESC LIMIT $2";
        type Row = (
            f64,
            String,
            String,
            bool,
            Option<f64>,
            Option<f64>,
            Option<i64>,
            Option<String>,
            bool,
            Option<bool>,
            Option<i64>,
            Option<f64>,
            Option<String>,
            Option<String>,
            Option<String>,
        );
        let rows: Vec<Row> = on_pool!(self, p => sqlx::query_as(q).bind(experiment).bind(limit as i64).fetch_all(p).await?);
        Ok(rows
            .into_iter()
            .map(
                |(
                    at,
                    variant,
                    unit,
                    forced,
                    latency_ms,
                    ttft_ms,
                    tokens,
                    error,
                    constrained,
                    grammar_complete,
                    prompt,
                    cost,
                    tier,
                    request_id,
                    caller,
                )| {
                    RecordedExposure {
                        at,
                        exposure: Exposure {
                            variant,
                            unit,
                            forced,
                            latency_ms,
                            ttft_ms,
                            output_tokens: tokens.map(|t| t.max(0) as u64),
                            error,
                            constrained,
                            grammar_complete,
                            prompt_tokens: prompt.map(|t| t.max(0) as u64),
                            cost,
                            service_tier: tier.and_then(|t| {
                                abserve_protocol::Class::from_tier(&t).ok().flatten()
                            }),
                            request_id,
                            caller,
                        },
                    }
                },
            )
            .collect())
    }

    /// Stores a batch atomically. Returns how many events were stored: 0 when `batch_id` was
    /// already stored (a retry, through this replica or another).
    pub async fn record_events(
        &self,
        experiment: &str,
        batch_id: Option<&str>,
        events: &[OutcomeEvent],
    ) -> Result<usize, StoreError> {
        let mark = "INSERT INTO event_batches (experiment, batch_id, events) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
        let insert = "INSERT INTO events (experiment, unit, metric, value, ts, batch_id) VALUES ($1, $2, $3, $4, $5, $6)";
        let t = now();
        on_pool!(self, p => {
            let mut tx = p.begin().await?;
            if let Some(b) = batch_id {
                let fresh = sqlx::query(mark).bind(experiment).bind(b).bind(events.len() as i64).execute(&mut *tx).await?;
                if fresh.rows_affected() == 0 {
                    return Ok(0);
                }
            }
            for e in events {
                sqlx::query(insert)
                    .bind(experiment).bind(&e.unit).bind(&e.metric).bind(e.value).bind(e.timestamp.unwrap_or(t)).bind(batch_id)
                    .execute(&mut *tx).await?;
            }
            tx.commit().await?;
        });
        Ok(events.len())
    }

    pub async fn count_events(&self, experiment: &str) -> Result<u64, StoreError> {
        let q = "SELECT COUNT(*) FROM events WHERE experiment = $1";
        Ok(
            on_pool!(self, p => sqlx::query_scalar::<_, i64>(q).bind(experiment).fetch_one(p).await?)
                as u64,
        )
    }

    /// Units per variant (a unit belongs to the variant of its first non-forced exposure).
    pub async fn units(&self, experiment: &str) -> Result<BTreeMap<String, u64>, StoreError> {
        self.units_until(experiment, f64::MAX).await
    }

    async fn units_until(
        &self,
        experiment: &str,
        until: f64,
    ) -> Result<BTreeMap<String, u64>, StoreError> {
        let q = results::units_sql();
        let rows: Vec<(String, i64)> = on_pool!(self, p => sqlx::query_as(&q).bind(experiment).bind(until).fetch_all(p).await?);
        Ok(rows.into_iter().map(|(v, n)| (v, n as u64)).collect())
    }

    /// Per-variant results with statistics against the control, aggregated by the database,
    /// per unit.
    pub async fn results(&self, e: &Experiment) -> Result<Results, StoreError> {
        self.results_until(e, f64::MAX, Analysis::Unit).await
    }

    /// The results with `analysis`'s observations (per unit, or per request where wanted).
    pub async fn results_by(
        &self,
        e: &Experiment,
        analysis: Analysis,
    ) -> Result<Results, StoreError> {
        self.results_until(e, f64::MAX, analysis).await
    }

    /// The results over the units that had arrived by `until` (seconds since the epoch): their
    /// exposures up to then and all their events.
    pub async fn results_until(
        &self,
        e: &Experiment,
        until: f64,
        analysis: Analysis,
    ) -> Result<Results, StoreError> {
        let units = self.units_until(&e.name, until).await?;
        let rows: Vec<(String, i64)> = on_pool!(self, p => sqlx::query_as(results::EXPOSURES).bind(&e.name).bind(until).fetch_all(p).await?);
        let exposures = rows.into_iter().map(|(v, n)| (v, n as u64)).collect();
        let q = results::moments_sql(analysis);
        let moments: Vec<results::MomentRow> =
            on_pool!(self, p => sqlx::query_as(&q).bind(&e.name).bind(until).fetch_all(p).await?);
        let q = results::ratio_sql();
        let mut ratios = vec![];
        for (i, r) in e.ratios.iter().enumerate() {
            let rows: Vec<results::RatioRow> = on_pool!(self, p => sqlx::query_as(&q)
                .bind(&e.name).bind(until).bind(&r.numerator).bind(&r.denominator).fetch_all(p).await?);
            ratios.push((i, rows));
        }
        let q = results::defined_sql();
        let q_pre_post = cuped::pre_post_sql();
        let mut defined = vec![];
        for (index, m) in e.metrics.iter().enumerate() {
            if m.cuped {
                let rows: Vec<cuped::PrePostRow> = on_pool!(self, p => sqlx::query_as(&q_pre_post)
                    .bind(&e.name).bind(until).bind(&m.name).bind(m.lookback_seconds()).fetch_all(p).await?);
                let (summaries, cap, sums) = cuped::pre_post(m, rows);
                defined.push(results::Defined {
                    index,
                    summaries,
                    cap,
                    pre_post: Some(sums),
                });
                continue;
            }
            let rows: Vec<results::DefinedRow> = on_pool!(self, p => sqlx::query_as(&q)
                .bind(&e.name).bind(until).bind(&m.name).fetch_all(p).await?);
            let (summaries, cap) = results::defined_summaries(m, rows);
            defined.push(results::Defined {
                index,
                summaries,
                cap,
                pre_post: None,
            });
        }
        let mut r = results::assemble(e, analysis, &units, &exposures, moments, ratios, defined);
        if until == f64::MAX {
            r.bandit = self.bandit_results(e).await?;
        }
        if r.bandit.is_some() {
            // weights changed over time: the split is not checked against today's
            r.srm = None;
        }
        Ok(r)
    }

    /// The results over the first k, 2k, … units and over all of them (up to `points` points,
    /// evenly spaced in units). Each point is one aggregated results call.
    pub async fn history(
        &self,
        e: &Experiment,
        points: usize,
    ) -> Result<Vec<HistoryPoint>, StoreError> {
        let total: u64 = self.units(&e.name).await?.values().sum();
        if total == 0 {
            return Ok(vec![]);
        }
        let step = total.div_ceil(points.max(1) as u64).max(1) as i64;
        let rows: Vec<(i64, f64)> = on_pool!(self, p => sqlx::query_as(results::ARRIVALS).bind(&e.name).bind(f64::MAX).bind(step).fetch_all(p).await?);
        let mut out: Vec<HistoryPoint> = Vec::with_capacity(rows.len());
        for (_, at) in rows {
            if out.last().is_some_and(|p| p.at == at) {
                continue; // units that arrived at the same instant
            }
            let results = self.results_until(e, at, Analysis::Unit).await?;
            out.push(HistoryPoint {
                units: results.variants.iter().map(|v| v.units).sum(),
                at,
                results,
            });
        }
        Ok(out)
    }

    /// On PostgreSQL, calls `changed` at every experiment change announced by any replica
    /// (the listener reconnects by itself after a lost connection, and then calls `changed`
    /// once, since notifications may have been missed). On SQLite, returns `None`.
    pub async fn watch(
        &self,
        changed: impl Fn() + Send + 'static,
    ) -> Result<Option<tokio::task::JoinHandle<()>>, StoreError> {
        let Pool::Postgres(p) = &self.pool else {
            return Ok(None);
        };
        let mut listener = PgListener::connect_with(p).await?;
        listener.listen(CHANNEL).await?;
        Ok(Some(tokio::spawn(async move {
            loop {
                match listener.try_recv().await {
                    Ok(_) => changed(),
                    Err(e) => {
                        tracing::warn!("store: listening for experiment changes: {e}; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        })))
    }
}

#[cfg(test)]
mod tests;
