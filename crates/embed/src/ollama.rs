//! Ollama's native API: `/api/embed`, `/api/chat`, `/api/tags`.

use serde::{Deserialize, Serialize};

use crate::{ChatMessage, ChatOutput, ChatRequest, EmbedOutput, ModelInfo};

pub(crate) const EMBED_ROUTE: &str = "/api/embed";
pub(crate) const CHAT_ROUTE: &str = "/api/chat";
pub(crate) const TAGS_ROUTE: &str = "/api/tags";

#[derive(Serialize)]
struct EmbedRequest<'a> {
    model: &'a str,
    input: &'a [String],
    /// Ollama silently cuts over-long inputs by default; an embedding of half a chunk would be stored as if it
    /// covered all of it, so we ask for an error instead.
    truncate: bool,
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
        truncate: false,
        dimensions,
    })
}

#[derive(Deserialize)]
struct EmbedResponse {
    embeddings: Vec<Vec<f32>>,
    #[serde(default, deserialize_with = "crate::validate::token_count")]
    prompt_eval_count: Option<i64>,
}

pub(crate) fn parse_embed(body: &[u8]) -> serde_json::Result<EmbedOutput> {
    let response: EmbedResponse = serde_json::from_slice(body)?;
    Ok(EmbedOutput {
        vectors: response.embeddings,
        prompt_tokens: response.prompt_eval_count,
    })
}

#[derive(Serialize, Default)]
struct Options {
    #[serde(skip_serializing_if = "Option::is_none")]
    num_predict: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
}

#[derive(Serialize)]
struct ChatBody<'a> {
    model: &'a str,
    messages: &'a [ChatMessage],
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    format: Option<&'a serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    options: Option<Options>,
}

pub(crate) fn chat_body(request: &ChatRequest<'_>) -> serde_json::Result<Vec<u8>> {
    let options = Options {
        num_predict: request.max_tokens,
        temperature: request.temperature,
    };
    let options =
        (options.num_predict.is_some() || options.temperature.is_some()).then_some(options);
    serde_json::to_vec(&ChatBody {
        model: request.model,
        messages: request.messages,
        stream: false,
        format: request.json_schema,
        options,
    })
}

#[derive(Deserialize)]
struct ChatResponseMessage {
    content: String,
}

#[derive(Deserialize)]
struct ChatResponse {
    message: ChatResponseMessage,
    #[serde(default)]
    done_reason: Option<String>,
    #[serde(default, deserialize_with = "crate::validate::token_count")]
    prompt_eval_count: Option<i64>,
    #[serde(default, deserialize_with = "crate::validate::token_count")]
    eval_count: Option<i64>,
}

pub(crate) fn parse_chat(body: &[u8]) -> serde_json::Result<ChatOutput> {
    let response: ChatResponse = serde_json::from_slice(body)?;
    Ok(ChatOutput {
        content: crate::validate::storable_text(response.message.content),
        prompt_tokens: response.prompt_eval_count,
        completion_tokens: response.eval_count,
        truncated: response.done_reason.as_deref() == Some("length"),
    })
}

#[derive(Deserialize)]
struct TagDetails {
    #[serde(default)]
    family: Option<String>,
}

#[derive(Deserialize)]
struct Tag {
    name: String,
    #[serde(default)]
    size: Option<i64>,
    #[serde(default)]
    modified_at: Option<String>,
    #[serde(default)]
    details: Option<TagDetails>,
}

#[derive(Deserialize)]
struct TagsResponse {
    models: Vec<Tag>,
}

pub(crate) fn parse_tags(body: &[u8]) -> serde_json::Result<Vec<ModelInfo>> {
    let response: TagsResponse = serde_json::from_slice(body)?;
    Ok(response
        .models
        .into_iter()
        .map(|tag| ModelInfo {
            name: crate::validate::storable_text(tag.name),
            size_bytes: tag.size,
            modified_at: tag.modified_at.map(crate::validate::storable_text),
            family: tag
                .details
                .and_then(|details| details.family)
                .map(crate::validate::storable_text),
        })
        .collect())
}
