//! The audit log (`audit`): who did what to the control plane, and when — every admin action
//! and every read of stored conversations, written before the answer to it is sent. Never a key:
//! `who` is the key's name.

use serde::Serialize;

use super::{now, Pool, Store, StoreError};

/// One audited action.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    /// Seconds since the Unix epoch (set by the store when written).
    pub at: f64,
    /// The name of the key that acted (`--keys`), `api-key` for `--api-key`, `anonymous` on a
    /// server without keys.
    pub who: String,
    pub role: String,
    pub method: String,
    /// The path acted on (no query string).
    pub path: String,
    /// The status of the answer.
    pub status: u16,
}

impl Store {
    /// Writes an audit entry (its `at` is now).
    pub async fn record_audit(&self, e: &AuditEntry) -> Result<(), StoreError> {
        let q = "INSERT INTO audit (ts, who, role, method, path, status) VALUES ($1, $2, $3, $4, $5, $6)";
        on_pool!(self, p => sqlx::query(q)
            .bind(now()).bind(&e.who).bind(&e.role).bind(&e.method).bind(&e.path)
            .bind(i32::from(e.status)).execute(p).await?.rows_affected());
        Ok(())
    }

    /// The latest `limit` entries, newest first.
    pub async fn audit(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
        let q = "SELECT ts, who, role, method, path, status FROM audit ORDER BY id DESC LIMIT $1";
        type Row = (f64, String, String, String, String, i32);
        let rows: Vec<Row> =
            on_pool!(self, p => sqlx::query_as(q).bind(i64::from(limit)).fetch_all(p).await?);
        Ok(rows
            .into_iter()
            .map(|(at, who, role, method, path, status)| AuditEntry {
                at,
                who,
                role,
                method,
                path,
                status: u16::try_from(status).unwrap_or(0),
            })
            .collect())
    }
}
