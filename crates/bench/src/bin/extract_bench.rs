//! Extraction throughput: `rag_extract::extract` per format on the extractor's test fixtures, and
//! `rag_extract::html_to_text` (and `extract` on the same files) over PostgreSQL's HTML manual.
//!
//! ```text
//! cd crates/bench && CARGO_TARGET_DIR=/work/main/target/crates cargo run --release --bin extract_bench \
//!     [-- --iterations 7] [--corpus /usr/share/doc/postgresql-doc-15/html] [--fixtures DIR]
//! ```
//!
//! MB/s is input bytes per second: for zip-based formats (docx, xlsx, pptx, odt, ods, odp) that is the compressed
//! file size, so it is not comparable with the textual formats' figure. The output is Markdown.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rag_bench::{
    corpus_dir_from_args, file_name, flag_value, iterations_from_args, load_html_corpus,
    megabytes_per_second, BenchError, Machine, Samples,
};
use rag_extract::{extract, html_to_text, Limits};

/// The fixtures are a few kilobytes each, far below timer resolution per call; each sample repeats the extraction
/// until at least this long has passed, so every sample is dominated by the work rather than by the clock.
const MIN_SAMPLE: Duration = Duration::from_millis(20);

/// Upper bound on repetitions per sample, so a pathological fast path (an error returned in nanoseconds) cannot
/// spin for billions of rounds.
const MAX_REPS_PER_SAMPLE: u64 = 1 << 20;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("extract_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), BenchError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let iterations = iterations_from_args(&args, 7)?;
    let corpus_dir = corpus_dir_from_args(&args);
    let fixtures_dir = flag_value(&args, "--fixtures")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../extract/tests/fixtures")
        });
    // Canonical only so the printed path reads cleanly; an unresolvable path is reported by the read below.
    let fixtures_dir = std::fs::canonicalize(&fixtures_dir).unwrap_or(fixtures_dir);
    let limits = Limits::default();

    println!("## Extraction throughput\n");
    println!("- Machine: {}", Machine::detect());
    println!(
        "- Timing: per file, one untimed warm-up, then {iterations} samples each repeating the extraction for at least \
         {} ms; a file's time is the median sample divided by its repetitions. MB/s = input bytes (10^6) / time.",
        MIN_SAMPLE.as_millis()
    );

    bench_fixtures(&fixtures_dir, iterations, &limits)?;
    bench_html_corpus(&corpus_dir, iterations, &limits)?;
    Ok(())
}

/// One fixture's outcome.
struct FixtureResult {
    name: String,
    bytes: usize,
    format: String,
    outcome: Result<usize, String>,
    seconds_per_call: f64,
}

fn bench_fixtures(dir: &Path, iterations: usize, limits: &Limits) -> Result<(), BenchError> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        BenchError(format!(
            "cannot read the fixtures directory {}: {e}",
            dir.display()
        ))
    })?;
    let mut paths: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| BenchError(format!("cannot list {}: {e}", dir.display())))?;
        let path = entry.path();
        // README.md documents where the fixtures come from; it is not one of them.
        if path.is_file() && file_name(&path) != "README.md" {
            paths.push(path);
        }
    }
    paths.sort();

    let mut results = Vec::new();
    for path in &paths {
        let data = std::fs::read(path)
            .map_err(|e| BenchError(format!("cannot read fixture {}: {e}", path.display())))?;
        let name = file_name(path);
        let warm_up = extract(&data, Some(&name), limits);
        let (format, outcome) = match &warm_up {
            Ok(doc) => (doc.format.to_string(), Ok(doc.text().chars().count())),
            Err(e) => (
                rag_extract::detect_format(&data, Some(&name))
                    .map(|f| f.to_string())
                    .unwrap_or_else(|_| "?".to_string()),
                Err(e.to_string()),
            ),
        };
        let seconds_per_call = time_per_call(iterations, || {
            std::hint::black_box(extract(&data, Some(&name), limits)).is_ok()
        })?;
        results.push(FixtureResult {
            name,
            bytes: data.len(),
            format,
            outcome,
            seconds_per_call,
        });
    }

    println!("\n### Per fixture ({})\n", dir.display());
    println!("| file | format | bytes | extracted chars | µs per call | MB/s |");
    println!("|---|---|---:|---:|---:|---:|");
    for r in &results {
        let extracted = match &r.outcome {
            Ok(chars) => chars.to_string(),
            Err(reason) => format!("error: {reason}"),
        };
        println!(
            "| {} | {} | {} | {} | {:.1} | {:.2} |",
            r.name,
            r.format,
            r.bytes,
            extracted,
            r.seconds_per_call * 1e6,
            rate(r.bytes, r.seconds_per_call),
        );
    }

    // Failed extractions (encrypted PDFs) stop early and would flatter the format's figure, so only successes count.
    let mut per_format: BTreeMap<&str, (usize, usize, f64)> = BTreeMap::new();
    for r in results.iter().filter(|r| r.outcome.is_ok()) {
        let entry = per_format.entry(r.format.as_str()).or_default();
        entry.0 += 1;
        entry.1 += r.bytes;
        entry.2 += r.seconds_per_call;
    }
    println!("\n### Per format (successful extractions only)\n");
    println!("| format | files | input bytes | MB/s |");
    println!("|---|---:|---:|---:|");
    for (format, (files, bytes, seconds)) in per_format {
        println!(
            "| {format} | {files} | {bytes} | {:.2} |",
            rate(bytes, seconds)
        );
    }
    Ok(())
}

fn bench_html_corpus(dir: &Path, iterations: usize, limits: &Limits) -> Result<(), BenchError> {
    let files = load_html_corpus(dir)?;
    let html_bytes: usize = files.iter().map(|f| f.html.len()).sum();
    let text_bytes: usize = files.iter().map(|f| html_to_text(&f.html).len()).sum();

    let mut direct = Samples::new();
    let mut through_extract = Samples::new();
    let mut extract_failures = 0usize;
    for file in &files {
        if extract(file.html.as_bytes(), Some(&file.name), limits).is_err() {
            extract_failures += 1;
        }
    }
    // Alternating, as in chunk_bench, so load from other processes spreads over both variants.
    for _ in 0..iterations {
        direct.time(|| {
            files
                .iter()
                .map(|f| std::hint::black_box(html_to_text(&f.html)).len())
                .sum::<usize>()
        });
        through_extract.time(|| {
            files
                .iter()
                .filter_map(|f| {
                    std::hint::black_box(extract(f.html.as_bytes(), Some(&f.name), limits)).ok()
                })
                .count()
        });
    }

    println!(
        "\n### HTML corpus: {} files from {}, {:.2} MB of HTML → {:.2} MB of text\n",
        files.len(),
        dir.display(),
        html_bytes as f64 / 1e6,
        text_bytes as f64 / 1e6
    );
    println!("| function | MB/s of HTML (median) | median ms | fastest–slowest ms | failures |");
    println!("|---|---:|---:|---:|---:|");
    for (label, samples, failures) in [
        ("`html_to_text`", &direct, 0),
        (
            "`extract` (format detection + decoding + html_to_text)",
            &through_extract,
            extract_failures,
        ),
    ] {
        let missing = || BenchError(format!("no timed runs for {label}"));
        let median = samples.median().ok_or_else(missing)?;
        let fastest = samples.min().ok_or_else(missing)?;
        let slowest = samples.max().ok_or_else(missing)?;
        println!(
            "| {label} | {:.2} | {:.1} | {:.1}–{:.1} | {failures} |",
            megabytes_per_second(html_bytes, median),
            median.as_secs_f64() * 1e3,
            fastest.as_secs_f64() * 1e3,
            slowest.as_secs_f64() * 1e3,
        );
    }
    Ok(())
}

/// Median seconds per call of `call`: repetitions are doubled until one sample lasts [`MIN_SAMPLE`], then
/// `iterations` samples of that many repetitions are timed.
fn time_per_call(iterations: usize, mut call: impl FnMut() -> bool) -> Result<f64, BenchError> {
    call();
    let mut reps: u64 = 1;
    loop {
        let start = Instant::now();
        for _ in 0..reps {
            call();
        }
        if start.elapsed() >= MIN_SAMPLE || reps >= MAX_REPS_PER_SAMPLE {
            break;
        }
        reps *= 2;
    }
    let mut samples = Samples::new();
    for _ in 0..iterations {
        let start = Instant::now();
        for _ in 0..reps {
            call();
        }
        samples.push(start.elapsed());
    }
    let median = samples
        .median()
        .ok_or_else(|| BenchError("no samples taken".to_string()))?;
    Ok(median.as_secs_f64() / reps as f64)
}

fn rate(bytes: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds / 1e6
    } else {
        0.0
    }
}
