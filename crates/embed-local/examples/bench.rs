//! Embedding throughput and query latency of the local model, beside the numpy reference on the same
//! inputs.
//!
//! ```text
//! cd crates/embed-local && cargo run --release --example bench [-- CHUNKS_JSON]
//! ```
//!
//! Chunks: about 200 passages of about 150 words (trimmed to the model window) cut from PostgreSQL's
//! HTML documentation (package postgresql-doc-15), written to CHUNKS_JSON (default
//! /tmp/rag-embed-bench-chunks.json) so that `python3 reference/forward.py --bench CHUNKS_JSON`,
//! which this example runs at the end, embeds exactly the same text.

use std::path::{Path, PathBuf};
use std::time::Instant;

use rag_embed_local::{LoadOptions, LocalModel};

const DOC_DIR: &str = "/usr/share/doc/postgresql-doc-15/html";
/// Topic pages with running prose rather than reference tables.
const DOC_PREFIXES: [&str; 7] = [
    "tutorial", "ddl", "mvcc", "wal", "indexes", "queries", "routine",
];
const CHUNK_COUNT: usize = 200;
const WORDS_PER_CHUNK: usize = 150;
const QUERY: &str = "How do I stop a long-running query from blocking VACUUM?";

fn model_dir() -> PathBuf {
    rag_embed_local::default_model_dir()
}

/// Crude HTML to text: drops tags, decodes the entities the PostgreSQL docs use.
fn html_to_text(html: &str) -> String {
    let body = html.split_once("<body").map_or(html, |(_, rest)| rest);
    let mut text = String::with_capacity(body.len());
    let mut in_tag = false;
    for character in body.chars() {
        match character {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                text.push(' ');
            }
            _ if !in_tag => text.push(character),
            _ => {}
        }
    }
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&nbsp;", " ")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

fn load_chunks(model: &LocalModel) -> Vec<String> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(DOC_DIR)
        .unwrap_or_else(|error| panic!("{DOC_DIR}: {error} (apt-get install postgresql-doc-15)"))
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| DOC_PREFIXES.iter().any(|prefix| name.starts_with(prefix)))
        })
        .collect();
    pages.sort();
    let mut chunks = Vec::new();
    for page in pages {
        let html = std::fs::read_to_string(&page).expect("readable page");
        let text = html_to_text(&html);
        let words: Vec<&str> = text.split_whitespace().collect();
        for window in words.chunks(WORDS_PER_CHUNK) {
            if window.len() < WORDS_PER_CHUNK / 2 {
                continue;
            }
            // Dropping words from the end until the chunk fits is what a chunker validated against
            // the model window does.
            let mut length = window.len();
            let mut chunk = window.join(" ");
            while model.count_tokens(&chunk).expect("tokenizes") > model.max_tokens() {
                length -= 5;
                chunk = window[..length].join(" ");
            }
            chunks.push(chunk);
            if chunks.len() == CHUNK_COUNT {
                return chunks;
            }
        }
    }
    chunks
}

fn memory() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|line| line.starts_with(name))
            .map(|line| line[name.len()..].trim().to_owned())
            .unwrap_or_else(|| "?".to_owned())
    };
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    let pss = rollup
        .lines()
        .find(|line| line.starts_with("Pss:"))
        .map(|line| line["Pss:".len()..].trim().to_owned())
        .unwrap_or_else(|| "?".to_owned());
    format!(
        "VmRSS {} (RssAnon {}, RssFile {}), Pss {pss}",
        field("VmRSS:"),
        field("RssAnon:"),
        field("RssFile:")
    )
}

fn median_query_latency_ms(model: &LocalModel) -> f64 {
    let mut latencies: Vec<f64> = (0..50)
        .map(|_| {
            let started = Instant::now();
            model.embed(&[QUERY]).expect("query embeds");
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    (latencies[24] + latencies[25]) / 2.0
}

fn main() {
    let chunks_path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "/tmp/rag-embed-bench-chunks.json".to_owned());
    let dir = model_dir();
    println!("before load: {}", memory());
    let started = Instant::now();
    let model = LocalModel::load_with(&dir, &LoadOptions { threads: 1 })
        .unwrap_or_else(|error| panic!("{error}"));
    println!(
        "load {:.0} ms from {}; after load: {}",
        started.elapsed().as_secs_f64() * 1000.0,
        dir.display(),
        memory()
    );

    let chunks = load_chunks(&model);
    let refs: Vec<&str> = chunks.iter().map(String::as_str).collect();
    let tokens: Vec<usize> = refs
        .iter()
        .map(|chunk| model.count_tokens(chunk).expect("tokenizes"))
        .collect();
    let words: usize = refs
        .iter()
        .map(|chunk| chunk.split_whitespace().count())
        .sum();
    println!(
        "{} chunks from {DOC_DIR}: {:.0} words and {:.0} tokens on average (max {})",
        chunks.len(),
        words as f64 / chunks.len() as f64,
        tokens.iter().sum::<usize>() as f64 / chunks.len() as f64,
        tokens.iter().max().copied().unwrap_or(0)
    );
    let spec = serde_json::json!({ "chunks": chunks, "query": QUERY });
    std::fs::write(&chunks_path, spec.to_string()).expect("writes the chunks file");

    for threads in [1, 2] {
        let extra_model = if threads == 1 {
            None
        } else {
            Some(LocalModel::load_with(&dir, &LoadOptions { threads }).expect("loads"))
        };
        let model = extra_model.as_ref().unwrap_or(&model);
        model.embed(&refs[..4]).expect("warm-up");

        let started = Instant::now();
        for batch in refs.chunks(32) {
            model.embed(batch).expect("embeds");
        }
        let batched = started.elapsed().as_secs_f64();

        let started = Instant::now();
        for chunk in &refs {
            model.embed(&[chunk]).expect("embeds");
        }
        let one_by_one = started.elapsed().as_secs_f64();

        println!(
            "rust, mapped weights ({threads} thread{}): batches of 32 {:.1} chunks/s ({batched:.2} s), \
             one by one {:.1} chunks/s ({one_by_one:.2} s); query latency median of 50 = {:.2} ms",
            if threads > 1 { "s" } else { "" },
            refs.len() as f64 / batched,
            refs.len() as f64 / one_by_one,
            median_query_latency_ms(model)
        );
        println!("after embedding with {threads} thread(s): {}", memory());
    }

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("reference/forward.py");
    for threads in ["1", "2"] {
        let status = std::process::Command::new("python3")
            .arg(&script)
            .args(["--bench", &chunks_path, "--threads", threads, "--model-dir"])
            .arg(&dir)
            .status();
        match status {
            Ok(status) if status.success() => {}
            other => println!(
                "numpy reference did not run ({other:?}): pip install numpy, then \
                 python3 {} --bench {chunks_path} --threads {threads}",
                script.display()
            ),
        }
    }
}
