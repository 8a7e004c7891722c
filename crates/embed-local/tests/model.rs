//! Tests against the real all-MiniLM-L6-v2 weights. The model directory is $RAG_MODEL_DIR, or where
//! scripts/fetch-model installs it; without it every test here fails and says how to install it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rag_embed_local::{
    cosine_similarity, LazyLocalModel, LoadOptions, LocalModel, LocalModelError,
};

fn model_dir() -> PathBuf {
    rag_embed_local::default_model_dir()
}

fn model() -> &'static LocalModel {
    static MODEL: OnceLock<LocalModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = model_dir();
        LocalModel::load(&dir).unwrap_or_else(|error| {
            panic!(
                "cannot load the embedding model from {}: {error}\n\
                 Run scripts/fetch-model (or set RAG_MODEL_DIR to a model directory).",
                dir.display()
            )
        })
    })
}

fn embed_one(text: &str) -> Vec<f32> {
    let mut vectors = model().embed(&[text]).expect("embedding succeeds");
    vectors.pop().expect("one vector per input")
}

fn max_abs_difference(left: &[f32], right: &[f32]) -> f32 {
    assert_eq!(left.len(), right.len());
    left.iter()
        .zip(right)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

#[test]
fn model_shape_is_minilm() {
    let model = model();
    assert_eq!(model.dimensions(), 384);
    // sentence_bert_config.json's max_seq_length, below the 512-row position table.
    assert_eq!(model.max_tokens(), 256);
}

#[test]
fn quickstart_similarities_match_sentence_transformers() {
    let vectors = model()
        .embed(&[
            "The weather is lovely today.",
            "It's so sunny outside!",
            "He drove to the stadium.",
        ])
        .expect("embedding succeeds");
    // Published by sentence-transformers for all-MiniLM-L6-v2; a padded or truncated tokenizer,
    // a wrong pooling or a missing normalisation moves these far beyond the tolerance.
    let expected = [((0, 1), 0.6660), ((0, 2), 0.1046), ((1, 2), 0.1411)];
    for ((i, j), similarity) in expected {
        let actual = cosine_similarity(&vectors[i], &vectors[j]);
        assert!(
            (actual - similarity).abs() < 0.0005,
            "sim({i},{j}) = {actual:.4}, sentence-transformers gives {similarity:.4}"
        );
    }
    for vector in &vectors {
        let norm = vector.iter().map(|value| value * value).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "vector norm {norm}, expected 1");
    }
}

struct Reference {
    sentences: Vec<String>,
    token_ids: Vec<Vec<u32>>,
    embeddings: Vec<Vec<f32>>,
}

/// Written by `python3 reference/forward.py --fixture reference/expected.json`: a numpy BERT with
/// its own safetensors reader and WordPiece tokenizer, computed in float64.
fn reference() -> Reference {
    let text = include_str!("../reference/expected.json");
    let json: serde_json::Value = serde_json::from_str(text).expect("expected.json parses");
    let strings = |value: &serde_json::Value| -> Vec<String> {
        value
            .as_array()
            .expect("array")
            .iter()
            .map(|item| item.as_str().expect("string").to_owned())
            .collect()
    };
    let matrix = |value: &serde_json::Value| -> Vec<Vec<f64>> {
        value
            .as_array()
            .expect("array")
            .iter()
            .map(|row| {
                row.as_array()
                    .expect("array")
                    .iter()
                    .map(|item| item.as_f64().expect("number"))
                    .collect()
            })
            .collect()
    };
    Reference {
        sentences: strings(&json["sentences"]),
        token_ids: matrix(&json["token_ids"])
            .into_iter()
            .map(|row| row.into_iter().map(|id| id as u32).collect())
            .collect(),
        embeddings: matrix(&json["embeddings"])
            .into_iter()
            .map(|row| row.into_iter().map(|value| value as f32).collect())
            .collect(),
    }
}

#[test]
fn tokenizer_matches_the_independent_wordpiece() {
    let reference = reference();
    for (sentence, expected) in reference.sentences.iter().zip(&reference.token_ids) {
        let ids = model().token_ids(sentence).expect("tokenizes");
        assert_eq!(&ids, expected, "token ids of {sentence:?}");
        assert_eq!(
            model().count_tokens(sentence).expect("counts"),
            expected.len()
        );
    }
    // The packaged tokenizer.json truncates at 128: the long fixture sentence proves it is off.
    assert!(reference.token_ids.iter().any(|ids| ids.len() > 128));
}

#[test]
fn embeddings_match_the_numpy_reference() {
    let reference = reference();
    let sentences: Vec<&str> = reference.sentences.iter().map(String::as_str).collect();
    // One padded batch (8 to 215 tokens) and each input alone must both agree with the reference.
    let batched = model().embed(&sentences).expect("embedding succeeds");
    for (index, sentence) in sentences.iter().enumerate() {
        let alone = embed_one(sentence);
        let expected = &reference.embeddings[index];
        let batched_error = max_abs_difference(&batched[index], expected);
        let alone_error = max_abs_difference(&alone, expected);
        assert!(
            batched_error < 1e-4 && alone_error < 1e-4,
            "{sentence:?}: max |rust - numpy| = {batched_error:e} batched, {alone_error:e} alone"
        );
    }
}

#[test]
fn padding_inside_a_batch_does_not_change_a_vector() {
    let short = "Tables are made of rows and columns.";
    let long = "A much longer neighbour forces the short input to be padded with many positions \
                that the attention mask and the mean pooling must both ignore completely, \
                otherwise the short input's vector would drift with the company it keeps.";
    let alone = embed_one(short);
    let together = model()
        .embed(&[long, short, long])
        .expect("embedding succeeds");
    let difference = max_abs_difference(&alone, &together[1]);
    assert!(
        difference < 1e-5,
        "padding moved the vector by {difference:e}"
    );
}

#[test]
fn paraphrased_questions_retrieve_their_passage() {
    let passages = [
        "VACUUM reclaims storage occupied by dead tuples. In normal PostgreSQL operation, tuples that \
         are deleted or obsoleted by an update are not physically removed from their table until a \
         VACUUM is done.",
        "A B-tree index can be used for equality and range queries on data that can be sorted, and \
         it is the default index type created by CREATE INDEX.",
        "pg_dump is a utility for backing up a database. It makes consistent backups even if the \
         database is being used concurrently, and it does not block other users.",
        "Write-ahead logging ensures data integrity: changes to data files are written only after \
         the changes have been logged and the log records flushed to permanent storage.",
        "The listen_addresses setting specifies the TCP/IP addresses on which the server listens \
         for connections from client applications.",
        "A foreign key constraint specifies that the values in a column must match the values \
         appearing in some row of another table, maintaining referential integrity.",
    ];
    let questions = [
        ("How do I free up disk space taken by deleted rows?", 0),
        (
            "How can I make a copy of my database while people keep using it?",
            2,
        ),
        (
            "Which network interfaces does the server accept connections on?",
            4,
        ),
        (
            "How do I make sure a column only holds values that exist in a different table?",
            5,
        ),
        (
            "What protects my data if the machine crashes before pages reach disk?",
            3,
        ),
    ];
    let passage_vectors = model().embed(&passages).expect("embedding succeeds");
    for (question, relevant) in questions {
        let query = embed_one(question);
        let scores: Vec<f32> = passage_vectors
            .iter()
            .map(|passage| cosine_similarity(&query, passage))
            .collect();
        let best = (0..scores.len())
            .max_by(|&a, &b| scores[a].total_cmp(&scores[b]))
            .expect("passages");
        assert_eq!(
            best, relevant,
            "{question:?} ranked passage {best} first; scores {scores:?}"
        );
    }
}

#[test]
fn input_longer_than_the_window_is_an_error() {
    let model = model();
    // "database" is one WordPiece token: [CLS] + n words + [SEP] is n + 2 tokens.
    let words_that_fit = model.max_tokens() - 2;
    let fits = vec!["database"; words_that_fit].join(" ");
    assert_eq!(
        model.count_tokens(&fits).expect("counts"),
        model.max_tokens()
    );
    let too_long = vec!["database"; words_that_fit + 1].join(" ");
    let vectors = model
        .embed(&[&fits])
        .expect("an input of exactly max_tokens embeds");
    assert_eq!(vectors[0].len(), 384);

    match model.embed(&["short", &too_long]) {
        Err(LocalModelError::TooLong { index, tokens, max }) => {
            assert_eq!(
                (index, tokens, max),
                (1, model.max_tokens() + 1, model.max_tokens())
            );
            let message = LocalModelError::TooLong { index, tokens, max }.to_string();
            assert!(
                message.contains("input 1") && message.contains("257") && message.contains("256")
            );
        }
        other => panic!("expected TooLong, got {other:?}"),
    }
}

#[test]
fn an_input_far_over_the_window_is_refused_before_it_is_tokenized() {
    let model = model();
    let max_bytes = model.max_tokens() * rag_embed_local::MAX_BYTES_PER_WINDOW_TOKEN;
    // One long word is a single [UNK] token however long: the byte bound applies all the same.
    let at_the_bound = "x".repeat(max_bytes);
    assert!(model.embed(&[&at_the_bound]).is_ok());
    let over = "a ".repeat(8 * 1024 * 1024);
    match model.embed(&["short", &over]) {
        Err(LocalModelError::TooManyBytes {
            index: 1,
            bytes,
            max_bytes: reported,
        }) => {
            assert_eq!((bytes, reported), (over.len(), max_bytes));
        }
        other => panic!("expected TooManyBytes, got {other:?}"),
    }
}

#[test]
fn empty_batch_and_empty_text() {
    assert!(model().embed(&[]).expect("empty batch").is_empty());
    let vector = embed_one("");
    let norm = vector.iter().map(|value| value * value).sum::<f32>().sqrt();
    assert_eq!(vector.len(), 384);
    assert!((norm - 1.0).abs() < 1e-5);
    assert_eq!(model().count_tokens("").expect("counts"), 2);
}

#[test]
fn embedding_is_deterministic() {
    let text = "Determinism matters: a cached query vector must equal a fresh one.";
    let first = embed_one(text);
    let second = embed_one(text);
    assert_eq!(first, second);
    let batch = model().embed(&[text, text]).expect("embedding succeeds");
    assert_eq!(batch[0], batch[1]);
}

#[test]
fn thread_count_does_not_change_results() {
    let single = LocalModel::load_with(&model_dir(), &LoadOptions { threads: 1 }).expect("loads");
    let double = LocalModel::load_with(&model_dir(), &LoadOptions { threads: 2 }).expect("loads");
    assert_eq!((single.threads(), double.threads()), (1, 2));
    let texts = [
        "Indexes speed up reads.",
        "Every write also updates each index.",
    ];
    let one = single.embed(&texts).expect("embeds");
    let two = double.embed(&texts).expect("embeds");
    for (a, b) in one.iter().zip(&two) {
        assert!(max_abs_difference(a, b) < 1e-5);
    }
}

#[test]
fn missing_model_directory_names_the_file_and_the_fix() {
    let missing = Path::new("/nonexistent/rag-model");
    let error = LocalModel::load(missing).expect_err("no model there");
    assert!(matches!(error, LocalModelError::Io { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("/nonexistent/rag-model/config.json"),
        "{message}"
    );
    assert!(message.contains("scripts/fetch-model"), "{message}");
}

#[test]
fn corrupt_files_are_reported_with_their_path() {
    let dir = std::env::temp_dir().join(format!("rag-embed-local-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for file in [
        "config.json",
        "tokenizer.json",
        "model.safetensors",
        "sentence_bert_config.json",
    ] {
        std::fs::copy(model_dir().join(file), dir.join(file)).expect("copies model file");
    }
    let broken = |file: &str, content: &[u8]| -> String {
        let original = std::fs::read(model_dir().join(file)).expect("reads");
        std::fs::write(dir.join(file), content).expect("writes");
        let message = LocalModel::load(&dir)
            .expect_err("broken model")
            .to_string();
        std::fs::write(dir.join(file), original).expect("restores");
        message
    };
    let message = broken("config.json", b"{\"hidden_size\": 384}");
    assert!(
        message.contains("config.json") && message.contains("invalid"),
        "{message}"
    );
    let message = broken("tokenizer.json", b"not json");
    assert!(message.contains("tokenizer.json"), "{message}");
    let message = broken("model.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{}");
    assert!(message.contains("model.safetensors"), "{message}");
    let message = broken("sentence_bert_config.json", b"{\"max_seq_length\": 0}");
    assert!(message.contains("max_seq_length"), "{message}");
    // Restored files load again.
    assert!(LocalModel::load(&dir).is_ok());
    std::fs::remove_dir_all(&dir).expect("cleans up");
}

#[test]
fn an_interrupt_stops_between_forward_passes() {
    // More inputs than one pass takes (64), so the batch needs two passes.
    let texts: Vec<String> = (0..80).map(|n| format!("Sentence number {n}.")).collect();
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let mut checks = 0;
    let result = model().embed_interruptible(&texts, &mut || {
        checks += 1;
        checks > 1
    });
    assert!(
        matches!(result, Err(LocalModelError::Interrupted)),
        "{result:?}"
    );
    assert_eq!(
        checks, 2,
        "checked before each pass, stopped before the second"
    );
    let uninterrupted = model()
        .embed_interruptible(&texts, &mut || false)
        .expect("embeds");
    assert_eq!(
        uninterrupted.vectors,
        model().embed(&texts).expect("embeds")
    );
    let tokens: usize = texts
        .iter()
        .map(|text| model().count_tokens(text).expect("counts"))
        .sum();
    assert_eq!(uninterrupted.tokens, tokens);
}

#[test]
fn weights_are_read_in_place_from_the_mapped_file() {
    assert!(
        model().weights_are_mapped(),
        "the packaged model.safetensors aligns its tensors, so no private copy should be made"
    );
}

/// Rewrites `model.safetensors` with `extra` spaces appended to its JSON header, which shifts every
/// tensor's data by that many bytes, and returns the directory holding the copy.
fn model_copy_with_shifted_data(extra: usize, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rag-embed-local-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for file in ["config.json", "tokenizer.json", "sentence_bert_config.json"] {
        std::fs::copy(model_dir().join(file), dir.join(file)).expect("copies model file");
    }
    let original = std::fs::read(model_dir().join("model.safetensors")).expect("reads weights");
    let header_len = u64::from_le_bytes(original[..8].try_into().unwrap()) as usize;
    let mut shifted = Vec::with_capacity(original.len() + extra);
    shifted.extend_from_slice(&((header_len + extra) as u64).to_le_bytes());
    shifted.extend_from_slice(&original[8..8 + header_len]);
    shifted.extend(std::iter::repeat_n(b' ', extra));
    shifted.extend_from_slice(&original[8 + header_len..]);
    std::fs::write(dir.join("model.safetensors"), shifted).expect("writes weights");
    dir
}

#[test]
fn unaligned_weights_are_decoded_and_give_the_same_vectors() {
    let dir = model_copy_with_shifted_data(1, "unaligned");
    let unaligned = LocalModel::load(&dir).expect("loads a file with unaligned tensors");
    assert!(!unaligned.weights_are_mapped());
    let texts = ["The weather is lovely today.", "He drove to the stadium."];
    let expected = model().embed(&texts).expect("mapped embeds");
    let actual = unaligned.embed(&texts).expect("decoded embeds");
    for (actual, expected) in actual.iter().zip(&expected) {
        assert!(max_abs_difference(actual, expected) < 1e-6);
    }
    let aligned_again = model_copy_with_shifted_data(4, "realigned");
    assert!(LocalModel::load(&aligned_again)
        .expect("loads")
        .weights_are_mapped());
    std::fs::remove_dir_all(&dir).expect("cleans up");
    std::fs::remove_dir_all(&aligned_again).expect("cleans up");
}

#[test]
fn weights_that_disagree_with_config_json_are_refused() {
    let dir = model_copy_with_shifted_data(0, "mismatch");
    let config = std::fs::read_to_string(dir.join("config.json")).expect("reads config");
    let wrong = config.replace("\"intermediate_size\": 1536", "\"intermediate_size\": 1024");
    assert_ne!(wrong, config, "config.json names intermediate_size 1536");
    std::fs::write(dir.join("config.json"), wrong).expect("writes config");
    let message = LocalModel::load(&dir)
        .expect_err("shape mismatch")
        .to_string();
    assert!(
        message.contains("intermediate.dense.weight") && message.contains("[1536, 384]"),
        "{message}"
    );
    std::fs::write(
        dir.join("config.json"),
        config.replace("\"gelu\"", "\"swish\""),
    )
    .expect("writes");
    let message = LocalModel::load(&dir).expect_err("activation").to_string();
    assert!(message.contains("hidden_act \"swish\""), "{message}");
    std::fs::remove_dir_all(&dir).expect("cleans up");
}

#[test]
fn lazy_model_loads_on_first_use_and_retries_after_failure() {
    let missing = LazyLocalModel::new("/nonexistent/rag-model", LoadOptions::default());
    assert!(missing.get().is_err());
    assert!(!missing.is_loaded());

    let lazy = LazyLocalModel::new(model_dir(), LoadOptions { threads: 1 });
    assert!(!lazy.is_loaded());
    let first = lazy.get().expect("loads") as *const LocalModel;
    assert!(lazy.is_loaded());
    let second = lazy.get().expect("already loaded") as *const LocalModel;
    assert_eq!(first, second, "the model is loaded once");
}

#[test]
fn model_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<LocalModel>();
    assert_send_sync::<LazyLocalModel>();
    let vectors: Vec<Vec<f32>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ["first thread", "second thread"]
            .into_iter()
            .map(|text| scope.spawn(move || embed_one(text)))
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("thread"))
            .collect()
    });
    assert_eq!(vectors[0], embed_one("first thread"));
    assert_eq!(vectors[1], embed_one("second thread"));
}
