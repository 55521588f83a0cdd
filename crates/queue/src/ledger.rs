//! The eval-jobs ledger: each queued job's result committed once per job id before the worker
//! acknowledges the job (`abserve worker --store`), table `eval_results` in the database the
//! experiments store uses (SQLite or PostgreSQL), so a run's results outlive the broker.
//!
//! Invariants:
//! - a result is committed before [`Ledger::put`] returns (SQLite: synchronous=FULL);
//! - a redelivered job that was finished before is stored once: the job id is the primary key
//!   and a second insert does nothing, from any worker;
//! - the table is created when missing; on PostgreSQL under a transaction-scoped advisory lock,
//!   so workers starting together do not race. Stores `abserve serve` made already hold the
//!   table (its migration 0002, kept there for the history of existing databases): the same
//!   columns, so either side may create it first.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use abserve_protocol::location::Location;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::QueueError;

/// The advisory lock that serialises creating the table on PostgreSQL ("abserve_eval_results").
const CREATE_LOCK: i64 = 0x6162_7365_7276_6531;

/// A handle on the ledger; clones share one connection pool.
#[derive(Clone)]
pub enum Ledger {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Runs `$body` with `$p` bound to the pool of either backend (the statements are the same text).
macro_rules! on_pool {
    ($ledger:expr, $p:ident => $body:expr) => {
        match $ledger {
            Ledger::Sqlite($p) => $body,
            Ledger::Postgres($p) => $body,
        }
    };
}

fn failed(what: &'static str) -> impl Fn(sqlx::Error) -> QueueError {
    move |e| QueueError(format!("eval-jobs ledger: {what}: {e}"))
}

impl Ledger {
    /// Connects (SQLite: creates the file and its folder) and creates the table when missing.
    pub async fn connect(at: &Location) -> Result<Ledger, QueueError> {
        let connecting = format!("connecting to {}", at.describe());
        let fail = |e: sqlx::Error| QueueError(format!("eval-jobs ledger: {connecting}: {e}"));
        match at {
            Location::Sqlite(file) => {
                if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        QueueError(format!("eval-jobs ledger: creating {}: {e}", dir.display()))
                    })?;
                }
                let opts = SqliteConnectOptions::new()
                    .filename(file)
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Full)
                    .busy_timeout(Duration::from_secs(10));
                let pool = SqlitePoolOptions::new()
                    .max_connections(2)
                    .connect_with(opts)
                    .await
                    .map_err(fail)?;
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS eval_results (job_id TEXT PRIMARY KEY, run TEXT NOT NULL, result TEXT NOT NULL, ts REAL NOT NULL)",
                )
                .execute(&pool)
                .await
                .map_err(failed("creating the table"))?;
                Ok(Ledger::Sqlite(pool))
            }
            Location::Postgres(url) => {
                let pool = PgPoolOptions::new()
                    .max_connections(4)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect(url)
                    .await
                    .map_err(fail)?;
                let mut tx = pool.begin().await.map_err(failed("creating the table"))?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(CREATE_LOCK)
                    .execute(&mut *tx)
                    .await
                    .map_err(failed("locking to create the table"))?;
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS eval_results (job_id TEXT PRIMARY KEY, run TEXT NOT NULL, result TEXT NOT NULL, ts DOUBLE PRECISION NOT NULL)",
                )
                .execute(&mut *tx)
                .await
                .map_err(failed("creating the table"))?;
                tx.commit().await.map_err(failed("creating the table"))?;
                Ok(Ledger::Postgres(pool))
            }
        }
    }

    /// Stores the result of a queued job once: `false` when that job id is already stored
    /// (a redelivered job that was finished before).
    pub async fn put(&self, job_id: &str, run: &str, result: &str) -> Result<bool, QueueError> {
        let q = "INSERT INTO eval_results (job_id, run, result, ts) VALUES ($1, $2, $3, $4) ON CONFLICT (job_id) DO NOTHING";
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let done = on_pool!(self, p => sqlx::query(q)
            .bind(job_id)
            .bind(run)
            .bind(result)
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected()));
        Ok(done.map_err(failed("storing a result"))? == 1)
    }

    /// The stored results of a run's jobs, by job id (what the tests read back; workers only
    /// write them, and the eval reads its results from the broker).
    #[cfg(test)]
    async fn results(
        &self,
        run: &str,
    ) -> Result<std::collections::BTreeMap<String, String>, QueueError> {
        let q = "SELECT job_id, result FROM eval_results WHERE run = $1";
        let rows: Result<Vec<(String, String)>, _> =
            on_pool!(self, p => sqlx::query_as(q).bind(run).fetch_all(p).await);
        Ok(rows
            .map_err(failed("reading a run's results"))?
            .into_iter()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The PostgreSQL server of the tests (its `test` database), as the store's tests use it.
    fn postgres_admin_url() -> String {
        std::env::var("ABSERVE_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
    }

    async fn stores_each_job_once(at: &Location) {
        let ledger = Ledger::connect(at).await.unwrap();
        assert!(ledger.put("run1/r1/a", "run1", "{\"x\":1}").await.unwrap());
        assert!(
            !ledger.put("run1/r1/a", "run1", "{\"x\":2}").await.unwrap(),
            "a redelivered job is stored once"
        );
        assert!(ledger.put("run2/r1/a", "run2", "{}").await.unwrap());
        // a second worker on the same database: the table is there, the rows too
        let other = Ledger::connect(at).await.unwrap();
        assert!(!other.put("run2/r1/a", "run2", "{\"y\":0}").await.unwrap());
        let r = other.results("run1").await.unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r["run1/r1/a"], "{\"x\":1}");
        assert_eq!(other.results("run2").await.unwrap()["run2/r1/a"], "{}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_stores_each_job_once() {
        let dir = std::env::temp_dir().join(format!("abserve-ledger-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        stores_each_job_once(&Location::Sqlite(dir.join("new/abserve.db"))).await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// On a fresh database of the tests' server (a missing server fails the test), with four
    /// workers creating the table at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_stores_each_job_once_and_workers_create_the_table_together() {
        let admin = postgres_admin_url();
        let database = format!("abserve_t_ledger_{}", std::process::id());
        let pool = PgPool::connect(&admin).await.unwrap_or_else(|e| {
            panic!("PostgreSQL for the tests is not reachable at {admin}: {e} (run scripts/services.sh, or set ABSERVE_TEST_POSTGRES)")
        });
        for q in [
            format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
            format!("CREATE DATABASE {database}"),
        ] {
            sqlx::query(&q).execute(&pool).await.unwrap();
        }
        let (base, _) = admin.rsplit_once('/').unwrap();
        let at = Location::Postgres(format!("{base}/{database}"));
        let together = (0..4).map(|_| Ledger::connect(&at));
        for l in futures::future::join_all(together).await {
            l.unwrap();
        }
        stores_each_job_once(&at).await;
        sqlx::query(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
            .execute(&pool)
            .await
            .unwrap();
    }
}
