//! Datasets: JSONL (one object per line) or CSV (a header row), one input per row, with an
//! optional `expected` answer, an optional `id` and any extra fields, all usable in templates.
//! A malformed row is reported with its line number and left out; the other rows still run.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::EvalError;

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The row's `id` field, or `line-N` when it has none.
    pub id: String,
    /// 1-based line in the file (CSV: the record's line).
    pub line: usize,
    pub fields: Map<String, Value>,
}

impl Row {
    pub fn input(&self) -> &str {
        self.fields
            .get("input")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    pub fn expected(&self) -> Option<String> {
        self.fields.get("expected").map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BadRow {
    pub line: usize,
    pub reason: String,
}

#[derive(Debug, Default)]
pub struct Dataset {
    pub rows: Vec<Row>,
    pub bad: Vec<BadRow>,
}

impl Dataset {
    pub fn load(path: &Path) -> Result<Dataset, EvalError> {
        let text = std::fs::read_to_string(path).map_err(EvalError::io(path))?;
        let csv = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("csv"));
        let d = if csv {
            Self::from_csv(&text)?
        } else {
            Self::from_jsonl(&text)
        };
        if d.rows.is_empty() {
            let why = d
                .bad
                .first()
                .map(|b| format!(" (line {}: {})", b.line, b.reason))
                .unwrap_or_default();
            return Err(EvalError::Dataset(format!(
                "dataset {} has no usable rows{why}",
                path.display()
            )));
        }
        Ok(d)
    }

    pub fn from_jsonl(text: &str) -> Dataset {
        let mut d = Dataset::default();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Value>(line) {
                Ok(Value::Object(m)) => d.push(i + 1, m),
                Ok(_) => d.bad.push(BadRow {
                    line: i + 1,
                    reason: "not a JSON object".into(),
                }),
                Err(e) => d.bad.push(BadRow {
                    line: i + 1,
                    reason: format!("not JSON: {e}"),
                }),
            }
        }
        d
    }

    pub fn from_csv(text: &str) -> Result<Dataset, EvalError> {
        let mut r = csv::ReaderBuilder::new()
            .flexible(true)
            .from_reader(text.as_bytes());
        let headers = r
            .headers()
            .map_err(|e| EvalError::Dataset(format!("CSV header: {e}")))?
            .clone();
        if !headers.iter().any(|h| h == "input") {
            return Err(EvalError::Dataset(format!(
                "CSV header has no 'input' column (columns: {})",
                headers.iter().collect::<Vec<_>>().join(", ")
            )));
        }
        let mut d = Dataset::default();
        for rec in r.records() {
            match rec {
                Ok(rec) => {
                    let line = rec.position().map(|p| p.line() as usize).unwrap_or(0);
                    if rec.len() != headers.len() {
                        d.bad.push(BadRow {
                            line,
                            reason: format!(
                                "has {} fields, the header has {}",
                                rec.len(),
                                headers.len()
                            ),
                        });
                        continue;
                    }
                    let m = headers
                        .iter()
                        .zip(rec.iter())
                        .map(|(h, v)| (h.to_string(), Value::String(v.to_string())))
                        .collect();
                    d.push(line, m);
                }
                Err(e) => {
                    let line = e.position().map(|p| p.line() as usize).unwrap_or(0);
                    d.bad.push(BadRow {
                        line,
                        reason: e.to_string(),
                    });
                }
            }
        }
        Ok(d)
    }

    fn push(&mut self, line: usize, fields: Map<String, Value>) {
        let reason = match fields.get("input") {
            None => Some("has no 'input' field".to_string()),
            Some(Value::String(s)) if s.trim().is_empty() => Some("'input' is empty".into()),
            Some(Value::String(_)) => None,
            Some(_) => Some("'input' is not a string".into()),
        };
        if let Some(reason) = reason {
            self.bad.push(BadRow { line, reason });
            return;
        }
        let id = match fields.get("id") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => format!("line-{line}"),
        };
        if self.rows.iter().any(|r| r.id == id) {
            self.bad.push(BadRow {
                line,
                reason: format!("duplicate id '{id}'"),
            });
            return;
        }
        self.rows.push(Row { id, line, fields });
    }

    /// Every field name some row has.
    pub fn fields(&self) -> BTreeSet<String> {
        self.rows
            .iter()
            .flat_map(|r| r.fields.keys().cloned())
            .collect()
    }

    /// Checks that the templates' variables exist: a variable that no row has is an error
    /// (`what` names the template); rows that lack one are moved to `bad`.
    pub fn require(
        &mut self,
        what: &str,
        vars: &BTreeSet<String>,
        provided: &HashSet<&str>,
    ) -> Result<(), EvalError> {
        let have = self.fields();
        for v in vars {
            if !provided.contains(v.as_str()) && !have.contains(v) {
                return Err(EvalError::Dataset(format!(
                    "{what} refers to '{v}', which no dataset row has (fields: {})",
                    have.iter().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
        }
        let mut keep = Vec::with_capacity(self.rows.len());
        for r in self.rows.drain(..) {
            match vars
                .iter()
                .find(|v| !provided.contains(v.as_str()) && !r.fields.contains_key(*v))
            {
                Some(v) => self.bad.push(BadRow {
                    line: r.line,
                    reason: format!("has no '{v}' field, which {what} uses"),
                }),
                None => keep.push(r),
            }
        }
        self.rows = keep;
        self.bad.sort_by_key(|b| b.line);
        Ok(())
    }
}

/// 64-bit FNV-1a: a hash that is stable across runs and platforms (seeds, judge order).
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_jsonl_rows_are_reported_by_line_and_the_rest_kept() {
        let text = "{\"input\": \"a\", \"expected\": \"x\"}\n\nnot json\n[1]\n{\"input\": 3}\n{\"id\": 7, \"input\": \"b\"}\n{\"id\": 7, \"input\": \"c\"}\n";
        let d = Dataset::from_jsonl(text);
        assert_eq!(
            d.rows.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["line-1", "7"]
        );
        let lines: Vec<usize> = d.bad.iter().map(|b| b.line).collect();
        assert_eq!(lines, [3, 4, 5, 7]);
        assert!(d.bad[3].reason.contains("duplicate id '7'"));
        assert_eq!(d.rows[0].expected().as_deref(), Some("x"));
    }

    #[test]
    fn csv_needs_an_input_column_and_reports_ragged_rows() {
        let d = Dataset::from_csv(
            "id,input,expected\nq1,\"Hello, there\",hi\nq2,only two\nq3,bye,ciao\n",
        )
        .unwrap();
        assert_eq!(d.rows.len(), 2);
        assert_eq!(d.rows[0].input(), "Hello, there");
        assert_eq!(
            d.bad,
            vec![BadRow {
                line: 3,
                reason: "has 2 fields, the header has 3".into()
            }]
        );
        assert!(Dataset::from_csv("question\nx\n")
            .unwrap_err()
            .to_string()
            .contains("no 'input' column"));
    }

    #[test]
    fn missing_template_fields() {
        let mut d =
            Dataset::from_jsonl("{\"input\": \"a\", \"topic\": \"t\"}\n{\"input\": \"b\"}\n");
        let provided: HashSet<&str> = HashSet::new();
        let nowhere: BTreeSet<String> = ["colour".to_string()].into();
        let e = d
            .require("variant 'x'", &nowhere, &provided)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'colour', which no dataset row has") && e.contains("input, topic"),
            "{e}"
        );
        let some: BTreeSet<String> = ["topic".to_string()].into();
        d.require("variant 'x'", &some, &provided).unwrap();
        assert_eq!(d.rows.len(), 1);
        assert_eq!(d.bad[0].line, 2);
    }
}
