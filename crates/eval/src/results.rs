//! The run's durable record: `results.jsonl` (one line per input × variant) and
//! `judgments.jsonl` (one line per judged pair). Lines are appended whole and flushed as each
//! answer finishes, so a crash or Ctrl-C loses nothing finished; a rerun reads the files, cuts a
//! torn last line, and skips what is done.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::EvalError;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ResultRow {
    pub row: String,
    pub line: usize,
    pub variant: String,
    pub input: String,
    pub expected: Option<String>,
    pub output: Option<String>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub ttft_ms: Option<f64>,
    pub latency_ms: Option<f64>,
    pub finish_reason: Option<String>,
    /// Scorer name → score (1/0 for pass/fail); absent when the scorer could not score.
    pub scores: BTreeMap<String, f64>,
    /// Scorer name → why it could not score this row.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub score_errors: BTreeMap<String, String>,
    pub error: Option<String>,
    pub attempts: u32,
}

impl ResultRow {
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.output.is_some()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Win,
    Loss,
    Tie,
    /// The two orders gave different verdicts: the judge followed the position, not the
    /// answers; counted in no win rate.
    Inconsistent,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Judgment {
    pub row: String,
    pub variant: String,
    pub control: String,
    /// Where the variant's answer was shown: "both" (asked in both orders: `reply` with the
    /// variant as "A", `reply_swapped` with it as "B"); "A" or "B" in logs of earlier versions.
    pub variant_position: String,
    pub reply: Option<String>,
    #[serde(default)]
    pub reply_swapped: Option<String>,
    /// The variant against control; `None` when the judge could not be asked.
    pub verdict: Option<Verdict>,
    pub error: Option<String>,
}

/// An append-only JSONL file of `T`.
pub struct Log {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl Log {
    /// Opens (creating) the file and returns what it already holds. A last line without its
    /// newline was torn by a crash: it is cut off and that item runs again.
    pub fn open<T: DeserializeOwned>(path: &Path) -> Result<(Log, Vec<T>), EvalError> {
        let mut text = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(EvalError::io(path)(e)),
        };
        let keep = text
            .iter()
            .rposition(|&b| b == b'\n')
            .map(|p| p + 1)
            .unwrap_or(0);
        if keep < text.len() {
            text.truncate(keep);
            std::fs::write(path, &text).map_err(EvalError::io(path))?;
        }
        let mut items = Vec::new();
        for (i, line) in String::from_utf8_lossy(&text).lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |e: serde_json::Error| EvalError::Log {
                path: path.to_path_buf(),
                line: i + 1,
                message: e.to_string(),
            };
            items.push(serde_json::from_str(line).map_err(bad)?);
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(EvalError::io(path))?;
        Ok((
            Log {
                path: path.to_path_buf(),
                file: Mutex::new(file),
            },
            items,
        ))
    }

    /// Appends one line in a single write.
    pub fn append<T: Serialize>(&self, item: &T) -> Result<(), EvalError> {
        let mut line = serde_json::to_vec(item).map_err(|e| EvalError::io(&self.path)(e.into()))?;
        line.push(b'\n');
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        f.write_all(&line)
            .and_then(|_| f.flush())
            .map_err(EvalError::io(&self.path))
    }
}

/// The last line per (row, variant): a rerun may append a retry of a failed row.
pub fn latest(rows: Vec<ResultRow>) -> BTreeMap<(String, String), ResultRow> {
    rows.into_iter()
        .map(|r| ((r.row.clone(), r.variant.clone()), r))
        .collect()
}

pub fn latest_judgments(js: Vec<Judgment>) -> BTreeMap<(String, String), Judgment> {
    js.into_iter()
        .map(|j| ((j.row.clone(), j.variant.clone()), j))
        .collect()
}

/// The verdict counts of a variant (for the tests and the report).
pub fn tally(js: &BTreeMap<(String, String), Judgment>, variant: &str) -> (u64, u64, u64) {
    let mut t = (0, 0, 0);
    for j in js.values().filter(|j| j.variant == variant) {
        match j.verdict {
            Some(Verdict::Win) => t.0 += 1,
            Some(Verdict::Loss) => t.1 += 1,
            Some(Verdict::Tie) => t.2 += 1,
            Some(Verdict::Inconsistent) | None => {}
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_last_line_is_cut_and_appends_continue() {
        let dir = std::env::temp_dir().join(format!("abserve-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("j.jsonl");
        std::fs::write(&p, "{\"a\":1}\n{\"a\":2}\n{\"a\":").unwrap();
        let (log, items) = Log::open::<serde_json::Value>(&p).unwrap();
        assert_eq!(items.len(), 2);
        log.append(&serde_json::json!({"a": 3})).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
