//! The Prometheus text exposition format, read back: every sample line becomes
//! `name{labels}` → value, with the label text exactly as the server wrote it (`abserve serve`
//! writes labels sorted by name, as the `prometheus` crate does).

use std::collections::BTreeMap;

/// The samples of one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples(pub BTreeMap<String, f64>);

/// Parses a text page. Comment (`# HELP`, `# TYPE`) and blank lines are skipped, so are lines
/// whose value does not parse; a trailing timestamp is ignored.
pub fn parse(text: &str) -> Samples {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // the series ends at the closing brace of its labels, or at the first space
        let split = match line.find('{') {
            Some(open) => match line[open..].find('}') {
                Some(close) => open + close + 1,
                None => continue,
            },
            None => match line.find(' ') {
                Some(sp) => sp,
                None => continue,
            },
        };
        let (series, rest) = line.split_at(split);
        let Some(value) = rest.split_whitespace().next() else {
            continue;
        };
        let v = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            x => match x.parse() {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        m.insert(series.to_string(), v);
    }
    Samples(m)
}

impl Samples {
    /// The value of a series written as `name` or `name{label="value",...}`.
    pub fn get(&self, series: &str) -> Option<f64> {
        self.0.get(series).copied()
    }

    /// `get`, 0 when absent.
    pub fn or_zero(&self, series: &str) -> f64 {
        self.get(series).unwrap_or(0.0)
    }

    /// Sum over every series of metric `name` whatever its labels.
    pub fn sum(&self, name: &str) -> f64 {
        self.0
            .iter()
            .filter(|(k, _)| {
                k.as_str() == name || k.strip_prefix(name).is_some_and(|r| r.starts_with('{'))
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// Does any series start with `prefix` (e.g. `abserve_`: the target is abserve)?
    pub fn has_prefix(&self, prefix: &str) -> bool {
        self.0.keys().any(|k| k.starts_with(prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_plain_labelled_and_special_values() {
        let text = "# HELP x help\n# TYPE x counter\nx 3\nabserve_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 5\n\
                    y{a=\"has space\"} 1.5e3 1700000000\nz +Inf\nbad line\nw{unclosed 1\n";
        let s = parse(text);
        assert_eq!(s.get("x"), Some(3.0));
        assert_eq!(
            s.get("abserve_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}"),
            Some(5.0)
        );
        assert_eq!(
            s.get("y{a=\"has space\"}"),
            Some(1500.0),
            "labels with spaces, timestamp ignored"
        );
        assert_eq!(s.get("z"), Some(f64::INFINITY));
        assert_eq!(s.0.len(), 4);
        assert_eq!(s.sum("abserve_requests_total"), 5.0);
        assert_eq!(s.sum("abserve_requests"), 0.0, "a name is matched whole");
        assert!(s.has_prefix("abserve_"));
    }
}
