//! What the fixture tests share.

use serde_json::Value;

/// A fixture's array of numbers.
#[allow(dead_code)]
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// `a` equals the fixture's reference value to 1e-6 (relative above 1).
#[allow(dead_code)]
pub fn close(a: f64, b: &Value, what: &str) {
    let b = b
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: no reference value"));
    assert!(
        (a - b).abs() <= 1e-6 * b.abs().max(1.0),
        "{what}: {a} vs reference {b}"
    );
}
