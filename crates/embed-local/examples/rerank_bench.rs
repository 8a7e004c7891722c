//! Time of the reranker per (question, passage) pair, for BENCHMARKS.md:
//! `cd crates/embed-local && cargo run --release --example rerank_bench [CANDIDATES] [PASSAGE_CHARS]`.
use std::time::Instant;

use rag_embed_local::{CrossEncoder, LoadOptions};

fn main() {
    let mut args = std::env::args().skip(1);
    let candidates: usize = args
        .next()
        .map_or(30, |value| value.parse().expect("candidates"));
    let passage_chars: usize = args
        .next()
        .map_or(500, |value| value.parse().expect("chars"));
    let dir = rag_embed_local::default_reranker_dir();
    let model = CrossEncoder::load_with(&dir, &LoadOptions::default(), None)
        .unwrap_or_else(|error| panic!("{}: {error} (run scripts/fetch-model)", dir.display()));
    let sentence = "The package manager resolves dependencies, downloads archives from the configured mirrors and verifies their signatures before unpacking. ";
    let passages: Vec<String> = (0..candidates)
        .map(|index| {
            let mut text = format!("Section {index}. ");
            while text.len() < passage_chars {
                text.push_str(sentence);
            }
            text.truncate(passage_chars);
            text
        })
        .collect();
    let refs: Vec<&str> = passages.iter().map(String::as_str).collect();
    let question = "How do I verify the signatures of downloaded packages?";
    model.score(question, &refs).expect("warm-up");
    let mut times = Vec::new();
    let mut tokens = 0;
    // The longest time between two interrupt checks: how late a cancel can be acted on.
    let mut longest_between_checks: f64 = 0.0;
    for _ in 0..5 {
        let started = Instant::now();
        let mut last_check = Instant::now();
        let scored = model
            .score_interruptible(question, &refs, &mut || {
                longest_between_checks =
                    longest_between_checks.max(last_check.elapsed().as_secs_f64() * 1000.0);
                last_check = Instant::now();
                false
            })
            .expect("score");
        longest_between_checks =
            longest_between_checks.max(last_check.elapsed().as_secs_f64() * 1000.0);
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        tokens = scored.tokens;
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    println!(
        "{candidates} pairs of a question and {passage_chars}-character passages ({} tokens per pair), {} threads: median {median:.1} ms per call, {:.1} ms per pair; at most {longest_between_checks:.0} ms between two interrupt checks",
        tokens / candidates,
        model.threads(),
        median / candidates as f64
    );
}
