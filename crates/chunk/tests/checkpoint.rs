//! The checkpoint lets a caller abandon a long text: it is called before every chunk and during the scan of
//! one huge paragraph, and unwinding out of it stops chunking.
use rag_chunk::{chunk_text, chunk_text_with_checkpoint, ChunkConfig, SizeUnit};

fn config() -> ChunkConfig {
    ChunkConfig::new(200, 20, SizeUnit::Characters).expect("valid settings")
}

#[test]
fn checkpoint_runs_before_every_chunk_and_changes_nothing() {
    let text = "A sentence of moderate length.\n\n".repeat(500);
    let mut calls = 0;
    let chunks = chunk_text_with_checkpoint(&text, &config(), &mut || calls += 1);
    assert_eq!(chunks, chunk_text(&text, &config()));
    assert!(
        calls > chunks.len(),
        "{calls} checkpoints for {} chunks",
        chunks.len()
    );
}

#[test]
fn a_huge_paragraph_is_scanned_between_checkpoints() {
    // One paragraph of 1.5 million chars: finding where it ends is one long scan before the first chunk, so
    // the packer's once-per-chunk checkpoint alone would leave that scan unchecked.
    let text = "word ".repeat(300_000);
    let mut calls = 0usize;
    let chunks = chunk_text_with_checkpoint(&text, &config(), &mut || calls += 1);
    let scan_checkpoints = text.chars().count() / 65_536;
    assert!(
        calls > chunks.len() + scan_checkpoints,
        "{calls} checkpoints for {} chunks",
        chunks.len()
    );
}

#[test]
fn unwinding_out_of_the_checkpoint_stops_chunking() {
    let text = "word ".repeat(300_000);
    let mut calls = 0;
    let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        chunk_text_with_checkpoint(&text, &config(), &mut || {
            calls += 1;
            if calls == 3 {
                panic!("cancelled");
            }
        })
    }));
    assert!(stopped.is_err());
    assert_eq!(calls, 3, "no checkpoint ran after the one that unwound");
}

#[test]
fn bounds_delimit_exactly_the_chunks() {
    let text =
        "Ünïcode first paragraph. It has two sentences.\n\nA second one, shorter.\n\n".repeat(40);
    let chunks = chunk_text(&text, &config());
    let bounds = rag_chunk::chunk_bounds_with_checkpoint(&text, &config(), &mut || {});
    assert!(chunks.len() > 5);
    let rebuilt: Vec<_> = bounds.iter().map(|b| b.chunk(&text)).collect();
    assert_eq!(rebuilt, chunks);
}
