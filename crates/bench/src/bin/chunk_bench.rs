//! Chunker throughput: `rag_chunk` against the `text-splitter` crate (what pg_vectorize uses), in one run on the
//! same corpus, at the same size and overlap.
//!
//! ```text
//! cd crates/bench && CARGO_TARGET_DIR=/work/main/target/crates cargo run --release --bin chunk_bench \
//!     [-- --iterations 5] [--corpus /usr/share/doc/postgresql-doc-15/html]
//! ```
//!
//! The corpus is PostgreSQL's HTML manual turned into text by `rag_extract::html_to_text`, one document per file.
//! Each setting is measured two ways: per document (how `rag_ingest` uses a chunker, one call per document) and as
//! the whole corpus joined into one text (how a chunker copes with one multi-megabyte document). The output is
//! Markdown, ready to paste into BENCHMARKS.md.

use std::process::ExitCode;

use rag_bench::{
    corpus_dir_from_args, iterations_from_args, load_html_corpus, megabytes_per_second, BenchError,
    LengthStats, Machine, Samples,
};
use rag_chunk::{chunk_text, SizeUnit};
use text_splitter::TextSplitter;

/// Must match the `=` requirement in Cargo.toml; printed so a result always names the version it was measured on.
const TEXT_SPLITTER_VERSION: &str = "0.33.1";

/// (chunk size, overlap) in characters, as the brief asks; 1000/200 is the extension's default.
const SETTINGS: [(usize, usize); 3] = [(1000, 200), (500, 0), (2000, 100)];

/// Joins documents in whole-corpus mode: a blank line is a paragraph break for both splitters, so no sentence of
/// one file runs into the next.
const DOCUMENT_SEPARATOR: &str = "\n\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    PerDocument,
    WholeCorpus,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::PerDocument => "per document",
            Mode::WholeCorpus => "whole corpus as one text",
        }
    }
}

/// What one splitter produced on one setting and mode, and how fast.
struct Measurement {
    splitter: &'static str,
    samples: Samples,
    stats: LengthStats,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chunk_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), BenchError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let iterations = iterations_from_args(&args, 5)?;
    let corpus_dir = corpus_dir_from_args(&args);

    let machine = Machine::detect();
    let files = load_html_corpus(&corpus_dir)?;
    let html_bytes: usize = files.iter().map(|f| f.html.len()).sum();
    let documents: Vec<String> = files
        .iter()
        .map(|f| rag_extract::html_to_text(&f.html))
        .collect();
    let whole = documents.join(DOCUMENT_SEPARATOR);
    let text_bytes: usize = documents.iter().map(String::len).sum();
    let text_chars: usize = documents.iter().map(|d| d.chars().count()).sum();

    println!("## Chunker throughput: rag_chunk vs text-splitter {TEXT_SPLITTER_VERSION}\n");
    println!("- Machine: {machine}");
    println!(
        "- Corpus: {} HTML files from {} ({:.2} MB of HTML), converted with `rag_extract::html_to_text` to {:.2} MB \
         of text ({} chars); whole-corpus mode joins them with a blank line ({:.2} MB)",
        files.len(),
        corpus_dir.display(),
        html_bytes as f64 / 1e6,
        text_bytes as f64 / 1e6,
        text_chars,
        whole.len() as f64 / 1e6,
    );
    println!(
        "- Timing: 1 untimed warm-up run, then {iterations} timed runs per splitter, alternating between the two \
         splitters; MB/s = UTF-8 text bytes (10^6) / median run time. Lengths are in chars (Unicode scalar values)."
    );

    for (size, overlap) in SETTINGS {
        let ours_config = rag_chunk::ChunkConfig::new(size, overlap, SizeUnit::Characters)
            .map_err(|e| {
                BenchError(format!(
                    "rag_chunk rejects size {size}, overlap {overlap}: {e}"
                ))
            })?;
        let theirs_config = text_splitter::ChunkConfig::new(size)
            .with_overlap(overlap)
            .map_err(|e| {
                BenchError(format!(
                    "text-splitter rejects capacity {size}, overlap {overlap}: {e}"
                ))
            })?;
        let theirs_splitter = TextSplitter::new(theirs_config);

        println!("\n### Size {size} chars, overlap {overlap} chars\n");
        println!(
            "| input | splitter | MB/s (median) | median ms | fastest–slowest ms | chunks | mean len | min len | max len | over size | under size/4 | chars out / in |"
        );
        println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");

        for mode in [Mode::PerDocument, Mode::WholeCorpus] {
            let texts: Vec<&str> = match mode {
                Mode::PerDocument => documents.iter().map(String::as_str).collect(),
                Mode::WholeCorpus => vec![whole.as_str()],
            };
            let input_bytes: usize = texts.iter().map(|t| t.len()).sum();
            let input_chars: usize = texts.iter().map(|t| t.chars().count()).sum();

            let run_ours = || -> usize {
                texts
                    .iter()
                    .map(|text| std::hint::black_box(chunk_text(text, &ours_config)).len())
                    .sum()
            };
            // Collected into a Vec like ours so both pay for holding a document's chunks at once; text-splitter's
            // chunks stay borrowed slices, ours are owned Strings with offsets (see the notes in the output).
            let run_theirs = || -> usize {
                texts
                    .iter()
                    .map(|text| {
                        std::hint::black_box(theirs_splitter.chunks(text).collect::<Vec<&str>>())
                            .len()
                    })
                    .sum()
            };

            // The warm-up run is also the one whose chunks are described, so computing lengths costs no timed run.
            let ours_stats = LengthStats::from_lengths(
                texts.iter().flat_map(|text| {
                    chunk_text(text, &ours_config)
                        .into_iter()
                        .map(|c| c.char_end - c.char_start)
                }),
                size,
            );
            let theirs_stats = LengthStats::from_lengths(
                texts.iter().flat_map(|text| {
                    theirs_splitter
                        .chunks(text)
                        .map(|c| c.chars().count())
                        .collect::<Vec<_>>()
                }),
                size,
            );

            let mut ours = Measurement {
                splitter: "rag_chunk",
                samples: Samples::new(),
                stats: ours_stats,
            };
            let mut theirs = Measurement {
                splitter: "text-splitter",
                samples: Samples::new(),
                stats: theirs_stats,
            };
            // Alternating keeps a burst of load from the shared machine (the lead builds while this runs) from
            // landing on only one splitter's runs.
            for _ in 0..iterations {
                let ours_count = ours.samples.time(run_ours);
                let theirs_count = theirs.samples.time(run_theirs);
                check_count(ours.splitter, ours_count, ours.stats.count, mode)?;
                check_count(theirs.splitter, theirs_count, theirs.stats.count, mode)?;
            }

            for m in [&ours, &theirs] {
                print_row(mode, m, input_bytes, input_chars)?;
            }
        }
    }

    print_long_graphemes(iterations)?;

    println!("\nNot exactly comparable:");
    println!(
        "- Overlap: both treat it as a ceiling. rag_chunk starts an overlap only on a sentence (else word) boundary \
         and keeps at least a quarter of every chunk new; text-splitter overlaps whole semantic units of its own \
         choosing. The \"chars out / in\" column shows how much each actually repeated (below 1.0 = trimmed whitespace \
         outweighs overlap)."
    );
    println!(
        "- Boundaries: rag_chunk splits on blank lines, then UAX #29 sentences (unicode-segmentation), then hard cuts; \
         text-splitter ranks runs of line breaks, then ICU sentences, words, graphemes. A single line break (table \
         rows, <pre> lines) is a semantic level of its own for text-splitter; rag_chunk uses it only when hard-cutting."
    );
    println!(
        "- Fragments: rag_chunk merges or rebalances a document's last chunk when it holds under a quarter of the size \
         of new text; text-splitter keeps it. \"under size/4\" counts every chunk under a quarter of the size, including, \
         per document, documents that are that short as a whole (both splitters then emit the whole document)."
    );
    println!(
        "- Output: rag_chunk returns owned Strings with char offsets and a token estimate per chunk; text-splitter \
         returns borrowed &str slices, so it allocates less per chunk."
    );
    println!(
        "- Both trim surrounding whitespace (text-splitter's default `with_trim(true)` was kept) and both count \
         size in chars; text-splitter's capacity is a single value (no desired..max range)."
    );
    Ok(())
}

/// Every timed run must produce as many chunks as the described run; anything else means the splitters are not
/// deterministic and the lengths printed would not describe the runs timed.
fn check_count(
    splitter: &str,
    timed: usize,
    described: usize,
    mode: Mode,
) -> Result<(), BenchError> {
    if timed == described {
        Ok(())
    } else {
        Err(BenchError(format!(
            "{splitter} produced {timed} chunks in a timed run but {described} in the described run ({})",
            mode.label()
        )))
    }
}

fn print_row(
    mode: Mode,
    m: &Measurement,
    input_bytes: usize,
    input_chars: usize,
) -> Result<(), BenchError> {
    let missing = || BenchError(format!("no timed runs for {}", m.splitter));
    let median = m.samples.median().ok_or_else(missing)?;
    let fastest = m.samples.min().ok_or_else(missing)?;
    let slowest = m.samples.max().ok_or_else(missing)?;
    println!(
        "| {} | {} | {:.2} | {:.1} | {:.1}–{:.1} | {} | {:.1} | {} | {} | {} | {} | {:.3} |",
        mode.label(),
        m.splitter,
        megabytes_per_second(input_bytes, median),
        median.as_secs_f64() * 1e3,
        fastest.as_secs_f64() * 1e3,
        slowest.as_secs_f64() * 1e3,
        m.stats.count,
        m.stats.mean_chars(),
        m.stats.min_chars,
        m.stats.max_chars,
        m.stats.over_limit,
        m.stats.under_quarter,
        m.stats.expansion(input_chars),
    );
    Ok(())
}

/// Texts whose graphemes are longer than a chunk, at two lengths: the time must double with the length, not
/// quadruple (a hard cut inside a grapheme of a million combining marks once measured the rest of it at every
/// cut, and a 6 MB such document held the worker for five minutes).
fn print_long_graphemes(iterations: usize) -> Result<(), BenchError> {
    let config = rag_chunk::ChunkConfig::new(1000, 150, SizeUnit::Characters)
        .map_err(|e| BenchError(format!("rag_chunk rejects size 1000, overlap 150: {e}")))?;
    println!("\n### Graphemes longer than a chunk (size 1000 chars, overlap 150): time at n and 2n\n");
    println!("| text | n | median ms at n | median ms at 2n | 2n / n |");
    println!("|---|---:|---:|---:|---:|");
    let cases: [(&str, &str, &str); 3] = [
        ("one letter and n combining marks (one grapheme)", "b", "\u{301}"),
        ("n emoji joined by U+200D (one grapheme)", "", "\u{1F468}\u{200D}"),
        ("n spaces that each carry three marks", "b", "\u{301}\u{301}\u{301} "),
    ];
    let n = 100_000;
    for (name, prefix, unit) in cases {
        let median_ms = |count: usize| {
            let text = format!("{prefix}{}", unit.repeat(count));
            let mut samples = Samples::new();
            for _ in 0..iterations {
                samples.time(|| std::hint::black_box(chunk_text(&text, &config)).len());
            }
            samples
                .median()
                .map(|median| median.as_secs_f64() * 1e3)
                .ok_or_else(|| BenchError("no timed run: iterations must be at least 1".into()))
        };
        let (at_n, at_2n) = (median_ms(n)?, median_ms(2 * n)?);
        println!("| {name} | {n} | {at_n:.1} | {at_2n:.1} | {:.2} |", at_2n / at_n);
    }
    Ok(())
}
