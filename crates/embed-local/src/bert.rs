//! The BERT encoder's forward pass, computed over weights borrowed from the mapped model file.
//!
//! A tensor library would copy every weight into buffers it owns (candle's CPU tensors do), which
//! costs each PostgreSQL backend its own ~90 MB copy of MiniLM. Here the weights stay in the page
//! cache: every matrix product reads them in place through [`gemm`] (the kernel crate candle itself
//! uses) with strides, so a PyTorch `Linear` weight stored as `[out, in]` is used transposed without
//! being rearranged.
//!
//! Inputs are not padded. All tokens of a pass are stacked into one `[tokens, hidden]` matrix for the
//! position-wise layers, and attention runs per input and head over that input's own rows, so no work
//! or memory goes to padding and no attention mask is needed.

use gemm::Parallelism;
use rayon::prelude::*;
use serde::Deserialize;

use crate::weights::{TensorRef, WeightFile};
use crate::LocalModelError;

/// The fields of a Hugging Face BERT `config.json` that the forward pass depends on.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_activation")]
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab_size")]
    pub type_vocab_size: usize,
    #[serde(default = "default_layer_norm_eps")]
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub position_embedding_type: Option<String>,
}

fn default_activation() -> String {
    "gelu".to_owned()
}

fn default_type_vocab_size() -> usize {
    2
}

fn default_layer_norm_eps() -> f64 {
    1e-12
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activation {
    /// `gelu` in Hugging Face configurations: the exact form with the error function.
    GeluErf,
    /// `gelu_new`, `gelu_pytorch_tanh`: the tanh approximation.
    GeluTanh,
    Relu,
}

impl Activation {
    fn from_config(name: &str) -> Option<Activation> {
        match name {
            "gelu" => Some(Activation::GeluErf),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Some(Activation::GeluTanh),
            "relu" => Some(Activation::Relu),
            _ => None,
        }
    }

    fn apply(self, values: &mut [f32]) {
        match self {
            Activation::GeluErf => {
                for value in values {
                    *value = 0.5 * *value * (1.0 + erf(*value * std::f32::consts::FRAC_1_SQRT_2));
                }
            }
            Activation::GeluTanh => {
                const SQRT_2_OVER_PI: f32 = 0.797_884_6;
                for value in values {
                    let x = *value;
                    *value =
                        0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh());
                }
            }
            Activation::Relu => {
                for value in values {
                    *value = value.max(0.0);
                }
            }
        }
    }
}

/// A `Linear` layer: `weight` is `[outputs, inputs]`, as PyTorch stores it.
struct Linear {
    weight: TensorRef,
    bias: TensorRef,
    inputs: usize,
    outputs: usize,
}

struct LayerNorm {
    weight: TensorRef,
    bias: TensorRef,
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_output: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

/// BERT's pooler (a dense layer and tanh over the `[CLS]` row) and a one-logit classifier on top: what
/// `BertForSequenceClassification` adds to the encoder, and what a cross-encoder scores with.
struct ClassifierHead {
    pooler: Linear,
    classifier: Linear,
}

/// How the last layer's token rows become one sentence vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the input's tokens (sentence-transformers' default; all-MiniLM-L6-v2, e5).
    Mean,
    /// The `[CLS]` row alone (BGE models).
    Cls,
}

/// Rows handed to one rayon task by the position-wise loops: enough work to outweigh scheduling.
const ROWS_PER_TASK: usize = 16;

pub(crate) struct Encoder {
    weights: WeightFile,
    word_embeddings: TensorRef,
    position_embeddings: TensorRef,
    token_type_embeddings: TensorRef,
    embeddings_norm: LayerNorm,
    layers: Vec<Layer>,
    /// The sequence-classification head of a cross-encoder: absent in a sentence-embedding checkpoint.
    head: Option<ClassifierHead>,
    hidden: usize,
    heads: usize,
    layer_norm_eps: f32,
    activation: Activation,
}

impl Encoder {
    /// Resolves every tensor the forward pass reads and checks its shape against `config`, so that a
    /// forward pass can never index outside a weight.
    pub fn new(weights: WeightFile, config: &BertConfig) -> Result<Encoder, LocalModelError> {
        let invalid = |message: String| LocalModelError::InvalidFile {
            path: weights.path().to_path_buf(),
            message,
        };
        if config.hidden_size == 0
            || config.num_attention_heads == 0
            || !config
                .hidden_size
                .is_multiple_of(config.num_attention_heads)
        {
            return Err(invalid(format!(
                "hidden_size {} is not a positive multiple of num_attention_heads {}",
                config.hidden_size, config.num_attention_heads
            )));
        }
        if config.type_vocab_size == 0
            || config.max_position_embeddings == 0
            || config.intermediate_size == 0
            || config.num_hidden_layers == 0
        {
            return Err(invalid(
                "type_vocab_size, max_position_embeddings, intermediate_size and num_hidden_layers must be positive"
                    .to_owned(),
            ));
        }
        let activation = Activation::from_config(&config.hidden_act).ok_or_else(|| {
            invalid(format!(
                "hidden_act \"{}\" is not supported (gelu, gelu_new, gelu_pytorch_tanh, relu)",
                config.hidden_act
            ))
        })?;
        if let Some(kind) = &config.position_embedding_type {
            if kind != "absolute" {
                return Err(invalid(format!(
                    "position_embedding_type \"{kind}\" is not supported, only \"absolute\""
                )));
            }
        }

        // Checkpoints saved from `BertModel` name tensors `embeddings.…`; those saved from a task model
        // nest them under `bert.…`.
        let prefix = ["", "bert."]
            .into_iter()
            .find(|prefix| weights.contains(&format!("{prefix}embeddings.word_embeddings.weight")))
            .ok_or_else(|| {
                invalid(
                    "no embeddings.word_embeddings.weight tensor: not a BERT checkpoint".to_owned(),
                )
            })?;
        let hidden = config.hidden_size;
        let tensor =
            |name: &str, shape: &[usize]| weights.tensor(&format!("{prefix}{name}"), shape);
        let linear =
            |name: &str, inputs: usize, outputs: usize| -> Result<Linear, LocalModelError> {
                Ok(Linear {
                    weight: tensor(&format!("{name}.weight"), &[outputs, inputs])?,
                    bias: tensor(&format!("{name}.bias"), &[outputs])?,
                    inputs,
                    outputs,
                })
            };
        let norm = |name: &str| -> Result<LayerNorm, LocalModelError> {
            Ok(LayerNorm {
                weight: tensor(&format!("{name}.weight"), &[hidden])?,
                bias: tensor(&format!("{name}.bias"), &[hidden])?,
            })
        };

        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for index in 0..config.num_hidden_layers {
            let layer = format!("encoder.layer.{index}");
            layers.push(Layer {
                query: linear(&format!("{layer}.attention.self.query"), hidden, hidden)?,
                key: linear(&format!("{layer}.attention.self.key"), hidden, hidden)?,
                value: linear(&format!("{layer}.attention.self.value"), hidden, hidden)?,
                attention_output: linear(
                    &format!("{layer}.attention.output.dense"),
                    hidden,
                    hidden,
                )?,
                attention_norm: norm(&format!("{layer}.attention.output.LayerNorm"))?,
                intermediate: linear(
                    &format!("{layer}.intermediate.dense"),
                    hidden,
                    config.intermediate_size,
                )?,
                output: linear(
                    &format!("{layer}.output.dense"),
                    config.intermediate_size,
                    hidden,
                )?,
                output_norm: norm(&format!("{layer}.output.LayerNorm"))?,
            });
        }
        // `BertForSequenceClassification` keeps its classifier beside `bert.`, not inside it.
        let head = if weights.contains(&format!("{prefix}pooler.dense.weight"))
            && weights.contains("classifier.weight")
        {
            let classifier = Linear {
                weight: weights.tensor("classifier.weight", &[1, hidden])?,
                bias: weights.tensor("classifier.bias", &[1])?,
                inputs: hidden,
                outputs: 1,
            };
            Some(ClassifierHead {
                pooler: linear("pooler.dense", hidden, hidden)?,
                classifier,
            })
        } else {
            None
        };
        Ok(Encoder {
            head,
            word_embeddings: tensor(
                "embeddings.word_embeddings.weight",
                &[config.vocab_size, hidden],
            )?,
            position_embeddings: tensor(
                "embeddings.position_embeddings.weight",
                &[config.max_position_embeddings, hidden],
            )?,
            token_type_embeddings: tensor(
                "embeddings.token_type_embeddings.weight",
                &[config.type_vocab_size, hidden],
            )?,
            embeddings_norm: norm("embeddings.LayerNorm")?,
            layers,
            hidden,
            heads: config.num_attention_heads,
            layer_norm_eps: config.layer_norm_eps as f32,
            activation,
            weights,
        })
    }

    /// Rows of the word-embedding table: the largest token id plus one.
    pub fn vocabulary_rows(&self) -> usize {
        self.word_embeddings.shape[0]
    }

    /// Rows of the position table: the longest input the weights can encode.
    pub fn positions(&self) -> usize {
        self.position_embeddings.shape[0]
    }

    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    pub fn weights_are_mapped(&self) -> bool {
        self.weights.is_mapped()
    }

    /// Whether the checkpoint carries a pooler and a one-logit classifier, so [`Encoder::relevance`] works.
    pub fn has_classifier(&self) -> bool {
        self.head.is_some()
    }

    /// Sentence embeddings of `inputs` (token ids with `[CLS]`/`[SEP]`, each non-empty and at most
    /// [`Encoder::positions`] long): the last layer pooled per `pooling`, then L2-normalised as
    /// sentence-transformers does. Runs its parallel parts on the current rayon pool.
    pub fn embed(
        &self,
        inputs: &[&[u32]],
        pooling: Pooling,
        threads: usize,
    ) -> Result<Vec<Vec<f32>>, LocalModelError> {
        let Some((hidden, spans)) = self.forward(inputs, None, threads)? else {
            return Ok(Vec::new());
        };
        Ok(spans
            .iter()
            .map(|span| {
                let rows = &hidden[span.start * self.hidden..span.end * self.hidden];
                let mut pooled = match pooling {
                    Pooling::Cls => rows[..self.hidden].to_vec(),
                    Pooling::Mean => {
                        let mut mean = vec![0.0f32; self.hidden];
                        for row in rows.chunks_exact(self.hidden) {
                            for (total, value) in mean.iter_mut().zip(row) {
                                *total += value;
                            }
                        }
                        let count = span.len() as f32;
                        mean.iter_mut().for_each(|value| *value /= count);
                        mean
                    }
                };
                // sentence-transformers divides by max(norm, 1e-12).
                let norm = pooled
                    .iter()
                    .map(|value| value * value)
                    .sum::<f32>()
                    .sqrt()
                    .max(1e-12);
                pooled.iter_mut().for_each(|value| *value /= norm);
                pooled
            })
            .collect())
    }

    /// A cross-encoder's relevance logit for each input: `[CLS] query [SEP] passage [SEP]` with
    /// `token_types` 0 for the query part and 1 for the passage part, through the pooler and classifier.
    pub fn relevance(
        &self,
        inputs: &[&[u32]],
        token_types: &[&[u32]],
        threads: usize,
    ) -> Result<Vec<f32>, LocalModelError> {
        let head = self
            .head
            .as_ref()
            .ok_or_else(|| LocalModelError::Inference {
                message: "the checkpoint has no pooler and classifier: it is not a cross-encoder"
                    .to_owned(),
            })?;
        let Some((hidden, spans)) = self.forward(inputs, Some(token_types), threads)? else {
            return Ok(Vec::new());
        };
        let width = self.hidden;
        let mut first_rows = Vec::with_capacity(spans.len() * width);
        for span in &spans {
            first_rows.extend_from_slice(&hidden[span.start * width..(span.start + 1) * width]);
        }
        let mut pooled = Vec::new();
        self.linear(
            &first_rows,
            spans.len(),
            &head.pooler,
            &mut pooled,
            Parallelism::None,
        );
        pooled.iter_mut().for_each(|value| *value = value.tanh());
        let mut logits = Vec::new();
        self.linear(
            &pooled,
            spans.len(),
            &head.classifier,
            &mut logits,
            Parallelism::None,
        );
        Ok(logits)
    }

    /// The encoder's last layer for `inputs` stacked as `[tokens, hidden]`, with each input's rows;
    /// `None` for an empty batch.
    #[allow(clippy::type_complexity)]
    fn forward(
        &self,
        inputs: &[&[u32]],
        token_types: Option<&[&[u32]]>,
        threads: usize,
    ) -> Result<Option<(Vec<f32>, Vec<std::ops::Range<usize>>)>, LocalModelError> {
        let mut spans = Vec::with_capacity(inputs.len());
        let mut tokens = 0;
        for ids in inputs {
            if ids.is_empty() || ids.len() > self.positions() {
                return Err(LocalModelError::Inference {
                    message: format!(
                        "an input of {} tokens cannot be encoded (1 to {} tokens)",
                        ids.len(),
                        self.positions()
                    ),
                });
            }
            spans.push(tokens..tokens + ids.len());
            tokens += ids.len();
        }
        if tokens == 0 {
            return Ok(None);
        }
        if let Some(types) = token_types {
            if types.len() != inputs.len()
                || types
                    .iter()
                    .zip(inputs)
                    .any(|(types, ids)| types.len() != ids.len())
            {
                return Err(LocalModelError::Inference {
                    message: "token types must match the inputs one for one".to_owned(),
                });
            }
        }
        let parallelism = if threads > 1 {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };

        let mut hidden = self.embeddings(inputs, token_types, tokens)?;
        let mut query = Vec::new();
        let mut key = Vec::new();
        let mut value = Vec::new();
        let mut context = vec![0.0f32; tokens * self.hidden];
        let mut projected = Vec::new();
        let mut intermediate = Vec::new();
        for layer in &self.layers {
            self.linear(&hidden, tokens, &layer.query, &mut query, parallelism);
            self.linear(&hidden, tokens, &layer.key, &mut key, parallelism);
            self.linear(&hidden, tokens, &layer.value, &mut value, parallelism);
            self.attention(&spans, &query, &key, &value, &mut context);

            self.linear(
                &context,
                tokens,
                &layer.attention_output,
                &mut projected,
                parallelism,
            );
            self.add_and_normalise(&mut projected, &hidden, &layer.attention_norm);
            std::mem::swap(&mut hidden, &mut projected);

            self.linear(
                &hidden,
                tokens,
                &layer.intermediate,
                &mut intermediate,
                parallelism,
            );
            let activation = self.activation;
            let width = layer.intermediate.outputs;
            intermediate
                .par_chunks_mut(width * ROWS_PER_TASK)
                .for_each(|rows| activation.apply(rows));
            self.linear(
                &intermediate,
                tokens,
                &layer.output,
                &mut projected,
                parallelism,
            );
            self.add_and_normalise(&mut projected, &hidden, &layer.output_norm);
            std::mem::swap(&mut hidden, &mut projected);
        }

        Ok(Some((hidden, spans)))
    }

    /// Word + position + token-type embeddings of every token, layer-normalised: `[tokens, hidden]`.
    /// Without `token_types` every token is of type 0, as in a single-segment input.
    fn embeddings(
        &self,
        inputs: &[&[u32]],
        token_types: Option<&[&[u32]]>,
        tokens: usize,
    ) -> Result<Vec<f32>, LocalModelError> {
        let width = self.hidden;
        let words = self.weights.values(&self.word_embeddings);
        let positions = self.weights.values(&self.position_embeddings);
        let type_table = self.weights.values(&self.token_type_embeddings);
        let type_rows = self.token_type_embeddings.shape[0];
        let rows = self.vocabulary_rows();
        let mut hidden = Vec::with_capacity(tokens * width);
        for (input, ids) in inputs.iter().enumerate() {
            for (position, &id) in ids.iter().enumerate() {
                let type_id = token_types.map_or(0, |types| types[input][position] as usize);
                if type_id >= type_rows {
                    return Err(LocalModelError::Inference {
                        message: format!("token type {type_id} is outside the {type_rows} rows of the token-type table"),
                    });
                }
                let token_type = &type_table[type_id * width..(type_id + 1) * width];
                let id = id as usize;
                if id >= rows {
                    return Err(LocalModelError::Inference {
                        message: format!(
                            "token id {id} is outside the {rows} rows of the word-embedding table"
                        ),
                    });
                }
                let word = &words[id * width..(id + 1) * width];
                let position = &positions[position * width..(position + 1) * width];
                hidden.extend(
                    word.iter()
                        .zip(position)
                        .zip(token_type)
                        .map(|((word, position), token_type)| word + position + token_type),
                );
            }
        }
        let (gamma, beta) = self.norm_values(&self.embeddings_norm);
        let eps = self.layer_norm_eps;
        hidden
            .par_chunks_mut(width * ROWS_PER_TASK)
            .for_each(|rows| {
                for row in rows.chunks_exact_mut(width) {
                    layer_norm(row, gamma, beta, eps);
                }
            });
        Ok(hidden)
    }

    /// `output = input · weightᵀ + bias` for `rows` rows of `input`.
    fn linear(
        &self,
        input: &[f32],
        rows: usize,
        layer: &Linear,
        output: &mut Vec<f32>,
        parallelism: Parallelism,
    ) {
        let weight = self.weights.values(&layer.weight);
        let bias = self.weights.values(&layer.bias);
        // The unsafe call below reads and writes exactly these extents; the shapes were checked
        // against config.json when the encoder was built, so these never fail.
        assert_eq!(input.len(), rows * layer.inputs, "linear input extent");
        assert_eq!(
            weight.len(),
            layer.outputs * layer.inputs,
            "linear weight extent"
        );
        assert_eq!(bias.len(), layer.outputs, "linear bias extent");
        output.clear();
        output.reserve(rows * layer.outputs);
        for _ in 0..rows {
            output.extend_from_slice(bias);
        }
        // SAFETY: dst is `rows × outputs` row-major inside `output` (len rows·outputs), lhs is
        // `rows × inputs` row-major inside `input`, and rhs is the transpose of the `outputs × inputs`
        // row-major weight: element (i, o) at `o·inputs + i`, inside `weight`. None of them overlap.
        unsafe {
            gemm::gemm(
                rows,
                layer.outputs,
                layer.inputs,
                output.as_mut_ptr(),
                1,
                layer.outputs as isize,
                true,
                input.as_ptr(),
                1,
                layer.inputs as isize,
                weight.as_ptr(),
                layer.inputs as isize,
                1,
                1.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            );
        }
    }

    /// Scaled dot-product attention of each input over its own tokens, one task per input and head.
    fn attention(
        &self,
        spans: &[std::ops::Range<usize>],
        query: &[f32],
        key: &[f32],
        value: &[f32],
        context: &mut [f32],
    ) {
        let width = self.hidden;
        let head_width = width / self.heads;
        let tokens = spans.last().map_or(0, |span| span.end);
        assert!(
            query.len() == tokens * width
                && key.len() == tokens * width
                && value.len() == tokens * width
                && context.len() == tokens * width,
            "attention extents"
        );
        let scale = 1.0 / (head_width as f32).sqrt();
        let context = SharedOutput(context.as_mut_ptr());
        let tasks: Vec<(std::ops::Range<usize>, usize)> = spans
            .iter()
            .flat_map(|span| (0..self.heads).map(move |head| (span.clone(), head)))
            .collect();
        tasks
            .into_par_iter()
            .for_each_init(Vec::new, |scores, (span, head)| {
                let length = span.len();
                scores.clear();
                scores.resize(length * length, 0.0);
                let first = span.start * width + head * head_width;
                // SAFETY: each task reads rows `span` and columns `head·head_width..+head_width` of the
                // `tokens × width` row-major query, key and value matrices (in bounds: span.end ≤ tokens)
                // and writes the same block of `context`. Tasks differ in span or head, so the blocks they
                // write are disjoint, and `context` outlives the parallel loop.
                unsafe {
                    // scores = scale · Q_h · K_hᵀ: rhs element (j, c) is key[(span.start + c)·width + head
                    // offset + j].
                    gemm::gemm(
                        length,
                        length,
                        head_width,
                        scores.as_mut_ptr(),
                        1,
                        length as isize,
                        false,
                        query.as_ptr().add(first),
                        1,
                        width as isize,
                        key.as_ptr().add(first),
                        width as isize,
                        1,
                        0.0,
                        scale,
                        false,
                        false,
                        false,
                        Parallelism::None,
                    );
                }
                for row in scores.chunks_exact_mut(length) {
                    softmax(row);
                }
                // SAFETY: as above; context = scores · V_h into this task's own block.
                unsafe {
                    gemm::gemm(
                        length,
                        head_width,
                        length,
                        context.at(first),
                        1,
                        width as isize,
                        false,
                        scores.as_ptr(),
                        1,
                        length as isize,
                        value.as_ptr().add(first),
                        1,
                        width as isize,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        Parallelism::None,
                    );
                }
            });
    }

    /// `values = LayerNorm(values + residual)`, row by row.
    fn add_and_normalise(&self, values: &mut [f32], residual: &[f32], norm: &LayerNorm) {
        let width = self.hidden;
        let (gamma, beta) = self.norm_values(norm);
        let eps = self.layer_norm_eps;
        values
            .par_chunks_mut(width * ROWS_PER_TASK)
            .zip(residual.par_chunks(width * ROWS_PER_TASK))
            .for_each(|(rows, residual_rows)| {
                for (row, residual_row) in rows
                    .chunks_exact_mut(width)
                    .zip(residual_rows.chunks_exact(width))
                {
                    row.iter_mut()
                        .zip(residual_row)
                        .for_each(|(value, residual)| *value += residual);
                    layer_norm(row, gamma, beta, eps);
                }
            });
    }

    fn norm_values(&self, norm: &LayerNorm) -> (&[f32], &[f32]) {
        (
            self.weights.values(&norm.weight),
            self.weights.values(&norm.bias),
        )
    }
}

/// The context matrix, written by attention tasks in disjoint blocks.
#[derive(Clone, Copy)]
struct SharedOutput(*mut f32);

impl SharedOutput {
    /// A method rather than a field access, so closures capture the whole `Sync` wrapper.
    ///
    /// # Safety
    /// `offset` must lie inside the buffer the pointer was taken from.
    unsafe fn at(self, offset: usize) -> *mut f32 {
        self.0.add(offset)
    }
}
// SAFETY: the pointer is only dereferenced inside `Encoder::attention`, whose tasks write disjoint
// blocks of a buffer that outlives them.
unsafe impl Send for SharedOutput {}
unsafe impl Sync for SharedOutput {}

fn layer_norm(row: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let count = row.len() as f32;
    let mean = row.iter().sum::<f32>() / count;
    let variance = row
        .iter()
        .map(|value| (value - mean) * (value - mean))
        .sum::<f32>()
        / count;
    let inverse = 1.0 / (variance + eps).sqrt();
    for ((value, gamma), beta) in row.iter_mut().zip(gamma).zip(beta) {
        *value = (*value - mean) * inverse * gamma + beta;
    }
}

/// The error function by Abramowitz and Stegun 7.1.26: at most 1.5e-7 from the exact value, which is
/// below float32's resolution of GELU's result, and made of a division, a polynomial and `exp`, so it
/// costs a fraction of libm's `erff` (a profile of the 12-layer reranker had `erff` at a quarter of the
/// time). The tests compare it with libm's.
fn erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152,
        1.061_405_4,
    ];
    let magnitude = x.abs();
    let t = 1.0 / (1.0 + P * magnitude);
    let polynomial = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let value = 1.0 - polynomial * (-magnitude * magnitude).exp();
    value.copysign(x)
}

fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut total = 0.0;
    for value in row.iter_mut() {
        *value = (*value - max).exp();
        total += *value;
    }
    row.iter_mut().for_each(|value| *value /= total);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_survives_large_scores() {
        let mut row = vec![1000.0, 1001.0, 999.0];
        softmax(&mut row);
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(row[1] > row[0] && row[0] > row[2]);
    }

    #[test]
    fn layer_norm_centres_and_scales() {
        let mut row = vec![1.0, 2.0, 3.0, 4.0];
        layer_norm(&mut row, &[1.0; 4], &[0.5; 4], 1e-12);
        let mean = row.iter().sum::<f32>() / 4.0;
        assert!((mean - 0.5).abs() < 1e-6);
        let variance = row.iter().map(|v| (v - 0.5) * (v - 0.5)).sum::<f32>() / 4.0;
        assert!((variance - 1.0).abs() < 1e-5);
    }

    #[test]
    fn erf_stays_within_its_bound_of_libm() {
        let mut worst = 0.0f32;
        for step in -8000..=8000 {
            let x = step as f32 / 1000.0;
            worst = worst.max((erf(x) - libm::erff(x)).abs());
        }
        assert!(worst < 5e-7, "largest difference {worst}");
        assert_eq!(erf(0.0), 0.0);
    }

    #[test]
    fn activations_match_their_definitions() {
        let mut values = vec![-1.0f32, 0.0, 1.0, 3.0];
        Activation::GeluErf.apply(&mut values);
        // 0.5·x·(1 + erf(x/√2)) from a float64 reference.
        let expected = [-0.158_655_25f32, 0.0, 0.841_344_7, 2.995_950_5];
        for (value, expected) in values.iter().zip(expected) {
            assert!((value - expected).abs() < 1e-6, "{value} vs {expected}");
        }
        let mut values = vec![-2.0f32, 2.0];
        Activation::Relu.apply(&mut values);
        assert_eq!(values, [0.0, 2.0]);
        let mut values = vec![1.0f32];
        Activation::GeluTanh.apply(&mut values);
        assert!((values[0] - 0.841_192).abs() < 1e-5);
        assert_eq!(Activation::from_config("swish"), None);
    }
}
