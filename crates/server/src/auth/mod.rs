//! Who may call what under `/v1`: keys with roles (`crate::keys`: `--api-key`, `--keys FILE`),
//! each route's roles (`rules`), and the middleware that applies both — 401 for a missing or unknown
//! key, 403 naming the role a route needs, the caller put into the request's extensions for the
//! handlers (a key's default class), and the audit log written for the routes the rules mark
//! (before the answer is sent).

mod rules;

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

#[cfg(test)]
pub use rules::RULES;
pub use rules::{roles_text, rule};

use crate::error::ApiError;
use crate::keys::Caller;
use crate::state::AppState;

fn bearer(req: &Request) -> Option<&str> {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

pub async fn authorize(
    State(state): State<Arc<AppState>>,
    matched: Option<MatchedPath>,
    mut req: Request,
    next: Next,
) -> Response {
    // counted by the routes' counter under the route template, never the raw path
    let Some(caller) = state.config.keys.caller(bearer(&req)) else {
        return ApiError::unauthorized().into_response();
    };
    let template = matched.as_ref().map_or("", |m| m.as_str());
    let rule = rule(req.method(), template);
    if !rule.roles.contains(&caller.role) {
        return ApiError::forbidden(format!(
            "This key's role ({}) may not call {} {}; it needs the role {}.",
            caller.role.as_str(),
            req.method(),
            template,
            roles_text(rule.roles)
        ))
        .into_response();
    }
    let audit = rule.audited.then(|| abserve_ab::AuditEntry {
        at: 0.0,
        who: caller.name.to_string(),
        role: caller.role.as_str().into(),
        method: req.method().to_string(),
        // the path as the client sent it (`nest` strips its prefix from the request's own URI)
        path: req
            .extensions()
            .get::<axum::extract::OriginalUri>()
            .map_or_else(|| req.uri().path(), |u| u.0.path())
            .to_string(),
        status: 0,
    });
    req.extensions_mut().insert(caller);
    let resp = next.run(req).await;
    if let Some(mut entry) = audit {
        entry.status = resp.status().as_u16();
        state.experiments.audit(entry).await;
    }
    resp
}

/// Who the presented key is: its name, role and default class (the dashboard shows what the
/// role may see).
#[utoipa::path(get, path = "/v1/me", responses((status = 200, description = "`{name, role, service_tier}` of the key presented", body = Object)))]
pub async fn me(caller: Option<axum::Extension<Caller>>) -> Response {
    let c = caller.map(|c| c.0);
    let body = c.map_or(
        serde_json::Value::Null,
        |c| serde_json::json!({"name": &*c.name, "role": c.role, "service_tier": c.class}),
    );
    axum::Json(body).into_response()
}
