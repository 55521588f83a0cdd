//! Durable storage of experiments, exposures and outcome events in SQLite (WAL), and the
//! results computed from them.
//!
//! Every write is committed before it returns, so anything a caller acknowledged survives a
//! kill -9. An event batch may carry an id; a retried batch with the same id is not counted
//! twice. The schema is versioned with SQLite's `user_version` and migrated on open.

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use crate::experiment::Experiment;
use crate::stats::{srm, summarize, welch, Comparison, SrmCheck, Summary};

const MIGRATIONS: &[&str] = &[
    // 1: the first schema
    "CREATE TABLE experiments (name TEXT PRIMARY KEY, definition TEXT NOT NULL, updated_at REAL NOT NULL);
     CREATE TABLE exposures (
        id INTEGER PRIMARY KEY, experiment TEXT NOT NULL, variant TEXT NOT NULL, unit TEXT NOT NULL,
        forced INTEGER NOT NULL, ts REAL NOT NULL, latency_ms REAL, ttft_ms REAL, output_tokens INTEGER,
        error TEXT);
     CREATE INDEX exposures_by_unit ON exposures (experiment, unit);
     CREATE TABLE events (
        id INTEGER PRIMARY KEY, experiment TEXT NOT NULL, unit TEXT NOT NULL, metric TEXT NOT NULL,
        value REAL NOT NULL, ts REAL NOT NULL, batch_id TEXT);
     CREATE INDEX events_by_experiment ON events (experiment, metric);
     CREATE TABLE event_batches (experiment TEXT NOT NULL, batch_id TEXT NOT NULL, events INTEGER NOT NULL,
        PRIMARY KEY (experiment, batch_id));",
];

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("storage: {0}")]
    Io(#[from] std::io::Error),
    #[error("storage: corrupt experiment definition: {0}")]
    Json(#[from] serde_json::Error),
}

/// What an operator can do about a failed store operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreCondition {
    /// The disk (or the file system's quota) is full: free space, then retry.
    Full,
    /// The database cannot be written (read-only file system or file, permissions, I/O error).
    Unwritable,
    /// Another writer holds the database longer than the busy timeout: retry shortly.
    Busy,
    /// Anything else (a bug or a corrupt database).
    Other,
}

impl StoreError {
    pub fn condition(&self) -> StoreCondition {
        use rusqlite::ErrorCode as C;
        match self {
            StoreError::Sql(rusqlite::Error::SqliteFailure(e, _)) => match e.code {
                C::DiskFull => StoreCondition::Full,
                C::ReadOnly | C::CannotOpen | C::PermissionDenied | C::SystemIoFailure => StoreCondition::Unwritable,
                C::DatabaseBusy | C::DatabaseLocked => StoreCondition::Busy,
                _ => StoreCondition::Other,
            },
            StoreError::Io(e) if e.kind() == std::io::ErrorKind::StorageFull => StoreCondition::Full,
            StoreError::Io(_) => StoreCondition::Unwritable,
            _ => StoreCondition::Other,
        }
    }
}

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
}

pub struct Store {
    conn: Connection,
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

impl Store {
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir)?;
        let conn = Connection::open(dir.join("abserve.db"))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        let mut s = Store { conn };
        s.migrate()?;
        Ok(s)
    }

    fn migrate(&mut self) -> Result<(), StoreError> {
        let version: i64 = self.conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        for (i, m) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            let tx = self.conn.transaction()?;
            tx.execute_batch(m)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
        }
        Ok(())
    }

    pub fn schema_version(&self) -> Result<i64, StoreError> {
        Ok(self.conn.pragma_query_value(None, "user_version", |r| r.get(0))?)
    }

    pub fn put_experiment(&self, e: &Experiment) -> Result<(), StoreError> {
        self.conn.execute(
            "INSERT INTO experiments (name, definition, updated_at) VALUES (?1, ?2, ?3)
             ON CONFLICT(name) DO UPDATE SET definition = excluded.definition, updated_at = excluded.updated_at",
            params![e.name, serde_json::to_string(e)?, now()],
        )?;
        Ok(())
    }

    /// Stores a new experiment; `false` (and nothing written) when one of that name exists. One
    /// statement, so of two concurrent creates exactly one succeeds.
    pub fn create_experiment(&self, e: &Experiment) -> Result<bool, StoreError> {
        let n = self.conn.execute(
            "INSERT INTO experiments (name, definition, updated_at) VALUES (?1, ?2, ?3) ON CONFLICT(name) DO NOTHING",
            params![e.name, serde_json::to_string(e)?, now()],
        )?;
        Ok(n == 1)
    }

    pub fn experiments(&self) -> Result<Vec<Experiment>, StoreError> {
        let mut st = self.conn.prepare("SELECT definition FROM experiments ORDER BY name")?;
        let rows = st.query_map([], |r| r.get::<_, String>(0))?;
        let mut out = vec![];
        for r in rows {
            out.push(serde_json::from_str(&r?)?);
        }
        Ok(out)
    }

    pub fn experiment(&self, name: &str) -> Result<Option<Experiment>, StoreError> {
        let d: Option<String> = self
            .conn
            .query_row("SELECT definition FROM experiments WHERE name = ?1", [name], |r| r.get(0))
            .optional()?;
        Ok(match d {
            Some(d) => Some(serde_json::from_str(&d)?),
            None => None,
        })
    }

    pub fn delete_experiment(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self.conn.execute("DELETE FROM experiments WHERE name = ?1", [name])? > 0)
    }

    pub fn record_exposure(&self, experiment: &str, x: &Exposure) -> Result<(), StoreError> {
        self.conn.execute(
            "INSERT INTO exposures (experiment, variant, unit, forced, ts, latency_ms, ttft_ms, output_tokens, error)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![experiment, x.variant, x.unit, x.forced, now(), x.latency_ms, x.ttft_ms, x.output_tokens, x.error],
        )?;
        Ok(())
    }

    /// Stores a batch atomically. Returns how many events were stored: 0 when `batch_id` was
    /// already stored (a retry).
    pub fn record_events(&mut self, experiment: &str, batch_id: Option<&str>, events: &[OutcomeEvent]) -> Result<usize, StoreError> {
        let tx = self.conn.transaction()?;
        if let Some(b) = batch_id {
            let fresh = tx.execute(
                "INSERT OR IGNORE INTO event_batches (experiment, batch_id, events) VALUES (?1, ?2, ?3)",
                params![experiment, b, events.len() as i64],
            )?;
            if fresh == 0 {
                return Ok(0);
            }
        }
        {
            let mut st = tx.prepare(
                "INSERT INTO events (experiment, unit, metric, value, ts, batch_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            let t = now();
            for e in events {
                st.execute(params![experiment, e.unit, e.metric, e.value, e.timestamp.unwrap_or(t), batch_id])?;
            }
        }
        tx.commit()?;
        Ok(events.len())
    }

    pub fn count_events(&self, experiment: &str) -> Result<u64, StoreError> {
        Ok(self.conn.query_row("SELECT COUNT(*) FROM events WHERE experiment = ?1", [experiment], |r| r.get::<_, i64>(0))? as u64)
    }

    /// Per-variant results with statistics against the control.
    pub fn results(&self, e: &Experiment) -> Result<Results, StoreError> {
        let x = self.exposure_values(&e.name)?;
        let per_unit = self.unit_means(&e.name, &x.unit_variant)?;
        let (unit_variant, exposures, auto) = (x.unit_variant, x.exposures, x.auto);
        let mut metric_values: BTreeMap<String, BTreeMap<String, Vec<f64>>> = BTreeMap::new();
        for ((metric, variant, _), (sum, n)) in per_unit {
            metric_values.entry(metric).or_default().entry(variant).or_default().push(sum / n as f64);
        }
        for ((variant, k), vals) in auto {
            metric_values.entry(k.to_string()).or_default().insert(variant, vals);
        }
        let control = &e.variants[e.control_index()].id;
        let mut units: BTreeMap<&str, u64> = BTreeMap::new();
        for v in unit_variant.values() {
            *units.entry(v.as_str()).or_insert(0) += 1;
        }
        let variants = e
            .variants
            .iter()
            .map(|v| {
                let metrics = metric_values
                    .iter()
                    .map(|(m, by_variant)| {
                        let empty = vec![];
                        let xs = by_variant.get(&v.id).unwrap_or(&empty);
                        let cs = by_variant.get(control).unwrap_or(&empty);
                        let vs_control = if &v.id == control { None } else { welch(cs, xs) };
                        (m.clone(), MetricResult { summary: summarize(xs), vs_control })
                    })
                    .collect();
                VariantResult {
                    id: v.id.clone(),
                    is_control: &v.id == control,
                    units: units.get(v.id.as_str()).copied().unwrap_or(0),
                    exposures: exposures.get(&v.id).copied().unwrap_or(0),
                    metrics,
                }
            })
            .collect::<Vec<_>>();
        let observed: Vec<u64> = variants.iter().map(|v| v.units).collect();
        Ok(Results { experiment: e.name.clone(), control: control.clone(), srm: srm(&observed, &e.weights()), variants })
    }

    /// Per unit its variant (its first non-forced exposure), exposures per variant, and the
    /// automatic metrics of every exposure (latency, TTFT, output tokens, error).
    fn exposure_values(&self, experiment: &str) -> Result<ExposureValues, StoreError> {
        let mut x = ExposureValues::default();
        let mut st = self.conn.prepare(
            "SELECT variant, unit, latency_ms, ttft_ms, output_tokens, error FROM exposures
             WHERE experiment = ?1 AND forced = 0 ORDER BY id",
        )?;
        let mut rows = st.query([experiment])?;
        while let Some(r) = rows.next()? {
            let variant: String = r.get(0)?;
            let unit: String = r.get(1)?;
            x.unit_variant.entry(unit).or_insert_with(|| variant.clone());
            *x.exposures.entry(variant.clone()).or_insert(0) += 1;
            let vals: [(&'static str, Option<f64>); 4] = [
                ("latency_ms", r.get(2)?),
                ("ttft_ms", r.get(3)?),
                ("output_tokens", r.get::<_, Option<i64>>(4)?.map(|v| v as f64)),
                ("error", Some(if r.get::<_, Option<String>>(5)?.is_some() { 1.0 } else { 0.0 })),
            ];
            for (k, v) in vals {
                if let Some(v) = v {
                    x.auto.entry((variant.clone(), k)).or_default().push(v);
                }
            }
        }
        Ok(x)
    }

    /// Outcome metrics: per (metric, variant, unit) the sum and count of the unit's values,
    /// attributed to the unit's variant (events of units never exposed are left out).
    fn unit_means(&self, experiment: &str, unit_variant: &BTreeMap<String, String>) -> Result<BTreeMap<(String, String, String), (f64, u64)>, StoreError> {
        let mut per_unit: BTreeMap<(String, String, String), (f64, u64)> = BTreeMap::new();
        let mut st = self.conn.prepare("SELECT unit, metric, value FROM events WHERE experiment = ?1")?;
        let mut rows = st.query([experiment])?;
        while let Some(r) = rows.next()? {
            let unit: String = r.get(0)?;
            let Some(variant) = unit_variant.get(&unit) else { continue };
            let metric: String = r.get(1)?;
            let value: f64 = r.get(2)?;
            let acc = per_unit.entry((metric, variant.clone(), unit)).or_insert((0.0, 0));
            acc.0 += value;
            acc.1 += 1;
        }
        Ok(per_unit)
    }
}

#[derive(Default)]
struct ExposureValues {
    unit_variant: BTreeMap<String, String>,
    exposures: BTreeMap<String, u64>,
    auto: BTreeMap<(String, &'static str), Vec<f64>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MetricResult {
    pub summary: Summary,
    pub vs_control: Option<Comparison>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VariantResult {
    pub id: String,
    pub is_control: bool,
    pub units: u64,
    pub exposures: u64,
    pub metrics: BTreeMap<String, MetricResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Results {
    pub experiment: String,
    pub control: String,
    pub srm: Option<SrmCheck>,
    pub variants: Vec<VariantResult>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::parse_file;

    fn exp() -> Experiment {
        parse_file(
            "[[experiment]]\nname = \"aa\"\n[[experiment.variants]]\nid = \"a\"\n[[experiment.variants]]\nid = \"b\"\n",
        )
        .unwrap()
        .remove(0)
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("abserve-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn experiments_and_events_survive_reopening_and_batches_count_once() {
        let dir = tmp("reopen");
        let e = exp();
        {
            let mut s = Store::open(&dir).unwrap();
            assert_eq!(s.schema_version().unwrap(), MIGRATIONS.len() as i64);
            s.put_experiment(&e).unwrap();
            let ev = vec![OutcomeEvent { unit: "u1".into(), metric: "clicked".into(), value: 1.0, timestamp: None }];
            assert_eq!(s.record_events("aa", Some("batch-1"), &ev).unwrap(), 1);
            assert_eq!(s.record_events("aa", Some("batch-1"), &ev).unwrap(), 0, "a retried batch is not stored twice");
            assert_eq!(s.record_events("aa", None, &ev).unwrap(), 1);
        }
        let s = Store::open(&dir).unwrap();
        assert_eq!(s.experiment("aa").unwrap(), Some(e));
        assert_eq!(s.count_events("aa").unwrap(), 2);
        assert!(s.delete_experiment("aa").unwrap());
        assert_eq!(s.experiment("aa").unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn of_two_creates_of_one_name_exactly_one_succeeds() {
        let dir = tmp("create");
        let s = Store::open(&dir).unwrap();
        let e = exp();
        assert!(s.create_experiment(&e).unwrap());
        let mut other = e.clone();
        other.coverage = 0.5;
        assert!(!s.create_experiment(&other).unwrap(), "the name exists");
        assert_eq!(s.experiment("aa").unwrap(), Some(e), "the first definition stays");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn results_attribute_events_to_the_units_variant_and_skip_forced() {
        let dir = tmp("results");
        let e = exp();
        let mut s = Store::open(&dir).unwrap();
        for i in 0..40 {
            let variant = if i % 2 == 0 { "a" } else { "b" };
            let x = Exposure {
                variant: variant.into(),
                unit: format!("u{i}"),
                forced: false,
                latency_ms: Some(100.0 + i as f64),
                ttft_ms: Some(10.0),
                output_tokens: Some(20),
                error: None,
            };
            s.record_exposure("aa", &x).unwrap();
            let value = if variant == "b" { 2.0 + (i % 3) as f64 } else { 1.0 + (i % 3) as f64 };
            s.record_events("aa", None, &[OutcomeEvent { unit: format!("u{i}"), metric: "score".into(), value, timestamp: None }])
                .unwrap();
        }
        // a forced exposure is not counted
        let forced = Exposure { variant: "b".into(), unit: "qa".into(), forced: true, latency_ms: None, ttft_ms: None, output_tokens: None, error: None };
        s.record_exposure("aa", &forced).unwrap();
        let r = s.results(&e).unwrap();
        assert_eq!(r.variants[0].units, 20);
        assert_eq!(r.variants[1].units, 20);
        assert!(!r.srm.as_ref().unwrap().mismatch);
        let b = &r.variants[1].metrics["score"];
        assert!(b.vs_control.unwrap().diff > 0.9);
        assert!(r.variants[0].metrics["score"].vs_control.is_none());
        assert_eq!(r.variants[0].metrics["latency_ms"].summary.n, 20);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
