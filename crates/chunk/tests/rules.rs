//! The chunking rules, one behaviour per test.

mod common;

use common::{assert_invariants, char_byte_offsets, char_slice, grapheme_boundaries, new_chars};
use rag_chunk::{chunk_text, estimate_tokens, Chunk, ChunkConfig, SizeUnit};
use unicode_segmentation::UnicodeSegmentation;

fn chars(size: usize, overlap: usize) -> ChunkConfig {
    ChunkConfig::new(size, overlap, SizeUnit::Characters).expect("valid test config")
}

fn texts(chunks: &[Chunk]) -> Vec<&str> {
    chunks.iter().map(|chunk| chunk.text.as_str()).collect()
}

/// Sentences of about 40-60 chars that are easy to tell apart.
fn numbered_sentences(count: usize) -> Vec<String> {
    (1..=count)
        .map(|n| {
            let filler = [
                "quietly",
                "with some care",
                "as the manual says",
                "before noon",
            ][n % 4];
            format!("Sentence {n} describes step {n} {filler}.")
        })
        .collect()
}

#[test]
fn blank_input_gives_no_chunks() {
    for text in ["", " ", "\n\n\t  \r\n", "\u{3000}\u{a0}\u{2029}"] {
        assert!(chunk_text(text, &chars(100, 10)).is_empty(), "{text:?}");
    }
}

#[test]
fn short_text_is_one_trimmed_chunk_with_char_offsets() {
    let text = "\n\n  Ünïcödé text stays intact.  \n";
    let chunks = chunk_text(text, &chars(100, 20));
    assert_eq!(texts(&chunks), vec!["Ünïcödé text stays intact."]);
    assert_eq!((chunks[0].char_start, chunks[0].char_end), (4, 30));
    assert_eq!(chunks[0].token_estimate, 7);
}

#[test]
fn short_paragraphs_are_packed_while_they_fit() {
    let paragraphs: Vec<String> = (1..=5)
        .map(|n| format!("Paragraph {n} is short and ends here; it holds about sixty chars."))
        .collect();
    let text = paragraphs.join("\n\n");
    let config = chars(200, 0);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    assert_eq!(
        texts(&chunks),
        vec![
            paragraphs[..3].join("\n\n").as_str(),
            paragraphs[3..].join("\n\n").as_str()
        ]
    );
}

#[test]
fn a_paragraph_that_fits_is_not_split_to_fill_a_chunk() {
    let first = "A short opening paragraph.";
    let second = "The second paragraph is long enough that it cannot join the first one, \
                  yet it fits in a chunk of its own without any cutting at all.";
    let text = format!("{first}\n\n{second}");
    let chunks = chunk_text(&text, &chars(150, 0));
    assert_eq!(texts(&chunks), vec![first, second]);
}

#[test]
fn oversized_paragraph_chunks_end_on_sentence_boundaries() {
    let sentences = numbered_sentences(30);
    let text = sentences.join(" ");
    let config = chars(220, 0);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    assert!(chunks.len() > 5);
    for chunk in &chunks {
        assert!(chunk.text.starts_with("Sentence "), "{:?}", chunk.text);
        assert!(chunk.text.ends_with('.'), "{:?}", chunk.text);
        // Whole sentences only: every sentence of the chunk is one of the originals.
        for sentence in chunk.text.split_sentence_bounds() {
            assert!(
                sentences.iter().any(|s| s == sentence.trim()),
                "{sentence:?}"
            );
        }
    }
}

#[test]
fn hard_wrapped_lines_do_not_count_as_sentence_ends() {
    let text =
        "This sentence is wrapped\nacross two lines. And this one is also\nwrapped in the middle. \
                A third sentence closes\nthe paragraph here.";
    let chunks = chunk_text(text, &chars(100, 0));
    for chunk in &chunks {
        assert!(chunk.text.ends_with('.'), "{:?}", chunk.text);
    }
    assert_eq!(chunks.len(), 2);
}

#[test]
fn overlap_carries_the_previous_sentence_forward() {
    let sentences = numbered_sentences(30);
    let text = sentences.join(" ");
    let config = chars(220, 70);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    let offsets = char_byte_offsets(&text);
    for pair in chunks.windows(2) {
        let (previous, chunk) = (&pair[0], &pair[1]);
        assert!(
            chunk.char_start < previous.char_end,
            "no overlap: {chunk:?}"
        );
        let shared = char_slice(&text, &offsets, chunk.char_start, previous.char_end);
        assert!(previous.text.ends_with(shared));
        assert!(chunk.text.starts_with(shared));
        // The repeated context is whole sentences.
        assert!(shared.starts_with("Sentence "), "{shared:?}");
        assert!(shared.ends_with('.'), "{shared:?}");
    }
}

#[test]
fn overlap_falls_back_to_a_word_start_when_no_sentence_starts_in_the_window() {
    let long_sentence = |n: usize| {
        format!(
            "Clause {n} goes on and on through many words without ever stopping for breath \
             until it finally reaches its end."
        )
    };
    let text = (1..=6).map(long_sentence).collect::<Vec<_>>().join(" ");
    let config = chars(150, 40);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    let offsets = char_byte_offsets(&text);
    for pair in chunks.windows(2) {
        let (previous, chunk) = (&pair[0], &pair[1]);
        assert!(
            chunk.char_start < previous.char_end,
            "no overlap: {chunk:?}"
        );
        assert!(previous.char_end - chunk.char_start <= 40);
        let before = char_slice(&text, &offsets, chunk.char_start - 1, chunk.char_start);
        assert_eq!(before, " ", "overlap starts mid-word: {:?}", chunk.text);
    }
}

#[test]
fn zero_overlap_gives_disjoint_chunks() {
    let text = numbered_sentences(40).join(" ");
    let config = chars(180, 0);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    for pair in chunks.windows(2) {
        assert!(pair[1].char_start > pair[0].char_end);
    }
}

#[test]
fn overlap_never_pushes_a_chunk_past_the_size() {
    let text = numbered_sentences(60).join(" ");
    for overlap in [0, 1, 50, 99] {
        let config = chars(100, overlap);
        let chunks = chunk_text(&text, &config);
        assert_invariants(&text, &config, &chunks, true);
        // Every chunk adds new text, and the output stays a small multiple of the input.
        let output: usize = chunks.iter().map(|c| c.char_end - c.char_start).sum();
        assert!(
            output <= 5 * text.chars().count(),
            "overlap {overlap}: {output} chars"
        );
    }
}

#[test]
fn a_tiny_trailing_fragment_is_merged_backwards() {
    // Chunks of four 44-char sentences, one repeated as overlap; "Done." would end up alone behind a
    // repeated sentence.
    let mut sentences: Vec<String> = (1..=7)
        .map(|n| format!("Sentence {n:02} has the same length as the rest."))
        .collect();
    sentences.push("Done.".to_owned());
    let text = sentences.join(" ");
    let config = chars(180, 60);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    assert_eq!(chunks.len(), 2, "{chunks:#?}");
    assert!(chunks[1]
        .text
        .ends_with("Sentence 07 has the same length as the rest. Done."));
    assert!(new_chars(Some(&chunks[0]), &chunks[1]) >= 45);
}

#[test]
fn a_tail_that_cannot_merge_is_rebalanced() {
    // One unbroken 230-char paragraph of words without sentence ends: the hard cut would leave a
    // 30-char scrap; instead the two chunks share the text evenly.
    let words: Vec<String> = (0..40).map(|n| format!("w{n:03}")).collect();
    let text = words.join(" ") + " end";
    let config = chars(200, 0);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    assert_eq!(chunks.len(), 2, "{chunks:#?}");
    for chunk in &chunks {
        let length = chunk.char_end - chunk.char_start;
        assert!((90..=130).contains(&length), "unbalanced: {chunks:#?}");
    }
}

#[test]
fn a_table_without_sentences_is_cut_between_rows() {
    let rows: Vec<String> = (0..40)
        .map(|n| format!("| {n:>3} | name_{n:03} | {:>6} | yes |", n * 37))
        .collect();
    let text = rows.join("\n");
    let config = chars(300, 0);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    assert!(chunks.len() >= 4);
    for chunk in &chunks {
        assert!(chunk.text.starts_with("| "), "{:?}", chunk.text);
        assert!(chunk.text.ends_with(" |"), "{:?}", chunk.text);
        for line in chunk.text.lines() {
            assert!(rows.iter().any(|row| row == line), "row cut: {line:?}");
        }
    }
}

#[test]
fn base64_is_hard_cut_and_reassembles() {
    let alphabet: Vec<char> = ('A'..='Z').chain('a'..='z').chain('0'..='9').collect();
    let blob: String = (0..2_345)
        .map(|n| alphabet[(n * 7 + n / 13) % alphabet.len()])
        .collect();
    let text = format!("Attachment:\n\n{blob}");
    let config = chars(250, 0);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    // The label reads as a heading, so it leads the blob's first piece rather than standing alone.
    let first = chunks[0]
        .text
        .strip_prefix("Attachment:\n\n")
        .expect("the label starts the first piece");
    let rebuilt: String = std::iter::once(first)
        .chain(chunks[1..].iter().map(|chunk| chunk.text.as_str()))
        .collect();
    assert_eq!(rebuilt, blob);
    assert!(chunks[1..chunks.len() - 1]
        .iter()
        .all(|chunk| chunk.char_end - chunk.char_start == 250));
}

#[test]
fn minified_json_is_cut_on_word_boundaries() {
    let entries: Vec<String> = (0..120)
        .map(|n| format!("{{\"id\":{n},\"label\":\"item{n}\",\"tags\":[\"alpha\",\"beta\"]}}"))
        .collect();
    let text = format!("[{}]", entries.join(","));
    let config = chars(200, 40);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    let word_boundaries: std::collections::HashSet<usize> = {
        let mut set = std::collections::HashSet::new();
        let mut at = 0;
        for word in text.split_word_bounds() {
            set.insert(at);
            at += word.chars().count();
        }
        set.insert(at);
        set
    };
    for chunk in &chunks {
        assert!(
            word_boundaries.contains(&chunk.char_start),
            "{:?}",
            chunk.text
        );
        assert!(
            word_boundaries.contains(&chunk.char_end),
            "{:?}",
            chunk.text
        );
    }
}

#[test]
fn multibyte_text_round_trips_through_offsets() {
    let samples = [
        // CJK with ideographic full stops and no spaces.
        "東京は日本の首都である。人口は約千四百万人である。多くの企業が本社を置いている。"
            .repeat(12),
        // Emoji with ZWJ sequences, skin tones and flags.
        "Family 👨‍👩‍👧‍👦 trip 🇯🇵🇫🇷 with 👍🏽 and 🧑‍💻 at work. ".repeat(20),
        // Combining accents (decomposed) and precomposed letters.
        "Cafe\u{301} re\u{301}sume\u{301} na\u{308}ive déjà vu. Ångström e\u{301}te\u{301}. "
            .repeat(20),
        // Arabic, right to left, with its own punctuation.
        "مرحبا بالعالم. هذه جملة عربية طويلة بعض الشيء؟ نعم، إنها كذلك! ".repeat(15),
        // Emoji only, no whitespace at all: every cut must fall between clusters.
        "👩‍❤️‍💋‍👨🏳️‍🌈🇺🇳👨🏿‍🦱".repeat(60),
    ];
    for text in &samples {
        for overlap in [0, 30] {
            let config = chars(120, overlap);
            let chunks = chunk_text(text, &config);
            assert!(!chunks.is_empty());
            assert_invariants(text, &config, &chunks, true);
        }
    }
}

#[test]
fn a_grapheme_longer_than_the_size_is_cut_between_chars() {
    // A single letter carrying 300 combining marks cannot fit; cutting inside it is unavoidable but must
    // still fall between chars.
    let text = format!("a{}", "\u{301}".repeat(300));
    let config = chars(100, 20);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, false);
    assert_eq!(chunks.last().map(|c| c.char_end), Some(301));
}

#[test]
fn long_whitespace_gaps_are_dropped_not_chunked() {
    let text = format!(
        "First part.{}Second part.{}",
        " ".repeat(5_000),
        "\n".repeat(3_000)
    );
    let config = chars(100, 30);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    assert_eq!(texts(&chunks), vec!["First part.", "Second part."]);
}

#[test]
fn chunks_map_back_to_original_grapheme_boundaries_in_mixed_text() {
    let text = "Intro paragraph.\n\n".to_owned()
        + &"Ein Satz über Straßen. 一个句子。 Émoji 🏳️‍⚧️ here.\n".repeat(40);
    let config = chars(150, 50);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    let boundaries = grapheme_boundaries(&text);
    assert!(chunks.iter().all(|c| boundaries.contains(&c.char_start)));
}

#[test]
fn token_sizes_are_four_chars_each() {
    let config = ChunkConfig::new(100, 25, SizeUnit::Tokens).expect("valid");
    assert_eq!((config.max_chars(), config.overlap_chars()), (400, 100));
    let text = numbered_sentences(50).join(" ");
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    assert!(chunks.iter().all(|c| c.token_estimate <= 100));
}

#[test]
fn estimate_tokens_rounds_chars_up() {
    assert_eq!(estimate_tokens(""), 0);
    assert_eq!(estimate_tokens("abcd"), 1);
    assert_eq!(estimate_tokens("abcde"), 2);
    assert_eq!(estimate_tokens("ééééé"), 2);
    assert_eq!(estimate_tokens("👨‍👩‍👧"), 2);
}

#[test]
fn a_heading_left_at_the_end_of_a_chunk_starts_the_next_one() {
    let section = |n: usize| {
        format!(
            "Section {n} text explains how part {n} of the system behaves under load and why it was built this way."
        )
    };
    let text = format!(
        "{}\n\n{}\n\n## Backups\n\n{}\n\n3.2. Point-in-time recovery\n\n{}",
        section(1),
        section(2),
        section(3),
        section(4)
    );
    let config = chars(260, 0);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    for chunk in &chunks {
        for heading in ["## Backups", "3.2. Point-in-time recovery"] {
            assert!(
                !chunk.text.ends_with(heading),
                "{heading:?} was left at the end of {:?}",
                chunk.text
            );
        }
    }
    assert!(texts(&chunks)
        .iter()
        .any(|chunk| chunk.starts_with("## Backups\n\nSection 3")));
    // Greedy packing would have ended the first chunk with "## Backups" (it fits, Section 3 does not).
    assert!(texts(&chunks)[0].ends_with("Section 2 text explains how part 2 of the system behaves under load and why it was built this way."));
}

#[test]
fn a_sentence_or_the_last_paragraph_is_never_taken_for_a_heading() {
    // Short paragraphs that end like sentences stay where greedy packing puts them, and a heading at
    // the very end of the text has nothing to introduce.
    let text = "The first paragraph is here, and it is long enough to fill most of a chunk.\n\nShort one.\n\n\
                Another paragraph follows it here, also long enough to need a chunk.\n\nThe end";
    let config = chars(100, 0);
    let chunks = chunk_text(text, &config);
    assert_invariants(text, &config, &chunks, true);
    assert!(
        texts(&chunks)[0].ends_with("Short one."),
        "{:?}",
        texts(&chunks)
    );
    assert!(texts(&chunks).last().unwrap().ends_with("The end"));
}

#[test]
fn a_heading_before_a_block_that_must_be_cut_leads_its_first_piece() {
    // A caption, then a table with no sentence structure that is far larger than a chunk.
    let table: String = (1..=40)
        .map(|row| format!("SHMMAX {row} | Maximum size of shared memory segment {row} | bytes\n"))
        .collect();
    let text = format!(
        "The kernel parameters below limit shared memory on most systems, and the defaults are often too low \
         for a busy server with many connections.\n\nTable 19.1. System V IPC Parameters\n\n{table}"
    );
    let config = chars(400, 0);
    let chunks = chunk_text(&text, &config);
    assert_invariants(&text, &config, &chunks, true);
    assert!(
        !texts(&chunks).contains(&"Table 19.1. System V IPC Parameters"),
        "the caption was emitted alone: {:?}",
        texts(&chunks)
    );
    assert!(texts(&chunks)
        .iter()
        .any(|chunk| chunk.starts_with("Table 19.1. System V IPC Parameters\n\nSHMMAX 1 |")));
}

#[test]
fn graphemes_longer_than_a_chunk_are_cut_and_nothing_is_lost() {
    // One grapheme of thousands of combining marks (or of emoji joined by U+200D) is cut at the window's end
    // (the only cut there is), and a run of spaces that each carry marks is text, not blank: skipped as blank
    // after a hard cut, everything after the first chunk was lost.
    let config = chars(100, 20);
    for text in [
        format!("b{}", "\u{301}".repeat(5_000)),
        "\u{1F468}\u{200D}".repeat(2_000),
        format!("b{}", "\u{301}\u{301}\u{301} ".repeat(1_000)),
        format!(" {}", "\u{301}".repeat(5_000)),
    ] {
        let chunks = chunk_text(&text, &config);
        assert_invariants(&text, &config, &chunks, false);
        assert!(chunks.len() > 10, "{} chunks", chunks.len());
    }
}
