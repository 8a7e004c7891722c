//! A cross-encoder reranker (cross-encoder/ms-marco-MiniLM-L-12-v2 by default): BERT reads the question
//! and one passage together and a one-logit classifier says how well the passage answers it. Unlike the
//! distance between two separately made embeddings, the logit is comparable across questions, which is
//! what lets one threshold refuse off-topic questions.
//!
//! The model directory has the same files as an embedding model (`config.json`, `tokenizer.json`,
//! `model.safetensors`), and the checkpoint must carry `bert.pooler.dense.*` and `classifier.*`.

use std::fmt;
use std::path::Path;

use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::bert::Encoder;
use crate::{
    build_pool, invalid_file, load_encoder, load_tokenizer, passes, release_freed_memory,
    LoadOptions, LocalModelError, TOKENIZER_FILE,
};

/// What [`CrossEncoder::score_interruptible`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// One relevance logit per passage, in passage order: above 0 the model finds the passage relevant.
    pub scores: Vec<f32>,
    /// Tokens the pairs became, special tokens included.
    pub tokens: usize,
    /// Passages cut to fit the window (their ends were not read).
    pub truncated: usize,
}

/// A loaded cross-encoder. All methods take `&self`; the type is `Send + Sync`.
pub struct CrossEncoder {
    tokenizer: Tokenizer,
    encoder: Encoder,
    max_tokens: usize,
    threads: usize,
    pool: rayon::ThreadPool,
}

impl fmt::Debug for CrossEncoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrossEncoder")
            .field("max_tokens", &self.max_tokens)
            .field("threads", &self.threads)
            .field("weights_mapped", &self.encoder.weights_are_mapped())
            .finish_non_exhaustive()
    }
}

impl CrossEncoder {
    /// Loads the cross-encoder in `model_dir`. `max_tokens` caps the pair's length (question, passage
    /// and three special tokens); `None` uses the model's position table (512). A lower cap is faster:
    /// attention grows with the square of the pair's length.
    pub fn load_with(
        model_dir: &Path,
        options: &LoadOptions,
        max_tokens: Option<usize>,
    ) -> Result<CrossEncoder, LocalModelError> {
        let encoder = load_encoder(model_dir)?;
        let weights_path = model_dir.join(crate::WEIGHTS_FILE);
        if !encoder.has_classifier() {
            return Err(invalid_file(
                &weights_path,
                "no bert.pooler.dense and classifier tensors: this is an embedding model, not a cross-encoder",
            ));
        }
        let max_tokens = max_tokens
            .unwrap_or(encoder.positions())
            .clamp(8, encoder.positions());
        // Unlike embedding, where a truncated chunk would silently be represented by its start, scoring
        // the start of a long passage is the standard practice and still ranks it; the count of cut
        // passages is reported. LongestFirst cuts the passage, which is the longer part in practice.
        let tokenizer = load_tokenizer(
            &model_dir.join(TOKENIZER_FILE),
            encoder.vocabulary_rows(),
            Some(TruncationParams {
                max_length: max_tokens,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }),
        )?;
        let threads = options.threads.max(1);
        let pool = build_pool(threads)?;
        Ok(CrossEncoder {
            tokenizer,
            encoder,
            max_tokens,
            threads,
            pool,
        })
    }

    /// The longest pair scored, in tokens; longer passages are cut to fit.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Worker threads used for the tensor work.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Whether the weights are read in place from the mapped file (see `LocalModel::weights_are_mapped`).
    pub fn weights_are_mapped(&self) -> bool {
        self.encoder.weights_are_mapped()
    }

    /// The relevance logit of each passage for `query`, in passage order.
    pub fn score(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>, LocalModelError> {
        self.score_interruptible(query, passages, &mut || false)
            .map(|scored| scored.scores)
    }

    /// [`score`](CrossEncoder::score), calling `interrupted` before every forward pass and stopping with
    /// [`LocalModelError::Interrupted`] when it returns true.
    pub fn score_interruptible(
        &self,
        query: &str,
        passages: &[&str],
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Scored, LocalModelError> {
        let mut ids = Vec::with_capacity(passages.len());
        let mut types = Vec::with_capacity(passages.len());
        let mut truncated = 0;
        for (index, passage) in passages.iter().enumerate() {
            let encoding = self
                .tokenizer
                .encode_fast((query, *passage), true)
                .map_err(|error| LocalModelError::Tokenize {
                    index,
                    message: error.to_string(),
                })?;
            if encoding.get_ids().is_empty() {
                return Err(LocalModelError::Tokenize {
                    index,
                    message: "the pair yields no tokens".to_owned(),
                });
            }
            if !encoding.get_overflowing().is_empty() {
                truncated += 1;
            }
            ids.push(encoding.get_ids().to_vec());
            types.push(encoding.get_type_ids().to_vec());
        }
        let mut scores = Vec::with_capacity(passages.len());
        for pass in passes(&ids, crate::MAX_RERANK_TOKENS_PER_PASS) {
            if interrupted() {
                release_freed_memory();
                return Err(LocalModelError::Interrupted);
            }
            let inputs: Vec<&[u32]> = ids[pass.clone()].iter().map(Vec::as_slice).collect();
            let token_types: Vec<&[u32]> = types[pass].iter().map(Vec::as_slice).collect();
            scores.extend(
                self.pool
                    .install(|| self.encoder.relevance(&inputs, &token_types, self.threads))?,
            );
        }
        release_freed_memory();
        Ok(Scored {
            tokens: ids.iter().map(Vec::len).sum(),
            scores,
            truncated,
        })
    }
}
