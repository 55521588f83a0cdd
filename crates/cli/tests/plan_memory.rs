//! `abserve plan` reads the GGUF header only: it never loads the weights it plans for.
//!
//! Its own test binary, with one test and one child: the child's peak RSS is then
//! `getrusage(RUSAGE_CHILDREN)`. On Linux a child's peak also counts the parent's memory at the
//! moment of exec, so other tests in the same process (one of cli.rs reads the whole model into
//! memory) would inflate it. That can only make the check stricter, never let a load pass.

mod support;

use std::process::Command;

use abserve_engine::gguf::GgufHeader;

#[test]
fn plan_peak_rss_stays_below_half_the_weights() {
    let m = support::model();
    let out = Command::new(env!("CARGO_BIN_EXE_abserve"))
        .args(["plan", "--json", "--model", m.to_str().unwrap()])
        .output()
        .expect("run abserve");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let weights = GgufHeader::read(&m).unwrap().weights_bytes();
    assert_eq!(v["weights_bytes"].as_u64(), Some(weights));
    // SAFETY: getrusage only writes the struct it is given
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) },
        0
    );
    // ru_maxrss is in KiB on Linux; loading would touch every weight page (llama.cpp reads or
    // maps and repacks them all)
    let peak = usage.ru_maxrss as u64 * 1024;
    assert!(
        peak < weights / 2,
        "plan's peak RSS {peak} bytes is not below half the weights ({weights} bytes): did it load the model?"
    );
}
