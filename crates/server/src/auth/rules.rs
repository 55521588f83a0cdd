//! Which roles may call which route: one table, read by the `/v1` middleware (`auth::authorize`)
//! and by the tests that try every route with every role. A route missing from the table is
//! admin-only (and a test fails: every route of the OpenAPI document has its row).

use abserve_protocol::Role::{self, Admin, Inference, Reviewer};
use axum::http::Method;

/// Calls models: chat, completions, fan-out.
const CALLERS: &[Role] = &[Inference, Admin];
/// Reads experiments and what they measured.
const READERS: &[Role] = &[Reviewer, Admin];
/// Outcome events: the application's own (inference: only for its own units, `routes::events`);
/// a reviewer rates through the review route.
const EVENTS: &[Role] = &[Inference, Admin];
const EVERY: &[Role] = &[Inference, Reviewer, Admin];
const ADMIN: &[Role] = &[Admin];

/// A route's rule: the roles that may call it, and whether each call is written to the audit log.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    pub roles: &'static [Role],
    pub audited: bool,
}

/// (method, route template, roles, audited)
pub const RULES: &[(&str, &str, &[Role], bool)] = &[
    ("POST", "/v1/chat/completions", CALLERS, false),
    ("POST", "/v1/completions", CALLERS, false),
    ("GET", "/v1/models", EVERY, false),
    ("POST", "/v1/experiments/{name}/fanout", CALLERS, false),
    ("GET", "/v1/experiments", READERS, false),
    ("POST", "/v1/experiments", ADMIN, true),
    ("GET", "/v1/experiments/{name}", READERS, false),
    ("PUT", "/v1/experiments/{name}", ADMIN, true),
    ("DELETE", "/v1/experiments/{name}", ADMIN, true),
    ("POST", "/v1/experiments/{name}/events", EVENTS, false),
    ("GET", "/v1/experiments/{name}/results", READERS, false),
    ("GET", "/v1/experiments/{name}/history", READERS, false),
    ("GET", "/v1/experiments/{name}/exposures", READERS, false),
    ("GET", "/v1/experiments/{name}/samples", READERS, true),
    (
        "GET",
        "/v1/experiments/{name}/samples/export",
        READERS,
        true,
    ),
    (
        "POST",
        "/v1/experiments/{name}/samples/{id}/review",
        READERS,
        false,
    ),
    ("POST", "/v1/experiments/{name}/evals", READERS, true),
    ("GET", "/v1/experiments/{name}/evals", READERS, false),
    ("GET", "/v1/experiments/{name}/evals/{id}", READERS, false),
    // the report holds sampled conversations' text: a read of samples
    (
        "GET",
        "/v1/experiments/{name}/evals/{id}/report",
        READERS,
        true,
    ),
    ("DELETE", "/v1/units/{unit}", ADMIN, true),
    ("GET", "/v1/engine", READERS, false),
    ("GET", "/v1/me", EVERY, false),
    ("GET", "/v1/audit", ADMIN, false),
];

/// The rule of a route (its template as axum matched it); HEAD as GET; a route without a row is
/// admin-only and audited.
pub fn rule(method: &Method, template: &str) -> Rule {
    let m = if method == Method::HEAD {
        "GET"
    } else {
        method.as_str()
    };
    RULES
        .iter()
        .find(|(rm, t, _, _)| *rm == m && *t == template)
        .map_or(
            Rule {
                roles: ADMIN,
                audited: true,
            },
            |&(_, _, roles, audited)| Rule { roles, audited },
        )
}

/// The roles that may call it, as a message says them: "admin", "reviewer or admin".
pub fn roles_text(roles: &[Role]) -> String {
    let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
    match names.split_last() {
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_of_the_api_document_has_its_row_and_admin_may_call_each() {
        let doc = crate::openapi::document();
        let mut seen = 0;
        for (path, item) in &doc.paths.paths {
            if !path.starts_with("/v1/") {
                continue;
            }
            let methods = [
                ("GET", item.get.is_some()),
                ("POST", item.post.is_some()),
                ("PUT", item.put.is_some()),
                ("DELETE", item.delete.is_some()),
            ];
            for (m, present) in methods {
                if present {
                    seen += 1;
                    let row = RULES.iter().find(|(rm, t, _, _)| *rm == m && t == path);
                    let (_, _, roles, _) = row.unwrap_or_else(|| panic!("no rule for {m} {path}"));
                    assert!(roles.contains(&Admin), "{m} {path}");
                }
            }
        }
        assert!(seen >= 14, "{seen} routes in the document");
        assert_eq!(rule(&Method::PATCH, "/v1/experiments").roles, ADMIN);
        assert_eq!(rule(&Method::HEAD, "/v1/models").roles, EVERY);
        assert_eq!(roles_text(READERS), "reviewer or admin");
        assert_eq!(roles_text(EVERY), "inference, reviewer or admin");
    }
}
