//! Extraction throughput per format on the fixture corpus.
//!
//! `cargo run -p rag-extract --release --example extract_bench [-- --seconds-per-file 0.5] [--dump]`
//!
//! Each fixture is extracted repeatedly for a fixed wall-clock budget; MB/s is input bytes processed per second,
//! summed per format. `--dump` prints every fixture's extracted sections instead (for inspecting output).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rag_extract::{extract, Limits};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dump = args.iter().any(|a| a == "--dump");
    let per_file = args
        .iter()
        .position(|a| a == "--seconds-per-file")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.5);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext != "md"))
        .collect();
    files.sort();
    let limits = Limits::default();

    // format -> (bytes processed, seconds, files)
    let mut totals: BTreeMap<String, (f64, f64, usize)> = BTreeMap::new();
    for path in &files {
        let data = std::fs::read(path).expect("fixture readable");
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let first = extract(&data, Some(&name), &limits);
        if dump {
            println!("===== {name}");
            match &first {
                Ok(doc) => {
                    for section in &doc.sections {
                        println!(
                            "--- [{}]\n{}",
                            section.locator.as_deref().unwrap_or("-"),
                            section.text
                        );
                    }
                }
                Err(e) => println!("ERROR: {e}"),
            }
            continue;
        }
        let format = match &first {
            Ok(doc) => doc.format.to_string(),
            Err(_) => continue,
        };
        let budget = Duration::from_secs_f64(per_file);
        let start = Instant::now();
        let mut runs = 0u64;
        while start.elapsed() < budget || runs == 0 {
            let result = extract(&data, Some(&name), &limits);
            std::hint::black_box(&result);
            runs += 1;
        }
        let seconds = start.elapsed().as_secs_f64();
        let entry = totals.entry(format).or_default();
        entry.0 += data.len() as f64 * runs as f64;
        entry.1 += seconds;
        entry.2 += 1;
    }
    if dump {
        return;
    }
    println!("{:<8} {:>6} {:>12}", "format", "files", "MB/s");
    for (format, (bytes, seconds, count)) in totals {
        println!(
            "{format:<8} {count:>6} {:>12.2}",
            bytes / seconds / 1_000_000.0
        );
    }
}
