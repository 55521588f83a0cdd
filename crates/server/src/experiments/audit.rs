//! The audit log of the control plane: every admin action and every read of stored
//! conversations (the routes `auth::rules` marks), written by the `/v1` middleware before the
//! answer is sent — to the store when the server has one, and always as a log line (target
//! `abserve::audit`) — and read back by admins with `GET /v1/audit`.

use std::sync::Arc;

use abserve_ab::AuditEntry;
use abserve_protocol::abserve::List;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::ControlPlane;
use crate::error::ApiError;

impl ControlPlane {
    /// Writes `entry`: the store's write runs in a task of its own, so it finishes even when the
    /// caller's connection (and this future) is dropped; awaited, so the answer follows it.
    pub async fn audit(&self, entry: AuditEntry) {
        tracing::info!(target: "abserve::audit", who = %entry.who, role = %entry.role,
            method = %entry.method, path = %entry.path, status = entry.status, "audit");
        let Some(ab) = &self.ab else { return };
        let store = ab.store().clone();
        let metrics = self.metrics.clone();
        let write = tokio::spawn(async move {
            if let Err(e) = store.record_audit(&entry).await {
                metrics.store_error("audit");
                tracing::error!(
                    "audit: the entry for {} {} by {} was not stored: {e}",
                    entry.method,
                    entry.path,
                    entry.who
                );
            }
        });
        let _ = write.await;
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    limit: Option<u32>,
}

/// The latest audit entries, newest first (1-1000, default 100).
#[utoipa::path(get, path = "/v1/audit", params(("limit" = Option<u32>, Query, description = "most entries, 1-1000 (default 100)")), responses((status = 200, description = "`{object: list, data: [{at, who, role, method, path, status}]}`", body = Object)))]
pub async fn audit_log(
    State(cp): State<Arc<ControlPlane>>,
    Query(q): Query<AuditQuery>,
) -> Result<Response, ApiError> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid_param(
            "limit",
            "limit must be between 1 and 1000",
        ));
    }
    let entries = cp
        .ab()?
        .store()
        .audit(limit)
        .await
        .inspect_err(|_| cp.metrics.store_error("audit"))?;
    Ok(Json(List::new(entries)).into_response())
}
