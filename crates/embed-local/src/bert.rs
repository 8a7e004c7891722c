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
                    *value =
                        0.5 * *value * (1.0 + libm::erff(*value * std::f32::consts::FRAC_1_SQRT_2));
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

/// Rows handed to one rayon task by the position-wise loops: enough work to outweigh scheduling.
const ROWS_PER_TASK: usize = 16;

pub(crate) struct Encoder {
    weights: WeightFile,
    word_embeddings: TensorRef,
    position_embeddings: TensorRef,
    token_type_embeddings: TensorRef,
    embeddings_norm: LayerNorm,
    layers: Vec<Layer>,
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
        Ok(Encoder {
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

    /// Sentence embeddings of `inputs` (token ids with `[CLS]`/`[SEP]`, each non-empty and at most
    /// [`Encoder::positions`] long): the last layer mean-pooled over each input's tokens, then
    /// L2-normalised as sentence-transformers does. Runs its parallel parts on the current rayon pool.
    pub fn embed(
        &self,
        inputs: &[&[u32]],
        threads: usize,
    ) -> Result<Vec<Vec<f32>>, LocalModelError> {
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
            return Ok(Vec::new());
        }
        let parallelism = if threads > 1 {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };

        let mut hidden = self.embeddings(inputs, tokens)?;
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

        Ok(spans
            .iter()
            .map(|span| {
                let mut mean = vec![0.0f32; self.hidden];
                for row in hidden[span.start * self.hidden..span.end * self.hidden]
                    .chunks_exact(self.hidden)
                {
                    for (total, value) in mean.iter_mut().zip(row) {
                        *total += value;
                    }
                }
                let count = span.len() as f32;
                mean.iter_mut().for_each(|value| *value /= count);
                // sentence-transformers divides by max(norm, 1e-12).
                let norm = mean
                    .iter()
                    .map(|value| value * value)
                    .sum::<f32>()
                    .sqrt()
                    .max(1e-12);
                mean.iter_mut().for_each(|value| *value /= norm);
                mean
            })
            .collect())
    }

    /// Word + position + token-type-0 embeddings of every token, layer-normalised: `[tokens, hidden]`.
    fn embeddings(&self, inputs: &[&[u32]], tokens: usize) -> Result<Vec<f32>, LocalModelError> {
        let width = self.hidden;
        let words = self.weights.values(&self.word_embeddings);
        let positions = self.weights.values(&self.position_embeddings);
        // Single-segment inputs only ever use token type 0.
        let token_type = &self.weights.values(&self.token_type_embeddings)[..width];
        let rows = self.vocabulary_rows();
        let mut hidden = Vec::with_capacity(tokens * width);
        for ids in inputs {
            for (position, &id) in ids.iter().enumerate() {
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
