//! Fresh, private stores for tests, on both backends. PostgreSQL comes from
//! `ABSERVE_TEST_POSTGRES` (default `postgres://postgres@127.0.0.1:5432/test`, the project
//! machines' service; `scripts/services.sh` starts one where none runs): each test gets its own
//! database, dropped by [`Fresh::drop`]. A missing server fails the test, it never skips.

use std::path::PathBuf;

use sqlx::postgres::PgPool;

use abserve_protocol::location::Location;

use crate::store::Store;

/// The PostgreSQL server the tests use (its `test` database).
pub fn postgres_admin_url() -> String {
    std::env::var("ABSERVE_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A store location for one test, removed by `drop`.
pub enum Fresh {
    Sqlite(PathBuf),
    Postgres {
        admin: String,
        database: String,
        url: String,
    },
}

impl Fresh {
    pub fn sqlite(name: &str) -> Fresh {
        let d = std::env::temp_dir().join(format!("abserve-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        Fresh::Sqlite(d)
    }

    /// A new, empty database `abserve_t_<name>_<pid>` on the test server.
    pub async fn postgres(name: &str) -> Fresh {
        let admin = postgres_admin_url();
        let database = format!(
            "abserve_t_{}_{}",
            name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
            std::process::id()
        )
        .to_lowercase();
        let pool = PgPool::connect(&admin).await.unwrap_or_else(|e| {
            panic!("PostgreSQL for the tests is not reachable at {admin}: {e} (run scripts/services.sh, or set ABSERVE_TEST_POSTGRES)")
        });
        sqlx::query(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query(&format!("CREATE DATABASE {database}"))
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        let (base, _) = admin
            .rsplit_once('/')
            .expect("a database url ends in /DATABASE");
        Fresh::Postgres {
            url: format!("{base}/{database}"),
            admin,
            database,
        }
    }

    /// The `--store` value of this location.
    pub fn url(&self) -> String {
        match self {
            Fresh::Sqlite(d) => d.display().to_string(),
            Fresh::Postgres { url, .. } => url.clone(),
        }
    }

    pub async fn store(&self) -> Store {
        Store::connect(&self.url().parse::<Location>().unwrap())
            .await
            .unwrap()
    }

    pub async fn drop(self) {
        match self {
            Fresh::Sqlite(d) => {
                let _ = std::fs::remove_dir_all(d);
            }
            Fresh::Postgres {
                admin, database, ..
            } => {
                let pool = PgPool::connect(&admin).await.unwrap();
                sqlx::query(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
                    .execute(&pool)
                    .await
                    .unwrap();
            }
        }
    }
}
