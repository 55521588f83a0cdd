//! Measures the ways of running sequences under different LoRA adapters on one shared model
//! (issue 29's scheduling question), on llama.cpp directly, greedy decode only:
//!
//! - `switch`: one context; every step decodes each adapter's sequences as its own batch,
//!   changing the context's adapter between them (llama.cpp reserves its graphs again at each
//!   change);
//! - `turns`: one context; an adapter keeps the context for `--turn` steps (abserve's
//!   `--adapter-turn`, default 8) while the other adapters' sequences wait;
//! - `contexts`: one context per adapter on the same weights (KV divided between them), each
//!   adapter fixed; every step decodes them one after another with all threads;
//! - `parallel`: one context per adapter, each decoding on its own OS thread with
//!   `threads / adapters` (at least 1) llama.cpp threads, side by side;
//! - `one-adapter`: reference, every sequence under the first adapter in one context (what a
//!   per-row adapter in the graph could approach).
//!
//! ```text
//! cargo run --release -p abserve-engine --example adapter_schedules -- MODEL A1 A2 A3 A4 \
//!     [--clients 16] [--tokens 64] [--threads 2] [--turn 8] [--runs 3] [--ubatch 512]
//! ```
//! Prints tokens per second (decode only, prompts prefilled untimed) and the compute and KV
//! buffer bytes llama.cpp allocated for each option, medians of `--runs`.

use std::ffi::CStr;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Instant;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaLoraAdapter, LlamaModel};
use llama_cpp_2::token::LlamaToken;

const CELLS_PER_SEQ: u32 = 512;
static BUFFERS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// # Safety
/// llama.cpp calls it with `text` null or NUL-terminated for the call.
unsafe extern "C" fn log(
    _level: llama_cpp_sys_2::ggml_log_level,
    text: *const std::os::raw::c_char,
    _: *mut std::os::raw::c_void,
) {
    if text.is_null() {
        return;
    }
    // SAFETY: not null, NUL-terminated for the duration of the call (llama.cpp's logger)
    let s = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    if s.contains("buffer size") && (s.contains("compute") || s.contains("KV")) {
        BUFFERS.lock().unwrap().push(s.trim().to_string());
    }
}

fn buffer_mib() -> f64 {
    let lines = std::mem::take(&mut *BUFFERS.lock().unwrap());
    lines
        .iter()
        .filter_map(|l| {
            l.rsplit('=')
                .next()?
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
        })
        .sum()
}

struct Args {
    model: String,
    adapters: Vec<String>,
    clients: usize,
    tokens: usize,
    threads: i32,
    turn: usize,
    runs: usize,
    /// llama.cpp's micro-batch (and batch) in tokens: the compute buffer scales with it
    ubatch: u32,
}

fn args() -> Args {
    let mut a = Args {
        model: String::new(),
        adapters: vec![],
        clients: 16,
        tokens: 64,
        threads: 2,
        turn: 8,
        runs: 3,
        ubatch: CELLS_PER_SEQ,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let mut num = || {
            it.next()
                .and_then(|v| v.parse::<usize>().ok())
                .expect("a number")
        };
        match x.as_str() {
            "--clients" => a.clients = num(),
            "--tokens" => a.tokens = num(),
            "--threads" => a.threads = num() as i32,
            "--turn" => a.turn = num(),
            "--runs" => a.runs = num(),
            "--ubatch" => a.ubatch = num() as u32,
            _ if a.model.is_empty() => a.model = x,
            _ => a.adapters.push(x),
        }
    }
    assert!(
        !a.model.is_empty() && !a.adapters.is_empty(),
        "MODEL ADAPTER..."
    );
    a
}

/// One group of sequences that share a context.
struct Group<'m> {
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    /// (seq id in this context, adapter index, position, last token)
    seqs: Vec<(i32, usize, i32, i32)>,
}

fn context<'m>(
    m: &'m LlamaModel,
    b: &LlamaBackend,
    seqs: usize,
    threads: i32,
    ubatch: u32,
) -> LlamaContext<'m> {
    let p = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(CELLS_PER_SEQ * seqs as u32))
        .with_n_batch(ubatch)
        .with_n_ubatch(ubatch)
        .with_n_seq_max(seqs as u32)
        .with_kv_unified(false)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    m.new_context(b, p).expect("context")
}

fn argmax(l: &[f32]) -> i32 {
    let mut best = 0;
    for (i, v) in l.iter().enumerate() {
        if *v > l[best] {
            best = i;
        }
    }
    best as i32
}

/// Decodes one token for the sequences of `g` under `adapter` (all of them when `None`).
fn step(g: &mut Group, adapter: Option<usize>) {
    g.batch.clear();
    let idx: Vec<usize> = (0..g.seqs.len())
        .filter(|&i| adapter.is_none_or(|a| g.seqs[i].1 == a))
        .collect();
    for &i in &idx {
        let (seq, _, pos, tok) = g.seqs[i];
        g.batch.add(LlamaToken(tok), pos, &[seq], true).unwrap();
    }
    g.ctx.decode(&mut g.batch).expect("decode");
    for (k, &i) in idx.iter().enumerate() {
        let t = argmax(g.ctx.get_logits_ith(k as i32));
        g.seqs[i].2 += 1;
        g.seqs[i].3 = t;
    }
}

/// Prefills every sequence's prompt (adapter by adapter), untimed.
fn prefill(g: &mut Group, prompt: &[LlamaToken], loras: &mut [LlamaLoraAdapter], fixed: bool) {
    let adapters: Vec<usize> = {
        let mut v: Vec<usize> = g.seqs.iter().map(|s| s.1).collect();
        v.sort();
        v.dedup();
        v
    };
    for a in adapters {
        if !fixed {
            g.ctx.lora_adapter_set(&mut loras[a], 1.0).unwrap();
        }
        for i in 0..g.seqs.len() {
            if g.seqs[i].1 != a {
                continue;
            }
            g.batch.clear();
            let seq = g.seqs[i].0;
            for (p, t) in prompt.iter().enumerate() {
                g.batch
                    .add(*t, p as i32, &[seq], p + 1 == prompt.len())
                    .unwrap();
            }
            g.ctx.decode(&mut g.batch).expect("prefill");
            g.seqs[i].2 = prompt.len() as i32;
            g.seqs[i].3 = argmax(g.ctx.get_logits_ith(prompt.len() as i32 - 1));
        }
    }
}

fn group<'m>(
    m: &'m LlamaModel,
    b: &LlamaBackend,
    adapters_of: &[usize],
    threads: i32,
    ubatch: u32,
) -> Group<'m> {
    Group {
        ctx: context(m, b, adapters_of.len(), threads, ubatch),
        batch: LlamaBatch::new(CELLS_PER_SEQ as usize, 1),
        seqs: adapters_of
            .iter()
            .enumerate()
            .map(|(i, &a)| (i as i32, a, 0, 0))
            .collect(),
    }
}

/// Runs one option; returns (tokens per second, compute + KV MiB).
fn run(
    option: &str,
    a: &Args,
    m: &LlamaModel,
    b: &LlamaBackend,
    loras: &mut [LlamaLoraAdapter],
    prompt: &[LlamaToken],
) -> (f64, f64) {
    let n = a.adapters.len();
    let total = (a.clients * a.tokens) as f64;
    buffer_mib();
    match option {
        "switch" | "turns" | "one-adapter" => {
            let of: Vec<usize> = (0..a.clients)
                .map(|i| if option == "one-adapter" { 0 } else { i % n })
                .collect();
            let mut g = group(m, b, &of, a.threads, a.ubatch);
            let mib = buffer_mib();
            prefill(&mut g, prompt, loras, false);
            let t = Instant::now();
            if option == "one-adapter" {
                for _ in 0..a.tokens {
                    step(&mut g, None);
                }
            } else {
                let turn = if option == "switch" { 1 } else { a.turn.max(1) };
                let mut done = 0;
                while done < a.tokens {
                    let steps = turn.min(a.tokens - done);
                    for (ad, lora) in loras.iter_mut().enumerate() {
                        g.ctx.lora_adapter_set(lora, 1.0).unwrap();
                        for _ in 0..steps {
                            step(&mut g, Some(ad));
                        }
                    }
                    done += steps;
                }
            }
            (total / t.elapsed().as_secs_f64(), mib)
        }
        "contexts" | "parallel" => {
            let per = if option == "parallel" {
                (a.threads / n as i32).max(1)
            } else {
                a.threads
            };
            let mut groups: Vec<Group> = (0..n)
                .map(|ad| {
                    let of: Vec<usize> =
                        (0..a.clients).filter(|i| i % n == ad).map(|_| ad).collect();
                    group(m, b, &of, per, a.ubatch)
                })
                .collect();
            let mib = buffer_mib();
            for (ad, g) in groups.iter_mut().enumerate() {
                g.ctx.lora_adapter_set(&mut loras[ad], 1.0).unwrap();
                prefill(g, prompt, loras, true);
            }
            let t = Instant::now();
            if option == "contexts" {
                for _ in 0..a.tokens {
                    for g in groups.iter_mut() {
                        step(g, None);
                    }
                }
            } else {
                std::thread::scope(|s| {
                    for g in groups.iter_mut() {
                        s.spawn(|| {
                            for _ in 0..a.tokens {
                                step(g, None);
                            }
                        });
                    }
                });
            }
            (total / t.elapsed().as_secs_f64(), mib)
        }
        _ => panic!("unknown option {option}"),
    }
}

fn main() {
    let a = args();
    // SAFETY: `log` has llama.cpp's logger signature, never unwinds, keeps no user data
    unsafe { llama_cpp_sys_2::llama_log_set(Some(log), std::ptr::null_mut()) };
    let backend = LlamaBackend::init().unwrap();
    let params = LlamaModelParams::default().with_n_gpu_layers(0);
    let mut model = LlamaModel::load_from_file(&backend, &a.model, &params).expect("model");
    let mut loras: Vec<LlamaLoraAdapter> = a
        .adapters
        .iter()
        .map(|p| model.lora_adapter_init(p).expect("adapter"))
        .collect();
    let prompt: Vec<LlamaToken> = model
        .vocab()
        .tokenize(
            b"<|im_start|>user\nWrite a short story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n",
            false,
            true,
        )
        .into_iter()
        .collect();
    println!(
        "{} clients, {} adapters, {} tokens each, {} threads, turn {}, micro-batch {}, {} runs (decode tok/s; compute+KV MiB)",
        a.clients,
        a.adapters.len(),
        a.tokens,
        a.threads,
        a.turn,
        a.ubatch,
        a.runs
    );
    let options = ["switch", "turns", "contexts", "parallel", "one-adapter"];
    let mut results: Vec<(Vec<f64>, f64)> = vec![(vec![], 0.0); options.len()];
    for r in 0..a.runs {
        // options interleaved within each run, so a slow minute hits all of them
        for (i, o) in options.iter().enumerate() {
            let (tps, mib) = run(o, &a, &model, &backend, &mut loras, &prompt);
            results[i].0.push(tps);
            results[i].1 = mib;
            eprintln!("run {r} {o}: {tps:.1} tok/s");
        }
    }
    let base = median(&results[0].0);
    for (o, (t, mib)) in options.iter().zip(&results) {
        let m = median(t);
        println!(
            "{o:12} {m:7.1} tok/s  ({:.2}× switch; runs {})  {mib:6.1} MiB",
            m / base,
            t.iter()
                .map(|x| format!("{x:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[s.len() / 2]
}
