//! The OpenAI-compatible API (OpenAI itself, vLLM, llama.cpp server, LM Studio, ...): `/embeddings`,
//! `/chat/completions`, `/models`, relative to a base URL that already ends in `/v1`.

use serde::{Deserialize, Serialize};

use crate::time::format_rfc3339;
use crate::{ChatMessage, ChatOutput, ChatRequest, EmbedOutput, ModelInfo};

pub(crate) const EMBED_ROUTE: &str = "/embeddings";
pub(crate) const CHAT_ROUTE: &str = "/chat/completions";
pub(crate) const MODELS_ROUTE: &str = "/models";
/// llama.cpp's server, vLLM, Jina and Cohere (v1 and v2) answer this route with one score per document.
pub(crate) const RERANK_ROUTE: &str = "/rerank";

/// Name given to the caller's schema in `response_format`; OpenAI requires one, and it has no meaning to us.
const SCHEMA_NAME: &str = "response";

#[derive(Serialize)]
struct EmbedRequest<'a> {
    model: &'a str,
    input: &'a [String],
    /// Pinned so a server defaulting to base64 cannot hand us strings where numbers belong.
    encoding_format: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    dimensions: Option<u32>,
}

pub(crate) fn embed_body(
    model: &str,
    inputs: &[String],
    dimensions: Option<u32>,
) -> serde_json::Result<Vec<u8>> {
    serde_json::to_vec(&EmbedRequest {
        model,
        input: inputs,
        encoding_format: "float",
        dimensions,
    })
}

#[derive(Serialize)]
struct RerankRequest<'a> {
    model: &'a str,
    query: &'a str,
    documents: &'a [String],
    /// Every document: the caller wants a score for each, not a shortlist.
    top_n: usize,
    return_documents: bool,
}

pub(crate) fn rerank_body(
    model: &str,
    query: &str,
    documents: &[String],
) -> serde_json::Result<Vec<u8>> {
    serde_json::to_vec(&RerankRequest {
        model,
        query,
        documents,
        top_n: documents.len(),
        return_documents: false,
    })
}

#[derive(Deserialize)]
struct RerankItem {
    index: usize,
    /// `relevance_score` (Jina, Cohere, vLLM, llama.cpp); `score` in some older servers.
    #[serde(alias = "score")]
    relevance_score: f64,
}

#[derive(Deserialize)]
struct RerankResponse {
    results: Vec<RerankItem>,
}

/// Scores in document order. Servers answer best first, each result naming its document by index: every index
/// of `0..documents` must appear exactly once, with a finite score, since a score paired with the wrong
/// passage is worse than failing.
pub(crate) fn parse_rerank(body: &[u8], documents: usize) -> Result<Vec<f32>, String> {
    let response: RerankResponse =
        serde_json::from_slice(body).map_err(|error| error.to_string())?;
    if response.results.len() != documents {
        return Err(format!(
            "{} results for {documents} documents",
            response.results.len()
        ));
    }
    let mut scores = vec![None; documents];
    for item in response.results {
        let slot = scores
            .get_mut(item.index)
            .ok_or_else(|| format!("result index {} is not below {documents}", item.index))?;
        if slot.is_some() {
            return Err(format!("result index {} appears twice", item.index));
        }
        // Checked as stored: a score beyond f32's range (1e39) would become infinite, pass any threshold and
        // make the lead NaN.
        let score = item.relevance_score as f32;
        if !score.is_finite() {
            return Err(format!(
                "result {} has a score that is not a finite 32-bit number",
                item.index
            ));
        }
        *slot = Some(score);
    }
    Ok(scores
        .into_iter()
        .map(|score| score.unwrap_or_default())
        .collect())
}

#[derive(Deserialize, Default)]
struct Usage {
    #[serde(default, deserialize_with = "crate::validate::token_count")]
    prompt_tokens: Option<i64>,
    #[serde(default, deserialize_with = "crate::validate::token_count")]
    completion_tokens: Option<i64>,
}

#[derive(Deserialize)]
struct EmbeddingItem {
    index: usize,
    embedding: Vec<f32>,
}

#[derive(Deserialize)]
struct EmbedResponse {
    data: Vec<EmbeddingItem>,
    #[serde(default)]
    usage: Option<Usage>,
}

/// Parses and reorders by `index`; a response whose indices are not exactly `0..n` is refused, since pairing
/// a vector with the wrong input is worse than failing.
pub(crate) fn parse_embed(body: &[u8]) -> Result<EmbedOutput, String> {
    let mut response: EmbedResponse =
        serde_json::from_slice(body).map_err(|error| error.to_string())?;
    response.data.sort_by_key(|item| item.index);
    if let Some((position, item)) = response
        .data
        .iter()
        .enumerate()
        .find(|(position, item)| item.index != *position)
    {
        return Err(format!(
            "embedding indices are not 0..{}: position {position} holds index {}",
            response.data.len(),
            item.index
        ));
    }
    Ok(EmbedOutput {
        vectors: response
            .data
            .into_iter()
            .map(|item| item.embedding)
            .collect(),
        prompt_tokens: response.usage.and_then(|usage| usage.prompt_tokens),
    })
}

#[derive(Serialize)]
struct JsonSchemaFormat<'a> {
    name: &'static str,
    schema: &'a serde_json::Value,
    strict: bool,
}

#[derive(Serialize)]
struct ResponseFormat<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    json_schema: JsonSchemaFormat<'a>,
}

#[derive(Serialize)]
struct ChatBody<'a> {
    model: &'a str,
    messages: &'a [ChatMessage],
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<ResponseFormat<'a>>,
}

pub(crate) fn chat_body(request: &ChatRequest<'_>) -> serde_json::Result<Vec<u8>> {
    let response_format = request.json_schema.map(|schema| ResponseFormat {
        kind: "json_schema",
        json_schema: JsonSchemaFormat {
            name: SCHEMA_NAME,
            schema,
            strict: true,
        },
    });
    serde_json::to_vec(&ChatBody {
        model: request.model,
        messages: request.messages,
        max_tokens: request.max_tokens,
        temperature: request.temperature,
        response_format,
    })
}

#[derive(Deserialize)]
struct ChoiceMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
}

#[derive(Deserialize)]
struct Choice {
    message: ChoiceMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ChatResponse {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
}

pub(crate) fn parse_chat(body: &[u8]) -> Result<ChatOutput, String> {
    let response: ChatResponse = serde_json::from_slice(body).map_err(|error| error.to_string())?;
    let usage = response.usage.unwrap_or_default();
    let Some(choice) = response.choices.into_iter().next() else {
        return Err("`choices` is empty".to_string());
    };
    if let Some(refusal) = choice.message.refusal.filter(|text| !text.is_empty()) {
        return Err(format!(
            "the model refused: {}",
            crate::http::excerpt(&refusal, crate::http::EXCERPT_CHARS)
        ));
    }
    let Some(content) = choice.message.content else {
        return Err(format!(
            "`choices[0].message.content` is missing (finish_reason {:?})",
            choice.finish_reason.as_deref().unwrap_or("none")
        ));
    };
    Ok(ChatOutput {
        content: crate::validate::storable_text(content),
        prompt_tokens: usage.prompt_tokens,
        completion_tokens: usage.completion_tokens,
        truncated: choice.finish_reason.as_deref() == Some("length"),
    })
}

#[derive(Deserialize)]
struct Model {
    id: String,
    #[serde(default)]
    created: Option<i64>,
}

#[derive(Deserialize)]
struct ModelsResponse {
    data: Vec<Model>,
}

pub(crate) fn parse_models(body: &[u8]) -> serde_json::Result<Vec<ModelInfo>> {
    let response: ModelsResponse = serde_json::from_slice(body)?;
    Ok(response
        .data
        .into_iter()
        .map(|model| ModelInfo {
            name: crate::validate::storable_text(model.id),
            size_bytes: None,
            modified_at: model.created.and_then(format_rfc3339),
            family: None,
        })
        .collect())
}
