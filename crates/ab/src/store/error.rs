//! Store failures, and what an operator can do about each (the server turns them into 507 or
//! 503 with Retry-After).

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("storage: migrating the schema: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("storage: {0}")]
    Io(#[from] std::io::Error),
    #[error("storage: corrupt experiment definition: {0}")]
    Json(#[from] serde_json::Error),
    #[error("storage: {0}")]
    Config(String),
}

/// What an operator can do about a failed store operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreCondition {
    /// The disk (or the file system's quota) is full: free space, then retry.
    Full,
    /// The database cannot be written (read-only file system or file, permissions, I/O error,
    /// a database server that is down or read-only).
    Unwritable,
    /// Another writer holds the database longer than the busy timeout, or every connection is
    /// in use: retry shortly.
    Busy,
    /// Anything else (a bug or a corrupt database).
    Other,
}

impl StoreError {
    pub fn condition(&self) -> StoreCondition {
        match self {
            StoreError::Sql(e) | StoreError::Migrate(sqlx::migrate::MigrateError::Execute(e)) => {
                sql_condition(e)
            }
            StoreError::Io(e) if e.kind() == std::io::ErrorKind::StorageFull => {
                StoreCondition::Full
            }
            StoreError::Io(_) => StoreCondition::Unwritable,
            _ => StoreCondition::Other,
        }
    }
}

fn sql_condition(e: &sqlx::Error) -> StoreCondition {
    match e {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            // SQLite reports its (extended) result code as a number; PostgreSQL an SQLSTATE
            match code.parse::<i64>() {
                Ok(n) => sqlite_condition(n & 0xff),
                Err(_) => postgres_condition(&code),
            }
        }
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::StorageFull => StoreCondition::Full,
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolClosed => {
            StoreCondition::Unwritable
        }
        sqlx::Error::PoolTimedOut => StoreCondition::Busy,
        _ => StoreCondition::Other,
    }
}

/// SQLite's primary result codes (https://sqlite.org/rescode.html).
fn sqlite_condition(primary: i64) -> StoreCondition {
    match primary {
        13 => StoreCondition::Full,                    // SQLITE_FULL
        3 | 8 | 10 | 14 => StoreCondition::Unwritable, // PERM, READONLY, IOERR, CANTOPEN
        5 | 6 => StoreCondition::Busy,                 // BUSY, LOCKED
        _ => StoreCondition::Other,
    }
}

/// PostgreSQL's SQLSTATE classes (https://www.postgresql.org/docs/current/errcodes-appendix.html).
fn postgres_condition(state: &str) -> StoreCondition {
    match state {
        "53100" => StoreCondition::Full, // disk_full
        "25006" | "57P01" | "57P02" | "57P03" => StoreCondition::Unwritable, // read only; shutting down
        "40001" | "40P01" | "55P03" | "53200" | "53300" => StoreCondition::Busy, // serialization, deadlock, lock, memory, connections
        s if s.starts_with("08") => StoreCondition::Unwritable, // connection exceptions
        _ => StoreCondition::Other,
    }
}
