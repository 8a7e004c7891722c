//! Many generated texts, every invariant checked on each.

mod common;

use common::{check_invariants, new_chars};
use rag_chunk::{chunk_text, ChunkConfig, SizeUnit};

/// xorshift64*: deterministic, so a failure reproduces from its seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const WORDS: &[&str] = &[
    "the",
    "index",
    "PostgreSQL",
    "vacuum",
    "über",
    "naïve",
    "e\u{301}te\u{301}",
    "東京",
    "データベース",
    "مرحبا",
    "שלום",
    "Ελληνικά",
    "👨‍👩‍👧‍👦",
    "🇯🇵",
    "👍🏽",
    "x",
    "ab-cd",
    "3.14",
    "e.g.",
    "U.S.A.",
    "(note)",
    "\"quoted\"",
    "don't",
    "α",
    "한국어",
    "ไทยภาษา",
];
const SENTENCE_ENDS: &[&str] = &[".", "?", "!", "。", "؟", "...", ".\"", ""];
const SPACES: &[&str] = &[
    " ", " ", " ", "  ", "\t", "\u{a0}", "\u{3000}", "\n", "\r\n",
];
const PARAGRAPH_BREAKS: &[&str] = &[
    "\n\n", "\n \n", "\r\n\r\n", "\n\n\n\n", "\u{0C}", "\u{2029}",
];

fn sentence(rng: &mut Rng, out: &mut String) {
    let most_words = if rng.below(10) == 0 { 120 } else { 18 };
    let words = 1 + rng.below(most_words);
    for index in 0..words {
        if index > 0 {
            out.push_str(rng.pick(SPACES));
        }
        out.push_str(rng.pick(WORDS));
    }
    out.push_str(rng.pick(SENTENCE_ENDS));
}

/// A run with no sentence structure: base64, minified JSON, a table, or CJK without punctuation.
fn blob(rng: &mut Rng, out: &mut String) {
    let length = rng.below(900);
    match rng.below(4) {
        0 => {
            const ALPHABET: &[u8] =
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            out.extend((0..length).map(|_| char::from(ALPHABET[rng.below(ALPHABET.len())])));
        }
        1 => {
            for n in 0..length / 20 {
                out.push_str(&format!("{{\"k{n}\":[{},\"v\"]}},", rng.below(1000)));
            }
        }
        2 => {
            for n in 0..length / 25 {
                out.push_str(&format!("| {n} | {} | cell |\n", rng.below(99_999)));
            }
        }
        _ => out.extend((0..length).map(|n| ['字', '漢', '😀', 'é', '🏳'][(n * 7 + length) % 5])),
    }
}

fn generated_text(rng: &mut Rng) -> String {
    let mut text = String::new();
    if rng.below(4) == 0 {
        text.push_str(rng.pick(SPACES));
    }
    let paragraphs = rng.below(12);
    for paragraph in 0..paragraphs {
        if paragraph > 0 {
            text.push_str(rng.pick(PARAGRAPH_BREAKS));
        }
        let most_sentences = if rng.below(5) == 0 { 30 } else { 4 };
        let sentences = 1 + rng.below(most_sentences);
        for index in 0..sentences {
            if index > 0 {
                text.push_str(rng.pick(SPACES));
            }
            if rng.below(12) == 0 {
                blob(rng, &mut text);
            } else {
                sentence(rng, &mut text);
            }
        }
    }
    if rng.below(3) == 0 {
        text.push_str(rng.pick(PARAGRAPH_BREAKS));
    }
    text
}

fn generated_config(rng: &mut Rng) -> ChunkConfig {
    let size = 100 + rng.below(500);
    let overlap = match rng.below(4) {
        0 => 0,
        1 => rng.below(size),
        _ => rng.below(size / 3),
    };
    ChunkConfig::new(size, overlap, SizeUnit::Characters).expect("generated within bounds")
}

/// How many texts to generate; `RAG_CHUNK_PROPERTY_CASES` raises it for a longer soak (with --release).
fn case_count() -> u64 {
    std::env::var("RAG_CHUNK_PROPERTY_CASES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(300)
}

#[test]
fn generated_texts_keep_every_invariant() {
    let mut multi_chunk_texts = 0;
    let cases = case_count();
    for seed in 0..cases {
        let mut rng = Rng::new(seed);
        let text = generated_text(&mut rng);
        let config = generated_config(&mut rng);
        let chunks = chunk_text(&text, &config);
        if let Err(problem) = check_invariants(&text, &config, &chunks, true) {
            panic!(
                "seed {seed}: {problem}\nconfig: {config:?}\ntext: {text:?}\nchunks: {chunks:#?}"
            );
        }
        if chunks.len() >= 2 {
            multi_chunk_texts += 1;
            let last = &chunks[chunks.len() - 1];
            let tail = new_chars(Some(&chunks[chunks.len() - 2]), last);
            assert!(
                tail >= config.max_chars() / 4,
                "seed {seed}: last chunk adds only {tail} chars\nconfig: {config:?}\nchunks: {chunks:#?}"
            );
        }
        // Chunking is a pure function of its input.
        assert_eq!(chunk_text(&text, &config), chunks, "seed {seed}");
    }
    // The generator must exercise the multi-chunk paths, not just produce one chunk per text.
    assert!(
        multi_chunk_texts > cases / 2,
        "only {multi_chunk_texts} of {cases} texts gave several chunks"
    );
}

#[test]
fn generated_texts_keep_every_invariant_at_extreme_sizes() {
    for seed in 1_000_000..1_000_000 + case_count() / 40 {
        let mut rng = Rng::new(seed);
        let mut text = String::new();
        for _ in 0..10 {
            text.push_str(&generated_text(&mut rng));
            text.push_str("\n\n");
        }
        for (size, overlap) in [(100, 99), (10_000, 5_000), (101, 1), (2_000, 0)] {
            let config = ChunkConfig::new(size, overlap, SizeUnit::Characters).expect("in range");
            let chunks = chunk_text(&text, &config);
            if let Err(problem) = check_invariants(&text, &config, &chunks, true) {
                panic!("seed {seed}, size {size}, overlap {overlap}: {problem}");
            }
        }
    }
}
