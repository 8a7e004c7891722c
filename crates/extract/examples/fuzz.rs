//! Stable-Rust mutation fuzzer for `rag_extract::extract` (cargo-fuzz needs nightly).
//!
//! `cargo run -p rag-extract --release --example fuzz -- --seconds 60 [--seed 1] [--budget-ms 5000]`
//!
//! Seeds from tests/fixtures plus a few synthetic text documents, mutates with a seeded PRNG (bit flips, byte
//! inserts, deletes, splices between seeds, truncation, and, for zip-based seeds, mutation of one decompressed
//! member re-packed into a valid archive so the XML parsers are reached past the CRC check), and runs `extract`
//! with small limits on a worker thread. Fails (exit code 1, input saved under target/fuzz-crashes/) when a panic
//! escapes `extract` or one run exceeds the time budget. Panics caught inside `extract` (reported as Corrupt) are
//! counted and saved too, as they point at bugs worth fixing, but do not fail the run.

use std::io::{Cursor, Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rag_extract::{extract, ExtractError, Limits};

static PANICS_SEEN: AtomicUsize = AtomicUsize::new(0);

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

struct Seed {
    name: String,
    data: Vec<u8>,
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn load_seeds(dir: &Path) -> Vec<Seed> {
    let mut seeds: Vec<Seed> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x != "md"))
                .filter_map(|p| {
                    Some(Seed {
                        name: p.file_name()?.to_str()?.to_string(),
                        data: std::fs::read(&p).ok()?,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let synthetic: [(&str, &[u8]); 5] = [
        ("s.html", b"<!DOCTYPE html><html><head><title>t</title></head><body><p>a &amp; b</p><table><tr><td>x</td></tr></table><pre>q\n r</pre><script>s()</script></body></html>"),
        ("s.md", b"# H\n\n*a* **b** [l](u) ![i](p)\n\n```\ncode\n```\n| a | b |\n|---|---|\n> q\n- i\n"),
        ("s.xml", b"<?xml version=\"1.0\"?><!DOCTYPE r [<!ENTITY e \"v\">]><r a=\"1\"><x>t &e; &#65;</x><![CDATA[c]]></r>"),
        ("s.txt", b"plain text\nwith lines\n"),
        ("s.csv", b"\xEF\xBB\xBFa,b\n1,2\n"),
    ];
    seeds.extend(synthetic.iter().map(|(n, d)| Seed {
        name: n.to_string(),
        data: d.to_vec(),
    }));
    seeds.sort_by(|a, b| a.name.cmp(&b.name));
    seeds
}

fn mutate_bytes(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    let rounds = 1 + rng.below(8);
    for _ in 0..rounds {
        match rng.below(7) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(data.len() + 1);
                let interesting: [&[u8]; 8] = [
                    b"<",
                    b">",
                    b"[",
                    b"(",
                    b"<<",
                    b"0 R",
                    b"\xFF\xFF\xFF\x7F",
                    b"&lol;",
                ];
                if rng.below(2) == 0 {
                    let piece = interesting[rng.below(interesting.len())];
                    data.splice(i..i, piece.iter().copied());
                } else {
                    let n = 1 + rng.below(16);
                    data.splice(i..i, (0..n).map(|_| rng.next() as u8));
                }
            }
            2 if !data.is_empty() => {
                let start = rng.below(data.len());
                let end = (start + 1 + rng.below(64)).min(data.len());
                data.drain(start..end);
            }
            3 if !other.is_empty() && !data.is_empty() => {
                let at = rng.below(data.len());
                let from = rng.below(other.len());
                let len = (1 + rng.below(256)).min(other.len() - from);
                data.splice(at..at, other[from..from + len].iter().copied());
            }
            4 if !data.is_empty() => {
                let keep = rng.below(data.len());
                data.truncate(keep);
            }
            5 if data.len() > 1 => {
                // Duplicate a chunk: repeats structure (nesting, entries) rather than noise.
                let start = rng.below(data.len());
                let end = (start + 1 + rng.below(128)).min(data.len());
                let chunk: Vec<u8> = data[start..end].to_vec();
                for _ in 0..1 + rng.below(8) {
                    data.splice(start..start, chunk.iter().copied());
                }
            }
            _ => {
                let i = rng.below(data.len() + 1);
                data.insert(i, [0u8, 0xFF, b'\n', b' '][rng.below(4)]);
            }
        }
    }
}

/// Mutates one member of a zip seed and re-packs it, so the mutated XML reaches the format parsers.
fn mutate_zip_member(rng: &mut Rng, data: &[u8], other: &[u8]) -> Option<Vec<u8>> {
    let mut archive = zip::ZipArchive::new(Cursor::new(data)).ok()?;
    let target = rng.below(archive.len());
    let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for i in 0..archive.len() {
        let mut member = archive.by_index(i).ok()?;
        let name = member.name().ok()?.into_owned();
        let mut content = Vec::new();
        member
            .by_ref()
            .take(4 * 1024 * 1024)
            .read_to_end(&mut content)
            .ok()?;
        if i == target {
            mutate_bytes(rng, &mut content, other);
        }
        writer.start_file(name, options).ok()?;
        writer.write_all(&content).ok()?;
    }
    Some(writer.finish().ok()?.into_inner())
}

fn save(dir: &Path, kind: &str, iteration: u64, name: &str, data: &[u8]) -> PathBuf {
    let _ = std::fs::create_dir_all(dir);
    let path = dir.join(format!("{kind}-{iteration}-{name}"));
    if let Err(e) = std::fs::write(&path, data) {
        eprintln!("cannot save {}: {e}", path.display());
    }
    path
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seconds: f64 = arg(&args, "--seconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(60.0);
    let seed: u64 = arg(&args, "--seed")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x9E37_79B9_7F4A_7C15);
    let budget = Duration::from_millis(
        arg(&args, "--budget-ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(5000),
    );
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let crash_dir = manifest.join("../../target/fuzz-crashes");
    let seeds = load_seeds(&manifest.join("tests/fixtures"));
    assert!(!seeds.is_empty(), "no seeds found");
    let limits = Limits {
        max_input_bytes: 4 * 1024 * 1024,
        max_decompressed_bytes: 16 * 1024 * 1024,
        max_archive_entries: 2_000,
        max_xml_depth: 64,
        max_pdf_pages: 50,
        max_text_bytes: 16 * 1024 * 1024,
    };
    std::panic::set_hook(Box::new(|_| {
        PANICS_SEEN.fetch_add(1, Ordering::SeqCst);
    }));

    let mut rng = Rng(seed | 1);
    let start = Instant::now();
    let (mut executions, mut ok, mut errors, mut caught_panics, mut slowest) =
        (0u64, 0u64, 0u64, 0u64, Duration::ZERO);
    while start.elapsed().as_secs_f64() < seconds {
        let base = &seeds[rng.below(seeds.len())];
        let other = &seeds[rng.below(seeds.len())].data;
        let input = if base.data.starts_with(b"PK") && rng.below(2) == 0 {
            mutate_zip_member(&mut rng, &base.data, other).unwrap_or_else(|| base.data.clone())
        } else {
            let mut data = base.data.clone();
            mutate_bytes(&mut rng, &mut data, other);
            data
        };
        let hint = if rng.below(4) == 0 {
            None
        } else {
            Some(base.name.clone())
        };
        let panics_before = PANICS_SEEN.load(Ordering::SeqCst);

        let (sender, receiver) = mpsc::channel();
        let worker_input = input.clone();
        let worker_limits = limits.clone();
        let worker_hint = hint.clone();
        let run_start = Instant::now();
        std::thread::spawn(move || {
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                extract(&worker_input, worker_hint.as_deref(), &worker_limits)
            }));
            let _ = sender.send(outcome);
        });
        let outcome = match receiver.recv_timeout(budget) {
            Ok(outcome) => outcome,
            Err(_) => {
                let path = save(&crash_dir, "timeout", executions, &base.name, &input);
                eprintln!(
                    "TIMEOUT: run exceeded {budget:?}; input saved to {}",
                    path.display()
                );
                std::process::exit(1);
            }
        };
        slowest = slowest.max(run_start.elapsed());
        executions += 1;
        match outcome {
            Err(_) => {
                let path = save(&crash_dir, "escaped-panic", executions, &base.name, &input);
                eprintln!(
                    "CRASH: a panic escaped extract(); input saved to {}",
                    path.display()
                );
                std::process::exit(1);
            }
            Ok(result) => {
                if PANICS_SEEN.load(Ordering::SeqCst) > panics_before {
                    caught_panics += 1;
                    let path = save(&crash_dir, "caught-panic", executions, &base.name, &input);
                    if caught_panics <= 5 {
                        eprintln!(
                            "caught panic ({:?}); input saved to {}",
                            result.as_ref().err(),
                            path.display()
                        );
                    }
                }
                match result {
                    Ok(_) => ok += 1,
                    Err(ExtractError::Corrupt { .. }) | Err(_) => errors += 1,
                }
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "executions: {executions} in {elapsed:.1}s ({:.0}/s); ok: {ok}; errors: {errors}; caught panics: {caught_panics}; \
         escaped panics: 0; timeouts: 0; slowest run: {slowest:?}; seeds: {}",
        executions as f64 / elapsed,
        seeds.len()
    );
}
