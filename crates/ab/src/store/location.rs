//! Where a store lives (`--store`), and service URLs without their passwords for logs.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::StoreError;

/// Where a store lives, from a `--store` value: `postgres://…` (or `postgresql://…`),
/// `sqlite://FILE`, or a directory (SQLite file `abserve.db` inside).
#[derive(Debug, Clone, PartialEq)]
pub enum Location {
    Sqlite(PathBuf),
    Postgres(String),
}

impl FromStr for Location {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Location, StoreError> {
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            Ok(Location::Postgres(s.to_string()))
        } else if let Some(f) = s.strip_prefix("sqlite://") {
            Ok(Location::Sqlite(PathBuf::from(f)))
        } else if s.contains("://") {
            Err(StoreError::Config(format!(
                "unsupported store '{s}': use postgres://…, sqlite://FILE or a directory"
            )))
        } else {
            Ok(Location::Sqlite(Path::new(s).join("abserve.db")))
        }
    }
}

impl Location {
    /// The location without a password.
    pub fn describe(&self) -> String {
        match self {
            Location::Sqlite(p) => format!("sqlite://{}", p.display()),
            Location::Postgres(u) => match url_without_password(u) {
                Some(u) => u,
                None => "postgres://(unparsable url)".into(),
            },
        }
    }
}

/// A service URL (`postgres://user:pass@host/db`, `amqp://…`) without its password, for logs and
/// messages; `None` when it has no scheme.
pub fn url_without_password(u: &str) -> Option<String> {
    let (scheme, rest) = u.split_once("://")?;
    Some(match rest.split_once('@') {
        Some((auth, host)) => {
            let user = auth.split(':').next().unwrap_or("");
            format!("{scheme}://{user}@{host}")
        }
        None => u.to_string(),
    })
}
