//! Provider protocols for the `rag` extension: embeddings, chat completions and model listings from an
//! Ollama server or any OpenAI-compatible one, with the failure taxonomy and retry schedule the background
//! worker needs.
//!
//! Design points, all driven by running inside a PostgreSQL backend:
//! - Every call takes an `interrupt` hook. The HTTP exchange runs on its own thread while the calling thread
//!   polls the hook about every 50 ms, so a query cancel, `statement_timeout` or SIGTERM stops waiting promptly
//!   ([`ProviderError::Interrupted`]). The hook may unwind; nothing is locked while it runs.
//! - Failures are sorted into [`ProviderError::Transient`] (retry later, possibly after the provider's
//!   `Retry-After`) and [`ProviderError::Permanent`] (fix the input or configuration), each with the route,
//!   model, status and an excerpt of the provider's own explanation. The API key never appears in any message
//!   or `Debug` output.
//! - Embedding batches are validated before anyone stores them: one vector per input, equal non-zero
//!   dimensions, finite values, non-zero norm (cosine distance is undefined for a zero vector).
//! - [`RetryPolicy`] is pure arithmetic (exponential backoff, full jitter, deadline) over an injectable
//!   [`RngLike`], so the worker's schedule is unit-testable.

#![warn(missing_docs)]

mod error;
mod hosts;
mod http;
pub mod known_models;
mod ollama;
mod openai;
mod pace;
mod retry;
mod time;
mod validate;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

pub use error::{classify_status, ProviderError, StatusClass};
pub use hosts::{Admission, HostAllowlist};
pub use http::{abandoned_requests, MAX_ABANDONED_REQUESTS};
pub use pace::Pace;
/// The URL type provider URLs are parsed into (reqwest's, which is the `url` crate's).
pub use reqwest::Url;
pub use retry::{RetryPolicy, RngLike, SplitMix64};

use http::{CallContext, Method, Outgoing};

/// Longest accepted [`ProviderConfig::timeout`]: one day.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Which wire protocol a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// Ollama's native API (`/api/embed`, `/api/chat`, `/api/tags`).
    Ollama,
    /// The OpenAI API or a compatible server (`/embeddings`, `/chat/completions`, `/models`).
    OpenAi,
}

impl ProviderKind {
    /// The canonical lower-case name, as accepted by [`FromStr`].
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Ollama => "ollama",
            ProviderKind::OpenAi => "openai",
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Returned by [`ProviderKind::from_str`] for a name that is neither `ollama` nor `openai`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownProviderKind(pub String);

impl fmt::Display for UnknownProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown provider kind {:?}: expected \"ollama\" or \"openai\"",
            http::excerpt(&self.0, 100)
        )
    }
}

impl std::error::Error for UnknownProviderKind {}

impl FromStr for ProviderKind {
    type Err = UnknownProviderKind;

    /// Accepts `ollama` or `openai`, ignoring ASCII case and surrounding whitespace.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        if trimmed.eq_ignore_ascii_case("ollama") {
            Ok(ProviderKind::Ollama)
        } else if trimmed.eq_ignore_ascii_case("openai") {
            Ok(ProviderKind::OpenAi)
        } else {
            Err(UnknownProviderKind(text.to_string()))
        }
    }
}

/// Where and how to reach a provider.
#[derive(Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// The wire protocol.
    pub kind: ProviderKind,
    /// Ollama: the server root, e.g. `http://localhost:11434`. OpenAI: the API root including the version,
    /// e.g. `https://api.openai.com/v1`. A trailing slash is tolerated.
    pub base_url: String,
    /// Sent as `Authorization: Bearer` to OpenAI-kind providers only; never printed.
    pub api_key: Option<String>,
    /// Deadline for a whole request: connecting, sending and reading the full response.
    pub timeout: Duration,
    /// Where the provider may connect (`rag.provider_hosts`); an empty list allows every host.
    pub allowed_hosts: HostAllowlist,
}

impl fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("timeout", &self.timeout)
            .field("allowed_hosts", &self.allowed_hosts)
            .finish()
    }
}

/// The vectors of one embedding batch, in input order and already validated.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedOutput {
    /// One vector per input, all of the same dimension.
    pub vectors: Vec<Vec<f32>>,
    /// Input tokens the provider reports having processed, when it reports it.
    pub prompt_tokens: Option<i64>,
}

/// One message of a chat conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// Builds a message from any string-like role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A chat completion request.
#[derive(Debug, Clone, Copy)]
pub struct ChatRequest<'a> {
    /// The model name as the provider knows it.
    pub model: &'a str,
    /// The conversation so far.
    pub messages: &'a [ChatMessage],
    /// When given, the reply must be JSON matching this schema (Ollama `format`; OpenAI `response_format`
    /// with `strict: true`, which requires `additionalProperties: false` and every property listed in `required`).
    pub json_schema: Option<&'a serde_json::Value>,
    /// Upper bound on generated tokens (Ollama `options.num_predict`, OpenAI `max_tokens`).
    pub max_tokens: Option<u32>,
    /// Sampling temperature; the provider's default when None.
    pub temperature: Option<f32>,
}

/// The most bytes of reply content a chat call accepts for each token of its `max_tokens`: generous (a token is
/// a few characters, four bytes at most each, more when the model writes JSON escapes), so that only a server
/// that ignores `max_tokens` goes past it.
pub const CHAT_REPLY_BYTES_PER_TOKEN: usize = 32;
/// Reply content a chat call accepts beyond `max_tokens` × [`CHAT_REPLY_BYTES_PER_TOKEN`].
pub const CHAT_REPLY_SLACK_BYTES: usize = 64 * 1024;

/// The longest reply content a chat call with this `max_tokens` accepts.
pub fn chat_reply_limit(max_tokens: u32) -> usize {
    (max_tokens as usize)
        .saturating_mul(CHAT_REPLY_BYTES_PER_TOKEN)
        .saturating_add(CHAT_REPLY_SLACK_BYTES)
}

/// Refuses reply content longer than the call's `max_tokens` allows. A server that ignores the limit (or one
/// that answers with 56 MB of citation markers on purpose) would otherwise have every later step (the reply's
/// JSON, the citation check, the ledger row) work on a body of up to the HTTP cap: the citation check of one
/// such reply allocated 1.8 GB and aborted the server where allocations can fail (red team 20).
fn within_max_tokens(output: ChatOutput, max_tokens: Option<u32>) -> Result<ChatOutput, String> {
    match max_tokens {
        Some(max_tokens) if output.content.len() > chat_reply_limit(max_tokens) => Err(format!(
            "the reply's content is {} bytes, more than max_tokens {max_tokens} allows ({} bytes): the server \
             does not honour max_tokens",
            output.content.len(),
            chat_reply_limit(max_tokens)
        )),
        _ => Ok(output),
    }
}

/// A chat completion result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatOutput {
    /// The assistant's reply text.
    pub content: String,
    /// Prompt tokens reported by the provider.
    pub prompt_tokens: Option<i64>,
    /// Generated tokens reported by the provider.
    pub completion_tokens: Option<i64>,
    /// True when generation stopped at the token limit (`done_reason`/`finish_reason` is `length`), so the
    /// content is probably cut off, and JSON in it probably invalid.
    pub truncated: bool,
}

/// A model the provider offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// The name to pass as `model` (Ollama `name`, OpenAI `id`).
    pub name: String,
    /// Size on disk (Ollama only).
    pub size_bytes: Option<i64>,
    /// Ollama's `modified_at` as sent; for OpenAI the `created` time as RFC 3339 UTC.
    pub modified_at: Option<String>,
    /// Model family (Ollama `details.family` only).
    pub family: Option<String>,
}

/// A configured provider. Holds one HTTP client, built once, so connections are reused across calls.
#[derive(Clone)]
pub struct Provider {
    config: ProviderConfig,
    /// `base_url` without trailing slashes; routes are appended to it.
    base: String,
    client: reqwest::blocking::Client,
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Provider")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Provider {
    /// Validates the configuration and builds the HTTP client. Fails (permanently) on a base URL that is not
    /// absolute `http`/`https`, on a timeout that is zero or above [`MAX_TIMEOUT`], or if the TLS stack
    /// cannot be initialised.
    pub fn new(config: ProviderConfig) -> Result<Provider, ProviderError> {
        let base = config.base_url.trim().trim_end_matches('/').to_string();
        // The URL itself is left out of these messages: it may carry credentials in its user-info part.
        let admission = match reqwest::Url::parse(&base) {
            // A query or fragment would swallow the route appended to the base (`/secret?x=` + `/models`
            // fetches `/secret`), and user-info would be sent as credentials to a server of the URL's
            // choosing: a base URL names a server and a path prefix, nothing else.
            Ok(url)
                if url.query().is_some()
                    || url.fragment().is_some()
                    || !url.username().is_empty()
                    || url.password().is_some() =>
            {
                return Err(ProviderError::permanent(format!(
                    "{} provider: base_url must not carry a query (?), a fragment (#) or user-info (user@)",
                    config.kind
                )))
            }
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {
                config.allowed_hosts.admit(&url).map_err(|why| {
                    ProviderError::permanent(format!(
                        "{} provider: {why}",
                        config.kind
                    ))
                })?
            }
            Ok(url) => {
                return Err(ProviderError::permanent(format!(
                    "{} provider: base_url must be an absolute http or https URL, got scheme {:?}",
                    config.kind,
                    url.scheme()
                )))
            }
            Err(error) => {
                return Err(ProviderError::permanent(format!(
                    "{} provider: invalid base_url: {error}",
                    config.kind
                )))
            }
        };
        // The HTTP stack adds the timeout to `Instant::now()`, which panics on overflow for absurd values.
        if config.timeout.is_zero() || config.timeout > MAX_TIMEOUT {
            return Err(ProviderError::permanent(format!(
                "{} provider: timeout must be positive and at most {} hours, got {:?}",
                config.kind,
                MAX_TIMEOUT.as_secs() / 3600,
                config.timeout
            )));
        }
        let mut builder = reqwest::blocking::Client::builder();
        if !config.allowed_hosts.is_empty() {
            // The list is checked against the addresses connected to; through a proxy those would be the
            // proxy's, so with a list rag connects directly.
            builder = builder.no_proxy();
        }
        if let Admission::ToAddresses(blocks) = admission {
            builder = builder.dns_resolver(std::sync::Arc::new(hosts::AddressCheckingResolver {
                blocks: std::sync::Arc::new(blocks),
            }));
        }
        let client = builder
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .user_agent(concat!("rag-embed/", env!("CARGO_PKG_VERSION")))
            // A redirect would take the request (a POST's body included) to a server the provider's URL does
            // not name, past the superuser's choice of where a key may go and of the path rag appends.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| {
                ProviderError::permanent(format!(
                    "{} provider: cannot build the HTTP client: {}",
                    config.kind,
                    error.without_url()
                ))
            })?;
        Ok(Provider {
            config,
            base,
            client,
        })
    }

    /// The configuration this provider was built from.
    pub fn config(&self) -> &ProviderConfig {
        &self.config
    }

    /// Embeds a batch in one HTTP call and validates the result: exactly one vector per input, in input
    /// order, all of one non-zero dimension (equal to `dimensions` when given), finite, with non-zero norm.
    ///
    /// Ollama: `POST {base}/api/embed` with `input: [...]` and `truncate: false`, so an over-long input is an
    /// error rather than a silently shortened embedding. OpenAI: `POST {base}/embeddings` with `input: [...]`
    /// and `encoding_format: "float"`. Both send `dimensions` when given (recent Ollama versions honour it; older
    /// versions ignore it and the dimension check then reports the mismatch). An empty batch makes no call.
    pub fn embed(
        &self,
        model: &str,
        inputs: &[String],
        dimensions: Option<u32>,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<EmbedOutput, ProviderError> {
        if inputs.is_empty() {
            return Ok(EmbedOutput {
                vectors: Vec::new(),
                prompt_tokens: None,
            });
        }
        let kind = self.config.kind;
        let (route, body) = match kind {
            ProviderKind::Ollama => (
                ollama::EMBED_ROUTE,
                ollama::embed_body(model, inputs, dimensions),
            ),
            ProviderKind::OpenAi => (
                openai::EMBED_ROUTE,
                openai::embed_body(model, inputs, dimensions),
            ),
        };
        let context = CallContext {
            kind,
            method: Method::Post,
            route,
            model: Some(model),
        };
        let result = self.post(&context, body, interrupt).and_then(|reply| {
            let output = match kind {
                ProviderKind::Ollama => {
                    ollama::parse_embed(&reply.body).map_err(|error| error.to_string())
                }
                ProviderKind::OpenAi => openai::parse_embed(&reply.body),
            }
            .map_err(|problem| context.bad_response(reply.status, &problem, &reply.body))?;
            validate::check_vectors(&output.vectors, inputs.len(), dimensions)
                .map_err(|problem| context.bad_response(reply.status, &problem, &[]))?;
            Ok(output)
        });
        self.scrub(result)
    }

    /// One chat completion, non-streaming.
    ///
    /// Ollama: `POST {base}/api/chat` with `stream: false`, `format` = the schema, `options.num_predict` and
    /// `options.temperature`. OpenAI: `POST {base}/chat/completions` with `max_tokens`, `temperature` and
    /// `response_format: {type: "json_schema", json_schema: {name, schema, strict: true}}`.
    /// A refusal or a reply without content is a permanent error.
    pub fn chat(
        &self,
        request: &ChatRequest<'_>,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<ChatOutput, ProviderError> {
        let kind = self.config.kind;
        let (route, body) = match kind {
            ProviderKind::Ollama => (ollama::CHAT_ROUTE, ollama::chat_body(request)),
            ProviderKind::OpenAi => (openai::CHAT_ROUTE, openai::chat_body(request)),
        };
        let context = CallContext {
            kind,
            method: Method::Post,
            route,
            model: Some(request.model),
        };
        let result = self.post(&context, body, interrupt).and_then(|reply| {
            match kind {
                ProviderKind::Ollama => {
                    ollama::parse_chat(&reply.body).map_err(|error| error.to_string())
                }
                ProviderKind::OpenAi => openai::parse_chat(&reply.body),
            }
            .and_then(|output| within_max_tokens(output, request.max_tokens))
            .map_err(|problem| context.bad_response(reply.status, &problem, &reply.body))
        });
        self.scrub(result)
    }

    /// The relevance of each document to `query`, in document order, from a cross-encoder served at
    /// `POST {base}/rerank` (OpenAI-compatible servers that have it: llama.cpp's server, vLLM, Jina, Cohere).
    /// The scores are the server's own scale (a logit, or a probability). Ollama has no rerank API: a permanent
    /// error. No documents make no call.
    pub fn rerank(
        &self,
        model: &str,
        query: &str,
        documents: &[String],
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<f32>, ProviderError> {
        if documents.is_empty() {
            return Ok(Vec::new());
        }
        let kind = self.config.kind;
        if kind == ProviderKind::Ollama {
            return Err(ProviderError::permanent(
                "ollama provider: Ollama has no rerank API; use an OpenAI-compatible server with /rerank (llama.cpp, vLLM) or the local reranker",
            ));
        }
        let context = CallContext {
            kind,
            method: Method::Post,
            route: openai::RERANK_ROUTE,
            model: Some(model),
        };
        let body = openai::rerank_body(model, query, documents);
        let result = self.post(&context, body, interrupt).and_then(|reply| {
            openai::parse_rerank(&reply.body, documents.len())
                .map_err(|problem| context.bad_response(reply.status, &problem, &reply.body))
        });
        self.scrub(result)
    }

    /// The models the provider offers: Ollama `GET {base}/api/tags`, OpenAI `GET {base}/models`.
    pub fn list_models(
        &self,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<ModelInfo>, ProviderError> {
        let kind = self.config.kind;
        let route = match kind {
            ProviderKind::Ollama => ollama::TAGS_ROUTE,
            ProviderKind::OpenAi => openai::MODELS_ROUTE,
        };
        let context = CallContext {
            kind,
            method: Method::Get,
            route,
            model: None,
        };
        let result = self.send(&context, None, interrupt).and_then(|reply| {
            match kind {
                ProviderKind::Ollama => ollama::parse_tags(&reply.body),
                ProviderKind::OpenAi => openai::parse_models(&reply.body),
            }
            .map_err(|error| context.bad_response(reply.status, &error.to_string(), &reply.body))
        });
        self.scrub(result)
    }

    fn post(
        &self,
        context: &CallContext<'_>,
        body: serde_json::Result<Vec<u8>>,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<http::Reply, ProviderError> {
        let body = body.map_err(|error| {
            ProviderError::permanent(format!(
                "{context}: cannot encode the request as JSON: {error}"
            ))
        })?;
        self.send(context, Some(body), interrupt)
    }

    fn send(
        &self,
        context: &CallContext<'_>,
        json_body: Option<Vec<u8>>,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<http::Reply, ProviderError> {
        let bearer = match self.config.kind {
            ProviderKind::OpenAi => self.config.api_key.clone().filter(|key| !key.is_empty()),
            ProviderKind::Ollama => None,
        };
        let outgoing = Outgoing {
            method: context.method,
            url: format!("{}{}", self.base, context.route),
            bearer,
            json_body,
        };
        http::exchange(
            &self.client,
            outgoing,
            self.config.timeout,
            context,
            interrupt,
        )
    }

    /// Removes the API key from an error message, in case a provider (or proxy) echoed it back.
    fn scrub<T>(&self, result: Result<T, ProviderError>) -> Result<T, ProviderError> {
        let Some(key) = self.config.api_key.as_deref().filter(|key| !key.is_empty()) else {
            return result;
        };
        result.map_err(|error| match error {
            ProviderError::Transient {
                status,
                retry_after,
                message,
            } => ProviderError::Transient {
                status,
                retry_after,
                message: message.replace(key, "[redacted]"),
            },
            ProviderError::Permanent { status, message } => ProviderError::Permanent {
                status,
                message: message.replace(key, "[redacted]"),
            },
            ProviderError::InputTooLong { message } => ProviderError::InputTooLong {
                message: message.replace(key, "[redacted]"),
            },
            ProviderError::Interrupted => ProviderError::Interrupted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(kind: ProviderKind, base_url: &str, api_key: Option<&str>) -> ProviderConfig {
        ProviderConfig {
            kind,
            base_url: base_url.to_string(),
            api_key: api_key.map(str::to_string),
            timeout: Duration::from_secs(5),
            allowed_hosts: HostAllowlist::default(),
        }
    }

    #[test]
    fn kind_parses_and_displays() {
        assert_eq!("ollama".parse::<ProviderKind>(), Ok(ProviderKind::Ollama));
        assert_eq!(" OpenAI ".parse::<ProviderKind>(), Ok(ProviderKind::OpenAi));
        let error = "anthropic".parse::<ProviderKind>().unwrap_err();
        assert!(error.to_string().contains("\"anthropic\""), "{error}");
        assert_eq!(ProviderKind::Ollama.to_string(), "ollama");
        assert_eq!(
            ProviderKind::OpenAi.to_string().parse::<ProviderKind>(),
            Ok(ProviderKind::OpenAi)
        );
    }

    #[test]
    fn new_rejects_bad_configuration() {
        for bad in [
            "",
            "localhost:11434",
            "ftp://host/v1",
            "http://",
            "not a url",
        ] {
            let error = Provider::new(config(ProviderKind::Ollama, bad, None)).unwrap_err();
            assert!(
                matches!(error, ProviderError::Permanent { status: None, .. }),
                "{bad:?}: {error:?}"
            );
        }
        let mut zero = config(ProviderKind::Ollama, "http://127.0.0.1:1", None);
        zero.timeout = Duration::ZERO;
        let mut endless = zero.clone();
        endless.timeout = Duration::MAX;
        assert!(Provider::new(endless)
            .unwrap_err()
            .to_string()
            .contains("timeout"));
        let mut longest = zero.clone();
        longest.timeout = MAX_TIMEOUT;
        assert!(Provider::new(longest).is_ok());
        assert!(Provider::new(zero)
            .unwrap_err()
            .to_string()
            .contains("timeout"));
    }

    #[test]
    fn base_url_trailing_slashes_are_trimmed() {
        let provider = Provider::new(config(
            ProviderKind::OpenAi,
            " http://127.0.0.1:9/v1// ",
            None,
        ))
        .unwrap();
        assert_eq!(provider.base, "http://127.0.0.1:9/v1");
    }

    #[test]
    fn debug_output_redacts_the_key() {
        let secret = "sk-test-SECRET-4242";
        let cfg = config(ProviderKind::OpenAi, "http://127.0.0.1:9/v1", Some(secret));
        let shown = format!("{cfg:?} {cfg:#?}");
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("[redacted]"));
        let provider = Provider::new(cfg).unwrap();
        let shown = format!("{provider:?} {provider:#?}");
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("http://127.0.0.1:9/v1"));
    }

    #[test]
    fn scrub_removes_echoed_key() {
        let provider = Provider::new(config(
            ProviderKind::OpenAi,
            "http://127.0.0.1:9/v1",
            Some("sk-abc"),
        ))
        .unwrap();
        let result: Result<(), _> = provider.scrub(Err(ProviderError::Permanent {
            status: Some(401),
            message: "bad key sk-abc".into(),
        }));
        assert_eq!(result.unwrap_err().message(), "bad key [redacted]");
    }

    #[test]
    fn request_bodies() {
        let inputs = vec!["a".to_string(), "b".to_string()];
        let ollama: serde_json::Value =
            serde_json::from_slice(&ollama::embed_body("m", &inputs, None).unwrap()).unwrap();
        assert_eq!(
            ollama,
            serde_json::json!({"model": "m", "input": ["a", "b"], "truncate": false})
        );
        let openai: serde_json::Value =
            serde_json::from_slice(&openai::embed_body("m", &inputs, Some(64)).unwrap()).unwrap();
        assert_eq!(
            openai,
            serde_json::json!({"model": "m", "input": ["a", "b"], "encoding_format": "float", "dimensions": 64})
        );
        let messages = [ChatMessage::new("user", "hi")];
        let plain = ChatRequest {
            model: "c",
            messages: &messages,
            json_schema: None,
            max_tokens: None,
            temperature: None,
        };
        let body: serde_json::Value =
            serde_json::from_slice(&ollama::chat_body(&plain).unwrap()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"model": "c", "messages": [{"role": "user", "content": "hi"}], "stream": false})
        );
        let body: serde_json::Value =
            serde_json::from_slice(&openai::chat_body(&plain).unwrap()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"model": "c", "messages": [{"role": "user", "content": "hi"}]})
        );
    }
}
