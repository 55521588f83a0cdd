//! Budgets and sizes as people write them (`2GiB`, `512MB`, `50%`) and read them.

/// A memory budget as the user wrote it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    Bytes(u64),
    /// A fraction (0, 1] of the memory available to this process (or of `--device-memory`).
    Fraction(f64),
}

impl std::str::FromStr for Budget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p
                .trim()
                .parse()
                .map_err(|_| format!("bad percentage '{s}'"))?;
            if !(v > 0.0 && v <= 100.0) {
                return Err(format!("percentage '{s}' must be in (0, 100]"));
            }
            return Ok(Budget::Fraction(v / 100.0));
        }
        parse_bytes(t).map(Budget::Bytes)
    }
}

/// Parses `2GiB`, `512MB`, `1.5G`, `1000000` into bytes (K/M/G/T are powers of 1024 when
/// written with `i`, of 1000 with a plain `B`; a bare suffix like `G` means GiB as in `ulimit`).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .trim()
        .replace('_', "")
        .parse()
        .map_err(|_| format!("bad size '{s}'"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024f64.powi(2),
        "mb" => 1e6,
        "g" | "gib" => 1024f64.powi(3),
        "gb" => 1e9,
        "t" | "tib" => 1024f64.powi(4),
        "tb" => 1e12,
        other => return Err(format!("unknown size unit '{other}' in '{s}'")),
    };
    if v < 0.0 || !v.is_finite() {
        return Err(format!("bad size '{s}'"));
    }
    Ok((v * mult) as u64)
}

pub fn human_bytes(b: u64) -> String {
    let b = b as f64;
    if b >= 1024f64.powi(3) {
        format!("{:.1} GiB", b / 1024f64.powi(3))
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{b} B")
    }
}
