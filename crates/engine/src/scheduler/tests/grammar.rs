//! Constrained sequences on the fake model with a JSON vocabulary: every answer that stops is a
//! complete match of its grammar, forced tokens (fast-forward) give the same tokens, text and
//! log-probabilities as decoding them one per step, in fewer steps, and survive preemption.

use super::*;
use crate::grammar::tests::json_vocab_of;
use crate::grammar::{Constraint, Grammar, Grammars};
use crate::request::GrammarOutcome;
use crate::scheduler::Speculation;

fn grammars() -> Grammars {
    Grammars::new(json_vocab_of(VOCAB), Default::default()).unwrap()
}

fn pieces() -> Vec<Vec<u8>> {
    json_vocab_of(VOCAB)
        .tokens
        .into_iter()
        .map(|t| if t.special { Vec::new() } else { t.bytes })
        .collect()
}

fn schema() -> Grammar {
    Grammar::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 4},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
            "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "minItems": 1, "maxItems": 2}
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    }))
}

struct Answer {
    tokens: Vec<i32>,
    text: String,
    logprobs: Vec<f32>,
    done: Completion,
}

fn submit_constrained(
    s: &mut Scheduler,
    prompt: Vec<i32>,
    params: SamplingParams,
    c: Constraint,
) -> UnboundedReceiver<Event> {
    let (tx, rx) = unbounded_channel();
    s.enqueue_counted(
        Request {
            constraint: Some(c),
            adapters: Default::default(),
            lease: Default::default(),
            ..Request::new(prompt, params)
        },
        tx,
    );
    rx
}

fn answer(rx: &mut UnboundedReceiver<Event>) -> Answer {
    let mut a = Answer {
        tokens: vec![],
        text: String::new(),
        logprobs: vec![],
        done: Completion {
            finish_reason: FinishReason::Length,
            prompt_tokens: 0,
            completion_tokens: 0,
            shared_prompt_tokens: 0,
            preemptions: 0,
            queue_time: Duration::ZERO,
            time_to_first_token: Duration::ZERO,
            total_time: Duration::ZERO,
            tail_text: String::new(),
            grammar: None,
            cost: None,
        },
    };
    while let Ok(e) = rx.try_recv() {
        match e {
            Event::Token {
                token,
                text,
                logprob,
            } => {
                a.tokens.push(token);
                a.text.push_str(&text);
                a.logprobs.extend(logprob.map(|l| l.logprob));
            }
            Event::Done(c) => {
                a.text.push_str(&c.tail_text);
                a.done = c;
            }
            Event::Error(e) => panic!("unexpected error {e}"),
            Event::Admitted { .. } => {}
        }
    }
    a
}

/// Runs prompts 0..n under `grammar` with fast-forward on or off, on a cache of `kv` cells.
fn run_all(
    n: i32,
    grammar: &Grammar,
    ff: bool,
    kv: usize,
    params: SamplingParams,
) -> (Vec<Answer>, u64) {
    run_on(
        n,
        grammar,
        ff,
        Fake::new(kv),
        SchedulerConfig::new(kv, 4, 256),
        params,
    )
    .0
}

/// `run_all` on a given fake and configuration, with the engine's counters.
fn run_on(
    n: i32,
    grammar: &Grammar,
    ff: bool,
    mut f: Fake,
    mut cfg: SchedulerConfig,
    params: SamplingParams,
) -> ((Vec<Answer>, u64), StatsSnapshot) {
    let g = grammars();
    cfg.fast_forward = ff;
    let stats = Arc::new(EngineStats::default());
    let mut s = Scheduler::new(cfg, stats.clone());
    f.eog = true;
    f.pieces = Some(pieces());
    let mut rxs: Vec<_> = (0..n)
        .map(|i| {
            let c = g.compile(grammar, "response_format").unwrap();
            submit_constrained(&mut s, prompt(i, 12), params.clone(), c)
        })
        .collect();
    run(&mut s, &mut f);
    let steps = stats.steps.load(Ordering::Relaxed);
    (
        (rxs.iter_mut().map(answer).collect(), steps),
        stats.snapshot(),
    )
}

#[test]
fn every_stopped_answer_matches_its_schema_and_fast_forward_changes_nothing_but_steps() {
    let params = SamplingParams {
        logprobs: Some(1),
        ..SamplingParams::greedy(120)
    };
    let (on, steps_on) = run_all(6, &schema(), true, 4096, params.clone());
    let (off, steps_off) = run_all(6, &schema(), false, 4096, params);
    for (a, b) in on.iter().zip(&off) {
        assert_eq!(a.tokens, b.tokens, "fast-forward changed the tokens");
        assert_eq!(a.text, b.text);
        assert_eq!(
            a.logprobs, b.logprobs,
            "forced tokens' log-probabilities differ"
        );
        assert_eq!(
            a.logprobs.len(),
            a.tokens.len(),
            "a token without its log-probability"
        );
        assert_eq!(a.done.completion_tokens, a.tokens.len());
        assert_eq!(a.done.finish_reason, FinishReason::Stop, "{}", a.text);
        let v: serde_json::Value =
            serde_json::from_str(&a.text).unwrap_or_else(|e| panic!("{}: {e}", a.text));
        assert!(
            v["name"].as_str().unwrap().len() <= 4 && v["age"].is_u64(),
            "{}",
            a.text
        );
        let g = a.done.grammar.unwrap();
        assert!(g.complete && g.kind == "json_schema");
        assert!(g.forced_tokens > 0, "the schema's keys are forced");
        assert_eq!(b.done.grammar.map(|g| g.forced_tokens), Some(0));
    }
    assert!(
        steps_on < steps_off,
        "fast-forward took {steps_on} steps, one per token {steps_off}"
    );
}

#[test]
fn a_stop_string_inside_forced_tokens_ends_the_answer_there() {
    let params = SamplingParams {
        stop: vec!["b".into()],
        ..SamplingParams::greedy(20)
    };
    let (on, _) = run_all(1, &Grammar::Regex("abc[0-9]{3}".into()), true, 4096, params);
    let a = &on[0];
    assert_eq!(a.text, "a");
    assert_eq!(a.done.finish_reason, FinishReason::Stop);
    assert_eq!(
        a.done.completion_tokens, 2,
        "'a' sampled, 'b' forced and cut"
    );
    assert_eq!(
        a.done.grammar,
        Some(GrammarOutcome {
            kind: "regex",
            complete: false,
            forced_tokens: 2
        })
    );
}

#[test]
fn a_length_limit_stops_inside_the_grammar_and_says_so() {
    let (on, _) = run_all(2, &schema(), true, 4096, SamplingParams::greedy(6));
    for a in on {
        assert_eq!(a.done.finish_reason, FinishReason::Length);
        assert_eq!(a.done.completion_tokens, 6);
        assert_eq!(a.tokens.len(), 6, "every counted token was sent");
        assert!(!a.done.grammar.unwrap().complete);
    }
}

#[test]
fn preempted_constrained_sequences_give_the_same_answers() {
    let params = SamplingParams {
        logprobs: Some(0),
        ..SamplingParams::greedy(120)
    };
    let (roomy, _) = run_all(6, &schema(), true, 4096, params.clone());
    // 6 sequences of 12 + ~35 tokens, 4 at a time, on 90 cells: preemption and recompute
    let (tight, _) = run_all(6, &schema(), true, 90, params);
    for (a, b) in roomy.iter().zip(&tight) {
        assert_eq!(a.tokens, b.tokens);
        assert_eq!(a.text, b.text);
        assert_eq!(a.logprobs, b.logprobs);
        assert_eq!(b.logprobs.len(), b.tokens.len());
    }
    assert!(
        tight.iter().any(|a| a.done.preemptions > 0),
        "nothing was preempted"
    );
}

#[test]
fn constrained_sequences_draft_through_the_grammar_with_answers_unchanged() {
    // the markov fake repeats itself, so drafts are proposed; the mask decides each token (a
    // sequence with forced tokens pending does not draft: those are its free drafts)
    let params = SamplingParams {
        logprobs: Some(1),
        ..SamplingParams::greedy(120)
    };
    // free choices at every position (nothing forced): the sequence drafts
    let array = Grammar::Regex("[a-z0-9]{60}".into());
    let runs: Vec<_> = [Speculation::Off, Speculation::Always]
        .into_iter()
        .map(|spec| {
            let cfg = SchedulerConfig {
                speculative: spec,
                ..SchedulerConfig::split(4, 256, 256)
            };
            let f = Fake {
                markov: Some(usize::MAX),
                ..Fake::split(4, 256)
            };
            run_on(4, &array, true, f, cfg, params.clone())
        })
        .collect();
    let ((plain, _), p) = &runs[0];
    let ((drafted, _), d) = &runs[1];
    for (a, b) in plain.iter().zip(drafted) {
        assert_eq!(a.tokens, b.tokens);
        assert_eq!(a.text, b.text);
        assert_eq!(a.logprobs, b.logprobs);
        assert!(
            b.text.len() == 60 && b.text.bytes().all(|c| c.is_ascii_alphanumeric()),
            "{}",
            b.text
        );
    }
    assert_eq!(p.draft_tokens, 0);
    assert!(
        d.draft_accepted > 0,
        "no draft accepted: {} drafted",
        d.draft_tokens
    );
}
