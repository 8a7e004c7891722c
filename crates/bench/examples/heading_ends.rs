//! Counts chunks (other than a document's last) whose last paragraph is a heading-like line, and chunks
//! that hold nothing but such a line, over PostgreSQL's HTML manual. A throwaway measurement for
//! BENCHMARKS.md's chunker notes.
use rag_chunk::{chunk_text, ChunkConfig, SizeUnit};

fn main() {
    let corpus = rag_bench::load_html_corpus(std::path::Path::new(
        "/usr/share/doc/postgresql-doc-15/html",
    ))
    .map_err(|e| e.0)
    .unwrap();
    for (size, overlap) in [(1000, 200), (500, 0), (2000, 100)] {
        let config = ChunkConfig::new(size, overlap, SizeUnit::Characters).unwrap();
        let (mut chunks_total, mut ending, mut alone) = (0, 0, 0);
        for file in &corpus {
            let text = rag_extract::html_to_text(&file.html);
            let chunks = chunk_text(&text, &config);
            chunks_total += chunks.len();
            for chunk in chunks.iter().take(chunks.len().saturating_sub(1)) {
                let last_paragraph = chunk.text.rsplit("\n\n").next().unwrap_or("");
                if rag_chunk::looks_like_heading(last_paragraph) {
                    ending += 1;
                    if last_paragraph == chunk.text {
                        alone += 1;
                    }
                }
            }
        }
        println!("| {size}/{overlap} | {chunks_total} | {ending} | {alone} |");
    }
}
