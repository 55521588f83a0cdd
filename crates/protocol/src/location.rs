//! Where a database lives (`--store`: the experiments store, and the eval-jobs ledger of
//! `abserve worker` in the same database), and service URLs without their passwords, for logs
//! and messages: written once for the store, the queue and the command line.

use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Where a store lives, from a `--store` value: `postgres://…` (or `postgresql://…`),
/// `sqlite://FILE`, or a directory (SQLite file `abserve.db` inside).
#[derive(Debug, Clone, PartialEq)]
pub enum Location {
    Sqlite(PathBuf),
    Postgres(String),
}

/// A `--store` value that names no supported database.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("unsupported store '{0}': use postgres://…, sqlite://FILE or a directory")]
pub struct UnsupportedLocation(pub String);

impl FromStr for Location {
    type Err = UnsupportedLocation;
    fn from_str(s: &str) -> Result<Location, UnsupportedLocation> {
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            Ok(Location::Postgres(s.to_string()))
        } else if let Some(f) = s.strip_prefix("sqlite://") {
            Ok(Location::Sqlite(PathBuf::from(f)))
        } else if s.contains("://") {
            Err(UnsupportedLocation(
                url_without_password(s).unwrap_or_default(),
            ))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_passwords_and_locations_parse() {
        assert_eq!(
            url_without_password("postgres://u:secret@h:5432/db").unwrap(),
            "postgres://u@h:5432/db"
        );
        assert_eq!(
            url_without_password("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap(),
            "amqp://guest@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            url_without_password("postgres://h/db").unwrap(),
            "postgres://h/db"
        );
        assert_eq!(
            "postgres://u:pw@h/db"
                .parse::<Location>()
                .unwrap()
                .describe(),
            "postgres://u@h/db"
        );
        assert_eq!(
            "/var/data".parse::<Location>().unwrap(),
            Location::Sqlite("/var/data/abserve.db".into())
        );
        let e = "mysql://u:secret@h/db".parse::<Location>().unwrap_err();
        assert!(e.to_string().contains("mysql://u@h/db"), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}
