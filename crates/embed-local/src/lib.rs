//! In-process sentence embeddings with a BERT-family model (all-MiniLM-L6-v2 by default, 384 dimensions),
//! so the rag extension can embed text inside a PostgreSQL backend with no model server.
//!
//! A model directory holds `config.json` (the Hugging Face BERT configuration), `tokenizer.json`,
//! `model.safetensors` (F32 weights) and optionally `sentence_bert_config.json`, whose `max_seq_length`
//! is the window sentence-transformers applies (256 for all-MiniLM-L6-v2, although the position table
//! has 512 rows). `scripts/fetch-model` installs the default model.
//!
//! The output matches sentence-transformers: token embeddings from the last layer, mean-pooled over the
//! attention mask, then L2-normalised, so the dot product of two vectors is their cosine similarity.
//!
//! Memory: `model.safetensors` is memory-mapped read-only and the forward pass (module `bert`) reads
//! every weight in place, so all backends share one copy of the weights through the page cache; each
//! process only owns its activations, which are freed after every call. See
//! [`LocalModel::weights_are_mapped`] for the one exception (files with unaligned tensors).
//!
//! Threads: the matrix products and attention run on a private rayon pool of [`LoadOptions::threads`] workers (default:
//! the number of cores, at most 2), created with every signal blocked so that PostgreSQL's signal
//! handlers keep running on the backend's own thread.
//!
//! Inputs longer than the model's window are rejected with [`LocalModelError::TooLong`]: truncating
//! would silently embed only the start of a chunk.

#![warn(missing_docs)]

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use tokenizers::Tokenizer;

mod bert;
mod rerank;
mod weights;

pub use bert::Pooling;
use bert::{BertConfig, Encoder};
pub use rerank::{CrossEncoder, Scored};
use weights::WeightFile;

/// Name of the BERT configuration file inside a model directory.
pub const CONFIG_FILE: &str = "config.json";
/// Name of the Hugging Face tokenizer file inside a model directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Name of the F32 safetensors weights file inside a model directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// Optional sentence-transformers configuration whose `max_seq_length` narrows the window.
pub const SENTENCE_CONFIG_FILE: &str = "sentence_bert_config.json";
/// Optional sentence-transformers pooling configuration; without it the model is mean-pooled.
pub const POOLING_CONFIG_FILE: &str = "1_Pooling/config.json";

/// Most bytes an input may have per token of the model's window. A text that fits the window almost never comes
/// near it (English averages four or five bytes a token; a chunk is at most 10,000 characters); one far over it
/// cost the tokenizer about 215 bytes of memory a byte before the window was checked, with no interrupt check
/// (a 16 MB `rag_embed` input: 3.4 GB and a cancel 10 s late; red team 22).
pub const MAX_BYTES_PER_WINDOW_TOKEN: usize = 256;

/// Upper bound on tokens in one forward pass, whatever the caller's batch size.
const MAX_TOKENS_PER_PASS: usize = 2048;
/// The same for the cross-encoder, whose passes are where a cancel of a search waits: its twelve layers take
/// about three times MiniLM's six-layer time a token, and a pass of 2,048 tokens made a cancel up to 1.5 s late
/// (red team 20). At 1,024 the longest pass here is 155-177 ms instead of 302-348 ms, at the same time a pair
/// (`rerank_bench`, interleaved runs: 17.3-18.7 ms against 15.8-18.4 ms); 512 cost a quarter more a pair.
pub(crate) const MAX_RERANK_TOKENS_PER_PASS: usize = 1024;
/// Upper bound on inputs in one forward pass, so short inputs still go in reasonably sized groups.
const MAX_INPUTS_PER_PASS: usize = 64;

/// How a [`LocalModel`] is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    /// Worker threads for the tensor work. Values below 1 are treated as 1.
    pub threads: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            threads: default_threads(),
        }
    }
}

/// Where tests, benchmarks and scripts/fetch-model expect the default model: `$RAG_MODEL_DIR`, else
/// `rag/models/all-MiniLM-L6-v2` under `pg_config --sharedir`.
pub fn default_model_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RAG_MODEL_DIR") {
        return PathBuf::from(dir);
    }
    let share_dir = std::process::Command::new("pg_config")
        .arg("--sharedir")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_else(|| "/usr/share/postgresql/15".to_owned());
    Path::new(&share_dir).join("rag/models/all-MiniLM-L6-v2")
}

/// Where tests and benchmarks expect the default reranker: `$RAG_RERANKER_DIR`, else
/// `rag/models/ms-marco-MiniLM-L-12-v2` beside the default embedding model.
pub fn default_reranker_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RAG_RERANKER_DIR") {
        return PathBuf::from(dir);
    }
    let embedding_dir = default_model_dir();
    embedding_dir
        .parent()
        .unwrap_or(&embedding_dir)
        .join("ms-marco-MiniLM-L-12-v2")
}

/// The default worker count: the number of cores, capped at 2 because a PostgreSQL server runs many
/// backends and a single embedding call should not take over the machine.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|cores| cores.get())
        .unwrap_or(1)
        .clamp(1, 2)
}

/// Everything that can go wrong while loading a model or embedding text.
#[derive(Debug)]
pub enum LocalModelError {
    /// A model file could not be opened, read or mapped.
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A model file was read but its content is unusable.
    InvalidFile {
        /// The file concerned.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The tokenizer rejected an input.
    Tokenize {
        /// Position of the input in the batch.
        index: usize,
        /// The tokenizer's message.
        message: String,
    },
    /// An input has more tokens (special tokens included) than the model's window.
    TooLong {
        /// Position of the input in the batch.
        index: usize,
        /// Its token count.
        tokens: usize,
        /// The model's window ([`LocalModel::max_tokens`]).
        max: usize,
    },
    /// The input has more bytes than the model takes for its window ([`MAX_BYTES_PER_WINDOW_TOKEN`] a token),
    /// refused before it is tokenized: the tokenizer holds about 200 bytes a byte of its input, and checks no
    /// interrupt.
    TooManyBytes {
        /// Position of the input in the batch.
        index: usize,
        /// Its length in bytes.
        bytes: usize,
        /// The most the model takes.
        max_bytes: usize,
    },
    /// The forward pass failed.
    Inference {
        /// The tensor library's message.
        message: String,
    },
    /// The worker thread pool could not be created.
    ThreadPool {
        /// The thread library's message.
        message: String,
    },
    /// The caller's interrupt check asked to stop between two forward passes.
    Interrupted,
}

impl fmt::Display for LocalModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LocalModelError::Io { path, source } => {
                write!(f, "cannot read model file {}: {source}", path.display())?;
                if source.kind() == std::io::ErrorKind::NotFound {
                    write!(f, " (run scripts/fetch-model to install the default model)")?;
                }
                Ok(())
            }
            LocalModelError::InvalidFile { path, message } => {
                write!(f, "invalid model file {}: {message}", path.display())
            }
            LocalModelError::Tokenize { index, message } => {
                write!(f, "cannot tokenize input {index}: {message}")
            }
            LocalModelError::TooLong { index, tokens, max } => write!(
                f,
                "input {index} has {tokens} tokens, more than the model's window of {max} tokens"
            ),
            LocalModelError::TooManyBytes {
                index,
                bytes,
                max_bytes,
            } => write!(
                f,
                "input {index} is {bytes} bytes, more than the {max_bytes} this model takes ({MAX_BYTES_PER_WINDOW_TOKEN} a token of its window)"
            ),
            LocalModelError::Inference { message } => {
                write!(f, "embedding forward pass failed: {message}")
            }
            LocalModelError::ThreadPool { message } => {
                write!(f, "cannot start the embedding worker threads: {message}")
            }
            LocalModelError::Interrupted => write!(f, "embedding was interrupted"),
        }
    }
}

impl std::error::Error for LocalModelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LocalModelError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn invalid_file(path: &Path, message: impl Into<String>) -> LocalModelError {
    LocalModelError::InvalidFile {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, LocalModelError> {
    std::fs::read(path).map_err(|source| LocalModelError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// What [`LocalModel::embed_interruptible`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// One L2-normalised vector per input, in input order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens the inputs became, `[CLS]` and `[SEP]` included: what a usage ledger counts.
    pub tokens: usize,
}

/// A loaded sentence-embedding model. Cheap to share: all methods take `&self` and the type is
/// `Send + Sync`.
pub struct LocalModel {
    tokenizer: Tokenizer,
    encoder: Encoder,
    pooling: Pooling,
    max_tokens: usize,
    threads: usize,
    pool: rayon::ThreadPool,
}

impl fmt::Debug for LocalModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalModel")
            .field("dimensions", &self.encoder.hidden_size())
            .field("pooling", &self.pooling)
            .field("max_tokens", &self.max_tokens)
            .field("threads", &self.threads)
            .field("weights_mapped", &self.encoder.weights_are_mapped())
            .finish_non_exhaustive()
    }
}

#[derive(serde::Deserialize)]
struct SentenceConfig {
    max_seq_length: Option<usize>,
}

#[derive(serde::Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
}

impl LocalModel {
    /// Loads the model in `model_dir` (`config.json`, `tokenizer.json`, `model.safetensors`, optionally
    /// `sentence_bert_config.json`) with [`LoadOptions::default`].
    pub fn load(model_dir: &Path) -> Result<LocalModel, LocalModelError> {
        LocalModel::load_with(model_dir, &LoadOptions::default())
    }

    /// Loads the model in `model_dir` with explicit options.
    pub fn load_with(
        model_dir: &Path,
        options: &LoadOptions,
    ) -> Result<LocalModel, LocalModelError> {
        let encoder = load_encoder(model_dir)?;
        let pooling = pooling(model_dir)?;
        let max_tokens = window(model_dir, encoder.positions())?;
        let tokenizer_path = model_dir.join(TOKENIZER_FILE);
        let tokenizer = load_tokenizer(&tokenizer_path, encoder.vocabulary_rows(), None)?;
        let threads = options.threads.max(1);
        let pool = build_pool(threads)?;
        Ok(LocalModel {
            tokenizer,
            encoder,
            pooling,
            max_tokens,
            threads,
            pool,
        })
    }

    /// Length of the embedding vectors (384 for all-MiniLM-L6-v2).
    pub fn dimensions(&self) -> usize {
        self.encoder.hidden_size()
    }

    /// The longest input accepted, in tokens including `[CLS]` and `[SEP]`: `max_seq_length` from
    /// `sentence_bert_config.json` when present (256 for all-MiniLM-L6-v2, the length it was trained
    /// for), otherwise `max_position_embeddings`.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Worker threads used for the tensor work.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Whether the weights are read in place from the memory-mapped file, shared with every other
    /// process through the page cache. False only for a file whose tensors are not 4-byte aligned (or
    /// on a big-endian machine): those weights are decoded into a private copy instead.
    pub fn weights_are_mapped(&self) -> bool {
        self.encoder.weights_are_mapped()
    }

    /// Number of tokens `text` becomes, `[CLS]` and `[SEP]` included: compare with [`max_tokens`]
    /// to size chunks.
    ///
    /// [`max_tokens`]: LocalModel::max_tokens
    pub fn count_tokens(&self, text: &str) -> Result<usize, LocalModelError> {
        self.encode(0, text).map(|ids| ids.len())
    }

    /// The token ids `text` becomes, `[CLS]` and `[SEP]` included, exactly as [`embed`] feeds them
    /// to the model (no padding, no truncation).
    ///
    /// [`embed`]: LocalModel::embed
    pub fn token_ids(&self, text: &str) -> Result<Vec<u32>, LocalModelError> {
        self.encode(0, text)
    }

    /// Embeds a batch, returning one L2-normalised vector of [`dimensions`] values per input, in input
    /// order. An input longer than [`max_tokens`] fails the whole call with
    /// [`LocalModelError::TooLong`]; nothing is truncated.
    ///
    /// [`dimensions`]: LocalModel::dimensions
    /// [`max_tokens`]: LocalModel::max_tokens
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, LocalModelError> {
        self.embed_interruptible(texts, &mut || false)
            .map(|embedded| embedded.vectors)
    }

    /// [`embed`](LocalModel::embed) with the token count, calling `interrupted` before every forward pass (at most 2048
    /// tokens, well under a second on one core) and stopping with [`LocalModelError::Interrupted`] when
    /// it returns true, so a large batch never keeps a PostgreSQL process from a cancel or a shutdown.
    pub fn embed_interruptible(
        &self,
        texts: &[&str],
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Embedded, LocalModelError> {
        let mut encoded = Vec::with_capacity(texts.len());
        for (index, text) in texts.iter().enumerate() {
            let max_bytes = self.max_tokens.saturating_mul(MAX_BYTES_PER_WINDOW_TOKEN);
            if text.len() > max_bytes {
                return Err(LocalModelError::TooManyBytes {
                    index,
                    bytes: text.len(),
                    max_bytes,
                });
            }
            let ids = self.encode(index, text)?;
            if ids.is_empty() {
                // Only a tokenizer without [CLS]/[SEP] post-processing gets here; a mean over no
                // tokens has no meaning, and a zero vector would match nothing without saying why.
                return Err(LocalModelError::Tokenize {
                    index,
                    message: "the text yields no tokens".to_owned(),
                });
            }
            if ids.len() > self.max_tokens {
                return Err(LocalModelError::TooLong {
                    index,
                    tokens: ids.len(),
                    max: self.max_tokens,
                });
            }
            encoded.push(ids);
        }

        let mut vectors = Vec::with_capacity(encoded.len());
        for pass in passes(&encoded, MAX_TOKENS_PER_PASS) {
            if interrupted() {
                release_freed_memory();
                return Err(LocalModelError::Interrupted);
            }
            let inputs: Vec<&[u32]> = encoded[pass].iter().map(Vec::as_slice).collect();
            vectors.extend(
                self.pool
                    .install(|| self.encoder.embed(&inputs, self.pooling, self.threads))?,
            );
        }
        release_freed_memory();
        Ok(Embedded {
            tokens: encoded.iter().map(Vec::len).sum(),
            vectors,
        })
    }

    fn encode(&self, index: usize, text: &str) -> Result<Vec<u32>, LocalModelError> {
        self.tokenizer
            .encode_fast(text, true)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|error| LocalModelError::Tokenize {
                index,
                message: error.to_string(),
            })
    }
}

/// Splits inputs, in order, into forward passes. Inputs are not padded, so a pass is any run of them;
/// the caps bound the activations (intermediate layer: tokens × intermediate_size × 4 bytes, 12 MB for
/// MiniLM at the cap). An input over the token cap gets a pass of its own.
fn passes(encoded: &[Vec<u32>], max_tokens: usize) -> Vec<std::ops::Range<usize>> {
    let mut passes = Vec::new();
    let mut start = 0;
    while start < encoded.len() {
        let mut end = start;
        let mut tokens = 0;
        while end < encoded.len()
            && end - start < MAX_INPUTS_PER_PASS
            && (end == start || tokens + encoded[end].len() <= max_tokens)
        {
            tokens += encoded[end].len();
            end += 1;
        }
        passes.push(start..end);
        start = end;
    }
    passes
}

fn load_encoder(model_dir: &Path) -> Result<Encoder, LocalModelError> {
    let config_path = model_dir.join(CONFIG_FILE);
    let config: BertConfig = serde_json::from_slice(&read_file(&config_path)?)
        .map_err(|error| invalid_file(&config_path, error.to_string()))?;
    let weights = WeightFile::open(&model_dir.join(WEIGHTS_FILE))?;
    Encoder::new(weights, &config)
}

/// The pooling sentence-transformers applies, from `1_Pooling/config.json`; mean when the file is absent.
fn pooling(model_dir: &Path) -> Result<Pooling, LocalModelError> {
    let path = model_dir.join(POOLING_CONFIG_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Pooling::Mean),
        Err(source) => return Err(LocalModelError::Io { path, source }),
    };
    let config: PoolingConfig =
        serde_json::from_slice(&bytes).map_err(|error| invalid_file(&path, error.to_string()))?;
    match (
        config.pooling_mode_cls_token,
        config.pooling_mode_mean_tokens,
    ) {
        (true, false) => Ok(Pooling::Cls),
        (false, true) => Ok(Pooling::Mean),
        _ => Err(invalid_file(
            &path,
            "exactly one of pooling_mode_cls_token and pooling_mode_mean_tokens must be true",
        )),
    }
}

/// The model window: sentence-transformers' `max_seq_length` when present, never more than the
/// position table allows.
fn window(model_dir: &Path, max_position_embeddings: usize) -> Result<usize, LocalModelError> {
    let path = model_dir.join(SENTENCE_CONFIG_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(max_position_embeddings)
        }
        Err(source) => return Err(LocalModelError::Io { path, source }),
    };
    let config: SentenceConfig =
        serde_json::from_slice(&bytes).map_err(|error| invalid_file(&path, error.to_string()))?;
    match config.max_seq_length {
        Some(0) => Err(invalid_file(&path, "max_seq_length is 0")),
        Some(length) => Ok(length.min(max_position_embeddings)),
        None => Ok(max_position_embeddings),
    }
}

/// The tokenizer without the packaged padding (MiniLM's pads to 128, the reranker's to 512: padding costs
/// work and would be averaged into a mean) and with `truncation` in place of the packaged one (none for
/// embeddings, where a cut would hide an over-long input).
fn load_tokenizer(
    path: &Path,
    model_vocab_size: usize,
    truncation: Option<tokenizers::TruncationParams>,
) -> Result<Tokenizer, LocalModelError> {
    let mut tokenizer = Tokenizer::from_bytes(read_file(path)?)
        .map_err(|error| invalid_file(path, error.to_string()))?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(truncation)
        .map_err(|error| invalid_file(path, error.to_string()))?;
    if tokenizer.get_vocab_size(true) > model_vocab_size {
        return Err(invalid_file(
            path,
            format!(
                "the tokenizer knows {} tokens but config.json's vocab_size is {model_vocab_size}",
                tokenizer.get_vocab_size(true)
            ),
        ));
    }
    Ok(tokenizer)
}

fn build_pool(threads: usize) -> Result<rayon::ThreadPool, LocalModelError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|index| format!("rag-embed-{index}"))
        .spawn_handler(|thread| {
            let mut builder = std::thread::Builder::new();
            if let Some(name) = thread.name() {
                builder = builder.name(name.to_owned());
            }
            rag_threads::spawn(builder, || thread.run())?;
            Ok(())
        })
        .build()
        .map_err(|error| LocalModelError::ThreadPool {
            message: error.to_string(),
        })
}

/// Hands the activations' freed memory back to the kernel. glibc keeps freed blocks of the pool
/// threads' arenas mapped (measured: about 200 MB of RssAnon after a 200-chunk run), which a
/// long-lived PostgreSQL backend would carry per connection; trimming costs well under a millisecond.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_freed_memory() {
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_freed_memory() {}

/// A model that is loaded on first use and then kept for the life of the process, as a PostgreSQL
/// backend wants: sessions that never embed never pay for loading. A failed load is not remembered,
/// so installing the model later fixes the next call without a reconnect.
pub struct LazyLocalModel {
    model_dir: PathBuf,
    options: LoadOptions,
    loaded: OnceLock<LocalModel>,
    loading: Mutex<()>,
}

impl LazyLocalModel {
    /// Remembers where the model is; nothing is read until [`get`](LazyLocalModel::get).
    pub fn new(model_dir: impl Into<PathBuf>, options: LoadOptions) -> LazyLocalModel {
        LazyLocalModel {
            model_dir: model_dir.into(),
            options,
            loaded: OnceLock::new(),
            loading: Mutex::new(()),
        }
    }

    /// The directory the model is loaded from.
    pub fn model_dir(&self) -> &Path {
        &self.model_dir
    }

    /// Whether the model has been loaded already.
    pub fn is_loaded(&self) -> bool {
        self.loaded.get().is_some()
    }

    /// The model, loading it first if this is the first successful call.
    pub fn get(&self) -> Result<&LocalModel, LocalModelError> {
        if let Some(model) = self.loaded.get() {
            return Ok(model);
        }
        // Serialises loads so two threads do not both map and copy the weights; a poisoned lock
        // only means an earlier load panicked, which leaves nothing half-initialised here.
        let _guard = self
            .loading
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(model) = self.loaded.get() {
            return Ok(model);
        }
        let model = LocalModel::load_with(&self.model_dir, &self.options)?;
        Ok(self.loaded.get_or_init(|| model))
    }
}

impl fmt::Debug for LazyLocalModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyLocalModel")
            .field("model_dir", &self.model_dir)
            .field("options", &self.options)
            .field("loaded", &self.is_loaded())
            .finish()
    }
}

/// Cosine similarity of two vectors; for the unit vectors [`LocalModel::embed`] returns it is their
/// dot product. Returns 0 when either vector is zero or the lengths differ.
pub fn cosine_similarity(left: &[f32], right: &[f32]) -> f32 {
    if left.len() != right.len() {
        return 0.0;
    }
    let dot: f32 = left.iter().zip(right).map(|(a, b)| a * b).sum();
    let left_norm = left.iter().map(|a| a * a).sum::<f32>().sqrt();
    let right_norm = right.iter().map(|b| b * b).sum::<f32>().sqrt();
    if left_norm == 0.0 || right_norm == 0.0 {
        0.0
    } else {
        dot / (left_norm * right_norm)
    }
}
