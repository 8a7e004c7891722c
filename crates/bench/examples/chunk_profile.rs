//! The chunker alone, per document over PostgreSQL's manual, for `perf record` and for comparing two builds.
//!
//! ```sh
//! cd crates/bench && cargo run --release --example chunk_profile -- [rounds]
//! ```
//! Prints a fingerprint of every chunk (text, offsets, token estimate) at four settings, then the time per
//! round at 1000/200. A change meant to be a pure speed-up must leave every fingerprint as it was.
use std::hash::{Hash, Hasher};

use rag_chunk::{chunk_text, ChunkConfig, SizeUnit};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = rag_bench::load_html_corpus(std::path::Path::new(rag_bench::DEFAULT_CORPUS_DIR))?;
    let texts: Vec<String> = files
        .iter()
        .map(|file| rag_extract::html_to_text(&file.html))
        .collect();
    for (size, overlap) in [(1000, 200), (500, 0), (2000, 100), (200, 50)] {
        let config = ChunkConfig::new(size, overlap, SizeUnit::Characters)?;
        // DefaultHasher's algorithm is fixed within one toolchain, which is all a before/after comparison needs.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for text in &texts {
            for chunk in chunk_text(text, &config) {
                (
                    chunk.text,
                    chunk.char_start,
                    chunk.char_end,
                    chunk.token_estimate,
                )
                    .hash(&mut hasher);
            }
        }
        println!("{size}/{overlap}: {:016x}", hasher.finish());
    }
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(10);
    let config = ChunkConfig::new(1000, 200, SizeUnit::Characters)?;
    let started = std::time::Instant::now();
    let mut chunks = 0;
    for _ in 0..rounds {
        for text in &texts {
            chunks += chunk_text(text, &config).len();
        }
    }
    println!(
        "{chunks} chunks in {rounds} rounds, {:.1} ms per round",
        started.elapsed().as_secs_f64() * 1000.0 / rounds.max(1) as f64
    );
    Ok(())
}
