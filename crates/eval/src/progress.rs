//! Progress of a run: an indicatif bar on a terminal (done/total, ETA, tokens/s, memory of the
//! process holding the model), plain lines every few seconds otherwise (CI logs, pipes).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use abserve_engine::plan::human_bytes;
use indicatif::{ProgressBar, ProgressStyle};

pub struct Progress {
    bar: Option<ProgressBar>,
    label: String,
    total: u64,
    started: Instant,
    last_line: std::sync::Mutex<Instant>,
}

impl Progress {
    pub fn new(label: &str, total: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(total);
            b.set_style(
                ProgressStyle::with_template(
                    "{prefix:>8} [{bar:30.cyan/blue}] {pos}/{len} {elapsed}<{eta} {msg}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            b.set_prefix(label.to_string());
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        Progress {
            bar,
            label: label.into(),
            total,
            started: Instant::now(),
            last_line: std::sync::Mutex::new(Instant::now()),
        }
    }

    /// Updates the counters; `memory` is the model process's resident bytes when known.
    pub fn update(&self, done: u64, tokens: u64, memory: Option<u64>) {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let mem = memory
            .map(|m| format!(", rss {}", human_bytes(m)))
            .unwrap_or_default();
        let rate = if tokens > 0 {
            format!("{:.1} tok/s", tokens as f64 / secs)
        } else {
            String::new()
        };
        let msg = format!("{rate}{mem}").trim_start_matches(", ").to_string();
        match &self.bar {
            Some(b) => {
                b.set_position(done);
                b.set_message(msg);
            }
            None => {
                let mut last = self.last_line.lock().unwrap_or_else(|e| e.into_inner());
                if last.elapsed() >= Duration::from_secs(5) || done == self.total {
                    *last = Instant::now();
                    let eta = if done > 0 && done < self.total {
                        format!(
                            ", eta {:.0} s",
                            secs / done as f64 * (self.total - done) as f64
                        )
                    } else {
                        String::new()
                    };
                    let sep = if msg.is_empty() { "" } else { ", " };
                    eprintln!(
                        "{}: {done}/{} done in {secs:.0} s{sep}{msg}{eta}",
                        self.label, self.total
                    );
                }
            }
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish();
        }
    }
}
