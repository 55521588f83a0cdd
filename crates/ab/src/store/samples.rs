//! Sampled conversations (`samples`): written in batches (already redacted: `crate::samples`),
//! read back filtered and newest first, deleted when older than their experiment's retention,
//! and erased with the rest of a unit's data on request.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{now, Pool, Store, StoreError};

/// One sampled conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// The store's id (0 before it is written).
    #[serde(default)]
    pub id: i64,
    pub experiment: String,
    pub variant: String,
    pub unit: String,
    /// The answer's id, which its exposure carries too.
    pub request_id: String,
    /// Shared by every variant's answer to one fan-out input.
    #[serde(default)]
    pub input_id: Option<String>,
    /// Seconds since the Unix epoch (set when written).
    #[serde(default)]
    pub at: f64,
    /// What the model was asked, after the variant was applied: `model`, `messages` or `prompt`,
    /// `tools`, `response_format`, sampling settings, adapters.
    pub request: Value,
    /// What it answered: `text`, `tool_calls`.
    pub response: Value,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    pub prompt_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub latency_ms: Option<f64>,
    /// A reviewer's rating (`thumbs`, `score`, `label`, `comment`, `by`), when rated.
    #[serde(default)]
    pub review: Option<Value>,
}

impl Sample {
    /// The sample as a row of an `abserve eval` dataset (JSONL): `id` (the answer's id),
    /// `input` (the client's last user message or prompt, before any variant's template), and
    /// as extra fields usable in templates `unit`, `variant`, `sampled_answer`, `input_id`.
    pub fn dataset_row(&self) -> Value {
        let mut row = serde_json::json!({
            "id": self.request_id,
            "input": self.request.get("input").cloned().unwrap_or(Value::String(String::new())),
            "unit": self.unit,
            "variant": self.variant,
            "sampled_answer": self.response.get("text").cloned().unwrap_or(Value::Null),
        });
        if let Some(i) = &self.input_id {
            row["input_id"] = Value::String(i.clone());
        }
        row
    }
}

/// Which samples to read.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SampleQuery {
    pub variant: Option<String>,
    /// Only answers that failed (`true`) or did not (`false`).
    pub error: Option<bool>,
    pub finish_reason: Option<String>,
    /// Text the request or the answer contains (case-insensitive on ASCII).
    pub q: Option<String>,
    pub unit: Option<String>,
    pub input_id: Option<String>,
    /// Only samples a reviewer rated (`true`) or not yet (`false`).
    pub reviewed: Option<bool>,
    /// Only samples whose unit has an event of this metric with a value in [`min`, `max`].
    pub metric: Option<String>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// Samples older than this id (the previous page's last).
    pub before: Option<i64>,
    /// At most this many (1-500, default 50).
    pub limit: Option<u32>,
}

/// What erasing a unit deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Erased {
    pub samples: u64,
    pub exposures: u64,
    pub events: u64,
    /// Eval runs of the experiments the unit had samples in.
    pub eval_runs: u64,
}

/// `%`, `_` and the escape itself escaped for `LIKE ... ESCAPE '\'`.
fn like(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    s.push('%');
    for c in text.to_lowercase().chars() {
        if matches!(c, '%' | '_' | '\\') {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('%');
    s
}

type Row = (
    i64,
    String,
    String,
    String,
    String,
    Option<String>,
    f64,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<f64>,
    Option<String>,
);

const COLUMNS: &str = "id, experiment, variant, unit, request_id, input_id, ts, request, response, finish_reason, error, prompt_tokens, output_tokens, latency_ms, review";

fn sample_of(r: Row) -> Sample {
    let (
        id,
        experiment,
        variant,
        unit,
        request_id,
        input_id,
        at,
        request,
        response,
        finish,
        error,
        prompt,
        output,
        latency,
        review,
    ) = r;
    Sample {
        id,
        experiment,
        variant,
        unit,
        request_id,
        input_id,
        at,
        request: serde_json::from_str(&request).unwrap_or(Value::Null),
        response: serde_json::from_str(&response).unwrap_or(Value::Null),
        finish_reason: finish,
        error,
        prompt_tokens: prompt.map(|t| t.max(0) as u64),
        output_tokens: output.map(|t| t.max(0) as u64),
        latency_ms: latency,
        review: review.and_then(|r| serde_json::from_str(&r).ok()),
    }
}

impl Store {
    /// Writes samples in one transaction (their `at` is now).
    pub async fn record_samples(&self, samples: &[Sample]) -> Result<(), StoreError> {
        let q = "INSERT INTO samples (experiment, variant, unit, request_id, input_id, ts, request, response, finish_reason, error, prompt_tokens, output_tokens, latency_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";
        let t = now();
        let int = |x: Option<u64>| x.map(|v| v.min(i64::MAX as u64) as i64);
        on_pool!(self, p => {
            let mut tx = p.begin().await?;
            for s in samples {
                sqlx::query(q)
                    .bind(&s.experiment).bind(&s.variant).bind(&s.unit).bind(&s.request_id)
                    .bind(&s.input_id).bind(t).bind(s.request.to_string()).bind(s.response.to_string())
                    .bind(&s.finish_reason).bind(&s.error).bind(int(s.prompt_tokens))
                    .bind(int(s.output_tokens)).bind(s.latency_ms)
                    .execute(&mut *tx).await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    /// The samples `f` selects as an `abserve eval` dataset (JSONL, one `Sample::dataset_row` a
    /// line, newest first), read in pages of 500 from `f.before` on; `f.limit` caps the rows
    /// (default: all). Answers the text and how many rows it has.
    pub async fn dataset(
        &self,
        experiment: &str,
        f: &SampleQuery,
    ) -> Result<(String, usize), StoreError> {
        const PAGE: u32 = 500;
        let cap = f.limit.map_or(usize::MAX, |l| l as usize);
        let mut q = f.clone();
        let (mut text, mut n) = (String::new(), 0);
        while n < cap {
            let want = (cap - n).min(PAGE as usize) as u32;
            q.limit = Some(want);
            let page = self.samples(experiment, &q).await?;
            for s in &page {
                text.push_str(&s.dataset_row().to_string());
                text.push('\n');
            }
            n += page.len();
            match page.last() {
                Some(last) if page.len() as u32 == want => q.before = Some(last.id),
                _ => break,
            }
        }
        Ok((text, n))
    }

    /// An experiment's samples that `f` selects, newest first.
    pub async fn samples(
        &self,
        experiment: &str,
        f: &SampleQuery,
    ) -> Result<Vec<Sample>, StoreError> {
        let text = f.q.as_deref().filter(|q| !q.is_empty()).map(like);
        let q = format!("SELECT {COLUMNS}
                 FROM samples WHERE experiment = $1
                 AND ($2 IS NULL OR variant = $2)
                 AND ($3 IS NULL OR ($3 = (error IS NOT NULL)))
                 AND ($4 IS NULL OR finish_reason = $4)
                 AND ($5 IS NULL OR LOWER(request) LIKE $5 ESCAPE '\\' OR LOWER(response) LIKE $5 ESCAPE '\\')
                 AND ($6 IS NULL OR unit = $6)
                 AND ($7 IS NULL OR input_id = $7)
                 AND ($8 IS NULL OR id < $8)
                 AND ($10 IS NULL OR ($10 = (review IS NOT NULL)))
                 AND ($11 IS NULL OR unit IN (SELECT unit FROM events WHERE experiment = $1 AND metric = $11
                      AND value >= COALESCE($12, value) AND value <= COALESCE($13, value)))
                 ORDER BY id DESC LIMIT $9");
        let limit = i64::from(f.limit.unwrap_or(50));
        let rows: Vec<Row> = on_pool!(self, p => sqlx::query_as(&q)
            .bind(experiment).bind(&f.variant).bind(f.error).bind(&f.finish_reason).bind(&text)
            .bind(&f.unit).bind(&f.input_id).bind(f.before).bind(limit)
            .bind(f.reviewed).bind(&f.metric).bind(f.min).bind(f.max)
            .fetch_all(p).await?);
        Ok(rows.into_iter().map(sample_of).collect())
    }

    /// Sample `id` of `experiment`.
    pub async fn sample(&self, experiment: &str, id: i64) -> Result<Option<Sample>, StoreError> {
        let q = format!("SELECT {COLUMNS} FROM samples WHERE experiment = $1 AND id = $2");
        let row: Option<Row> = on_pool!(self, p => sqlx::query_as(&q).bind(experiment).bind(id).fetch_optional(p).await?);
        Ok(row.map(sample_of))
    }

    /// Merges `patch` (a JSON object) into the review of sample `id` of `experiment` in one
    /// statement, so that reviewers changing different fields at the same moment keep both
    /// changes (the same field: the last write wins). Answers the sample as it is now, `None`
    /// when the experiment has no such sample.
    pub async fn review_sample(
        &self,
        experiment: &str,
        id: i64,
        patch: &Value,
    ) -> Result<Option<Sample>, StoreError> {
        // the merge is each database's own JSON function; the rest is one statement
        let q = match &self.pool {
            Pool::Sqlite(_) => "UPDATE samples SET review = json_patch(COALESCE(review, '{}'), $1) WHERE experiment = $2 AND id = $3",
            Pool::Postgres(_) => "UPDATE samples SET review = (COALESCE(review, '{}')::jsonb || $1::jsonb)::text WHERE experiment = $2 AND id = $3",
        };
        let n = on_pool!(self, p => sqlx::query(q).bind(patch.to_string()).bind(experiment).bind(id)
            .execute(p).await?.rows_affected());
        if n == 0 {
            return Ok(None);
        }
        self.sample(experiment, id).await
    }

    /// How many samples of `experiment` were written at or after `since` (seconds since the
    /// epoch), by any replica: what its daily cap counts.
    pub async fn samples_since(&self, experiment: &str, since: f64) -> Result<u64, StoreError> {
        let q = "SELECT COUNT(*) FROM samples WHERE experiment = $1 AND ts >= $2";
        let n: i64 = on_pool!(self, p => sqlx::query_scalar(q).bind(experiment).bind(since).fetch_one(p).await?);
        Ok(n.max(0) as u64)
    }

    /// Deletes an experiment's samples written before `before` (seconds since the epoch), and its
    /// eval runs started before it (their reports hold samples' text); answers how many samples.
    pub async fn delete_samples_before(
        &self,
        experiment: &str,
        before: f64,
    ) -> Result<u64, StoreError> {
        let q = "DELETE FROM samples WHERE experiment = $1 AND ts < $2";
        let runs = "DELETE FROM eval_runs WHERE experiment = $1 AND ts < $2";
        Ok(on_pool!(self, p => {
            let mut tx = p.begin().await?;
            let n = sqlx::query(q).bind(experiment).bind(before).execute(&mut *tx).await?.rows_affected();
            sqlx::query(runs).bind(experiment).bind(before).execute(&mut *tx).await?;
            tx.commit().await?;
            n
        }))
    }

    /// Deletes everything stored of `unit` — its samples, exposures and events, and the eval runs
    /// of the experiments it has samples in (their reports may hold its inputs) — in one
    /// experiment, or in every one (`None`), in one transaction.
    pub async fn erase_unit(
        &self,
        unit: &str,
        experiment: Option<&str>,
    ) -> Result<Erased, StoreError> {
        let runs = "DELETE FROM eval_runs WHERE experiment IN (SELECT DISTINCT experiment FROM samples WHERE unit = $1 AND ($2 IS NULL OR experiment = $2))";
        let tables = ["samples", "exposures", "events"];
        let mut n = [0u64; 4];
        on_pool!(self, p => {
            let mut tx = p.begin().await?;
            n[3] = sqlx::query(runs).bind(unit).bind(experiment).execute(&mut *tx).await?.rows_affected();
            for (i, t) in tables.iter().enumerate() {
                let q = format!("DELETE FROM {t} WHERE unit = $1 AND ($2 IS NULL OR experiment = $2)");
                n[i] = sqlx::query(&q).bind(unit).bind(experiment).execute(&mut *tx).await?.rows_affected();
            }
            tx.commit().await?;
        });
        Ok(Erased {
            samples: n[0],
            exposures: n[1],
            events: n[2],
            eval_runs: n[3],
        })
    }
}
