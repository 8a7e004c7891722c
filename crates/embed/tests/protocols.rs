//! End-to-end protocol tests against scripted local HTTP responders: request bodies as sent, response
//! parsing, every error class, the interrupt hook and key redaction.

mod support;

use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use rag_embed::{
    ChatMessage, ChatRequest, HostAllowlist, Provider, ProviderConfig, ProviderError, ProviderKind,
};
use serde_json::json;
use support::{closed_port_url, Behaviour, TestServer};

const SECRET: &str = "sk-test-0123456789-SECRET";

fn provider(kind: ProviderKind, base_url: String, timeout: Duration) -> Provider {
    Provider::new(ProviderConfig {
        kind,
        base_url,
        api_key: Some(SECRET.to_string()),
        timeout,
        allowed_hosts: HostAllowlist::default(),
    })
    .expect("valid configuration")
}

fn ollama(server: &TestServer) -> Provider {
    provider(ProviderKind::Ollama, server.url(), Duration::from_secs(10))
}

fn openai(server: &TestServer) -> Provider {
    provider(
        ProviderKind::OpenAi,
        format!("{}/v1/", server.url()),
        Duration::from_secs(10),
    )
}

fn never() -> impl FnMut() -> bool {
    || false
}

fn inputs(texts: &[&str]) -> Vec<String> {
    texts.iter().map(|t| t.to_string()).collect()
}

fn expect_permanent(result: Result<impl std::fmt::Debug, ProviderError>) -> (Option<u16>, String) {
    match result {
        Err(ProviderError::Permanent { status, message }) => {
            assert!(!message.contains(SECRET), "key leaked: {message}");
            (status, message)
        }
        other => panic!("expected a permanent error, got {other:?}"),
    }
}

fn expect_transient(
    result: Result<impl std::fmt::Debug, ProviderError>,
) -> (Option<u16>, Option<Duration>, String) {
    match result {
        Err(ProviderError::Transient {
            status,
            retry_after,
            message,
        }) => {
            assert!(!message.contains(SECRET), "key leaked: {message}");
            (status, retry_after, message)
        }
        other => panic!("expected a transient error, got {other:?}"),
    }
}

// ---------------------------------------------------------------- Ollama

#[test]
fn ollama_embed_sends_batch_without_truncation_and_parses_vectors() {
    let server = TestServer::start(vec![Behaviour::json(
        200,
        json!({"model": "nomic", "embeddings": [[0.1, 0.2, 0.3], [0.0, -1.0, 2]], "prompt_eval_count": 7}),
    )]);
    let output = ollama(&server)
        .embed("nomic", &inputs(&["alpha", "beta"]), None, &mut never())
        .unwrap();
    assert_eq!(
        output.vectors,
        vec![vec![0.1, 0.2, 0.3], vec![0.0, -1.0, 2.0]]
    );
    assert_eq!(output.prompt_tokens, Some(7));

    let request = server.only_request();
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/api/embed")
    );
    assert_eq!(
        request.json(),
        json!({"model": "nomic", "input": ["alpha", "beta"], "truncate": false})
    );
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(
        request.header("authorization"),
        None,
        "Ollama must not receive the key"
    );
}

#[test]
fn ollama_embed_sends_dimensions_and_checks_them() {
    let server = TestServer::start(vec![Behaviour::json(
        200,
        json!({"embeddings": [[1.0, 2.0, 3.0]]}),
    )]);
    let (status, message) =
        expect_permanent(ollama(&server).embed("m", &inputs(&["x"]), Some(2), &mut never()));
    assert_eq!(status, Some(200));
    assert!(
        message.contains("3 dimensions but 2 were requested"),
        "{message}"
    );
    assert_eq!(server.only_request().json()["dimensions"], json!(2));
}

#[test]
fn ollama_chat_sends_schema_and_options() {
    let server = TestServer::start(vec![Behaviour::json(
        200,
        json!({
            "model": "llama", "message": {"role": "assistant", "content": "{\"answer\":\"42\"}"},
            "done": true, "done_reason": "stop", "prompt_eval_count": 31, "eval_count": 9
        }),
    )]);
    let schema = json!({"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]});
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Answer?"),
    ];
    let request = ChatRequest {
        model: "llama",
        messages: &messages,
        json_schema: Some(&schema),
        max_tokens: Some(256),
        temperature: Some(0.25),
    };
    let output = ollama(&server).chat(&request, &mut never()).unwrap();
    assert_eq!(output.content, "{\"answer\":\"42\"}");
    assert_eq!(
        (
            output.prompt_tokens,
            output.completion_tokens,
            output.truncated
        ),
        (Some(31), Some(9), false)
    );

    let sent = server.only_request();
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("POST", "/api/chat")
    );
    assert_eq!(
        sent.json(),
        json!({
            "model": "llama",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Answer?"}],
            "stream": false,
            "format": schema,
            "options": {"num_predict": 256, "temperature": 0.25}
        })
    );
}

#[test]
fn ollama_chat_reports_length_truncation() {
    let server = TestServer::start(vec![Behaviour::json(
        200,
        json!({"message": {"role": "assistant", "content": "{\"ans"}, "done_reason": "length", "eval_count": 4}),
    )]);
    let messages = [ChatMessage::new("user", "q")];
    let request = ChatRequest {
        model: "m",
        messages: &messages,
        json_schema: None,
        max_tokens: Some(4),
        temperature: None,
    };
    let output = ollama(&server).chat(&request, &mut never()).unwrap();
    assert!(output.truncated);
    assert_eq!(output.prompt_tokens, None);
    assert_eq!(
        server.only_request().json()["options"],
        json!({"num_predict": 4})
    );
}

#[test]
fn ollama_lists_models() {
    let server = TestServer::start(vec![Behaviour::json(
        200,
        json!({"models": [
            {"name": "nomic-embed-text:latest", "model": "nomic-embed-text:latest", "size": 274302450,
             "modified_at": "2024-05-01T10:00:00.1+02:00", "digest": "abc",
             "details": {"family": "nomic-bert", "parameter_size": "137M"}},
            {"name": "bare"},
            {"name": "nul\u{0}hidden", "details": {"family": "a\u{0}b"}}
        ]}),
    )]);
    let models = ollama(&server).list_models(&mut never()).unwrap();
    assert_eq!(models.len(), 3);
    // A NUL would end the name a client reads (red team 20).
    assert_eq!(
        (models[2].name.as_str(), models[2].family.as_deref()),
        ("nul\u{FFFD}hidden", Some("a\u{FFFD}b"))
    );
    assert_eq!(models[0].name, "nomic-embed-text:latest");
    assert_eq!(models[0].size_bytes, Some(274302450));
    assert_eq!(
        models[0].modified_at.as_deref(),
        Some("2024-05-01T10:00:00.1+02:00")
    );
    assert_eq!(models[0].family.as_deref(), Some("nomic-bert"));
    assert_eq!(
        (models[1].size_bytes, models[1].family.as_deref()),
        (None, None)
    );
    let request = server.only_request();
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("GET", "/api/tags")
    );
}

#[test]
fn ollama_missing_model_is_permanent_with_route_model_and_reason() {
    let server = TestServer::start(vec![Behaviour::json(
        404,
        json!({"error": "model \"ghost\" not found, try pulling it first"}),
    )]);
    let (status, message) =
        expect_permanent(ollama(&server).embed("ghost", &inputs(&["x"]), None, &mut never()));
    assert_eq!(status, Some(404));
    for needle in [
        "ollama POST /api/embed",
        "\"ghost\"",
        "HTTP 404",
        "not found, try pulling it first",
    ] {
        assert!(
            message.contains(needle),
            "{needle:?} missing from {message}"
        );
    }
}

fn expect_too_long(result: Result<impl std::fmt::Debug, ProviderError>) -> String {
    match result {
        Err(ProviderError::InputTooLong { message }) => message,
        other => panic!("expected an input-too-long error, got {other:?}"),
    }
}

#[test]
fn ollama_context_overflow_is_an_input_too_long() {
    let server = TestServer::start(vec![Behaviour::json(
        400,
        json!({"error": "the input length exceeds the context length"}),
    )]);
    let message =
        expect_too_long(ollama(&server).embed("m", &inputs(&["long"]), None, &mut never()));
    assert!(message.contains("HTTP 400"), "{message}");
    assert!(message.contains("exceeds the context length"), "{message}");
    assert_eq!(server.requests().len(), 1);
}

/// llama.cpp's server answers a 500 for an input over its batch: not retried (a 500 otherwise is, until the
/// deadline), and not read as a wrong model or key.
#[test]
fn llama_cpp_input_over_its_batch_is_an_input_too_long_not_a_server_error() {
    let server = TestServer::start(vec![Behaviour::json(
        500,
        json!({"error": {"code": 500, "message": "input is too large to process. increase the physical batch size", "type": "server_error"}}),
    )]);
    let message =
        expect_too_long(openai(&server).embed("m", &inputs(&["long"]), None, &mut never()));
    assert!(message.contains("HTTP 500"), "{message}");
    assert!(message.contains("too large to process"), "{message}");
}

/// A rate limit's text may speak of tokens too: a 429 stays a reason to wait, never a text to shorten.
#[test]
fn a_rate_limit_about_too_many_tokens_is_still_transient() {
    let server = TestServer::start(vec![Behaviour::json(
        429,
        json!({"error": {"message": "Rate limit reached: too many tokens per minute", "type": "tokens"}}),
    )]);
    let (status, _, message) =
        expect_transient(openai(&server).embed("m", &inputs(&["x"]), None, &mut never()));
    assert_eq!(status, Some(429));
    assert!(message.contains("too many tokens"), "{message}");
}

// ---------------------------------------------------------------- OpenAI

#[test]
fn openai_embed_sends_key_and_dimensions_and_sorts_by_index() {
    let server = TestServer::start(vec![Behaviour::json(
        200,
        json!({
            "object": "list",
            "data": [
                {"object": "embedding", "index": 1, "embedding": [0.0, 1.0]},
                {"object": "embedding", "index": 0, "embedding": [1.0, 0.0]}
            ],
            "model": "text-embedding-3-small",
            "usage": {"prompt_tokens": 5, "total_tokens": 5}
        }),
    )]);
    let output = openai(&server)
        .embed(
            "text-embedding-3-small",
            &inputs(&["first", "second"]),
            Some(2),
            &mut never(),
        )
        .unwrap();
    assert_eq!(output.vectors, vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
    assert_eq!(output.prompt_tokens, Some(5));

    let request = server.only_request();
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/v1/embeddings")
    );
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {SECRET}").as_str())
    );
    assert_eq!(
        request.json(),
        json!({"model": "text-embedding-3-small", "input": ["first", "second"], "encoding_format": "float", "dimensions": 2})
    );
}

#[test]
fn openai_embed_without_dimensions_omits_the_field() {
    let server = TestServer::start(vec![Behaviour::json(
        200,
        json!({"data": [{"index": 0, "embedding": [0.5]}]}),
    )]);
    let output = openai(&server)
        .embed("m", &inputs(&["x"]), None, &mut never())
        .unwrap();
    assert_eq!(output.prompt_tokens, None);
    assert_eq!(server.only_request().json().get("dimensions"), None);
}

#[test]
fn openai_embed_rejects_duplicate_indices() {
    let server = TestServer::start(vec![Behaviour::json(
        200,
        json!({"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [2.0]}]}),
    )]);
    let (_, message) =
        expect_permanent(openai(&server).embed("m", &inputs(&["a", "b"]), None, &mut never()));
    assert!(message.contains("indices"), "{message}");
}

#[test]
fn openai_rerank_sends_every_document_and_reorders_scores_by_index() {
    let server = TestServer::start(vec![Behaviour::json(
        200,
        json!({"results": [{"index": 1, "relevance_score": 4.5}, {"index": 0, "relevance_score": -2.0}]}),
    )]);
    let scores = openai(&server)
        .rerank(
            "bge-reranker",
            "question",
            &inputs(&["first", "second"]),
            &mut never(),
        )
        .unwrap();
    assert_eq!(scores, vec![-2.0, 4.5]);
    let request = server.only_request();
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/v1/rerank")
    );
    assert_eq!(
        request.json(),
        json!({"model": "bge-reranker", "query": "question", "documents": ["first", "second"], "top_n": 2,
               "return_documents": false})
    );
}

#[test]
fn openai_rerank_refuses_results_it_cannot_pair_with_documents() {
    for results in [
        json!([{"index": 0, "relevance_score": 1.0}]),
        json!([{"index": 0, "relevance_score": 1.0}, {"index": 0, "relevance_score": 2.0}]),
        json!([{"index": 0, "relevance_score": 1.0}, {"index": 5, "relevance_score": 2.0}]),
        // Finite as a double, infinite as the f32 it is kept as: it would pass any relevance threshold.
        json!([{"index": 0, "relevance_score": 1e39}, {"index": 1, "relevance_score": 2.0}]),
        json!("nope"),
    ] {
        let server = TestServer::start(vec![Behaviour::json(200, json!({"results": results}))]);
        let (status, message) =
            expect_permanent(openai(&server).rerank("m", "q", &inputs(&["a", "b"]), &mut never()));
        assert_eq!(status, Some(200));
        assert!(message.contains("/rerank"), "{message}");
    }
    // The older `score` field is read too.
    let server = TestServer::start(vec![Behaviour::json(
        200,
        json!({"results": [{"index": 0, "score": 0.25}]}),
    )]);
    assert_eq!(
        openai(&server)
            .rerank("m", "q", &inputs(&["a"]), &mut never())
            .unwrap(),
        vec![0.25]
    );
}

#[test]
fn ollama_has_no_rerank_api() {
    // Refused before any request: the address is closed, so a call would fail differently.
    let ollama = provider(
        ProviderKind::Ollama,
        closed_port_url(),
        Duration::from_secs(10),
    );
    let (_, message) = expect_permanent(ollama.rerank("m", "q", &inputs(&["a"]), &mut never()));
    assert!(message.contains("no rerank API"), "{message}");
}

#[test]
fn openai_chat_sends_strict_json_schema_and_max_tokens() {
    let server = TestServer::start(vec![Behaviour::json(
        200,
        json!({
            "id": "chatcmpl-1", "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "{\"a\":1}", "refusal": null},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
        }),
    )]);
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false});
    let messages = [ChatMessage::new("user", "give a")];
    let request = ChatRequest {
        model: "gpt-x",
        messages: &messages,
        json_schema: Some(&schema),
        max_tokens: Some(100),
        temperature: Some(0.0),
    };
    let output = openai(&server).chat(&request, &mut never()).unwrap();
    assert_eq!(output.content, "{\"a\":1}");
    assert_eq!(
        (
            output.prompt_tokens,
            output.completion_tokens,
            output.truncated
        ),
        (Some(12), Some(3), false)
    );

    let sent = server.only_request();
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {SECRET}").as_str())
    );
    assert_eq!(
        sent.json(),
        json!({
            "model": "gpt-x",
            "messages": [{"role": "user", "content": "give a"}],
            "max_tokens": 100,
            "temperature": 0.0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "response", "schema": schema, "strict": true}}
        })
    );
}

#[test]
fn openai_chat_length_refusal_and_empty_choices() {
    let messages = [ChatMessage::new("user", "q")];
    let request = ChatRequest {
        model: "m",
        messages: &messages,
        json_schema: None,
        max_tokens: None,
        temperature: None,
    };

    let server = TestServer::start(vec![
        Behaviour::json(
            200,
            json!({"choices": [{"message": {"content": "partial"}, "finish_reason": "length"}]}),
        ),
        Behaviour::json(
            200,
            json!({"choices": [{"message": {"content": null, "refusal": "I can't help with that."}, "finish_reason": "stop"}]}),
        ),
        Behaviour::json(200, json!({"choices": []})),
    ]);
    let provider = openai(&server);
    let output = provider.chat(&request, &mut never()).unwrap();
    assert_eq!(
        (output.content.as_str(), output.truncated),
        ("partial", true)
    );
    let (_, message) = expect_permanent(provider.chat(&request, &mut never()));
    assert!(
        message.contains("refused: I can't help with that."),
        "{message}"
    );
    let (_, message) = expect_permanent(provider.chat(&request, &mut never()));
    assert!(message.contains("`choices` is empty"), "{message}");
    let sent = server.requests()[0].json();
    assert_eq!(sent.get("response_format"), None);
    assert_eq!(sent.get("max_tokens"), None);
}

#[test]
fn openai_lists_models() {
    let server = TestServer::start(vec![Behaviour::json(
        200,
        json!({"object": "list", "data": [
            {"id": "text-embedding-3-small", "object": "model", "created": 1700000000, "owned_by": "system"},
            {"id": "local-model", "object": "model"}
        ]}),
    )]);
    let models = openai(&server).list_models(&mut never()).unwrap();
    assert_eq!(models.len(), 2);
    assert_eq!(models[0].name, "text-embedding-3-small");
    assert_eq!(
        models[0].modified_at.as_deref(),
        Some("2023-11-14T22:13:20Z")
    );
    assert_eq!(
        (models[0].size_bytes, models[0].family.as_deref()),
        (None, None)
    );
    assert_eq!(models[1].modified_at, None);
    let request = server.only_request();
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("GET", "/v1/models")
    );
}

#[test]
fn unauthorized_is_permanent_with_reason_and_no_key() {
    let server = TestServer::start(vec![Behaviour::json(
        401,
        json!({"error": {"message": format!("Incorrect API key provided: {SECRET}."), "type": "invalid_request_error", "code": "invalid_api_key"}}),
    )]);
    let result = openai(&server).embed("m", &inputs(&["x"]), None, &mut never());
    let shown = format!("{result:?}");
    let (status, message) = expect_permanent(result);
    assert_eq!(status, Some(401));
    assert!(
        message.contains("HTTP 401 Unauthorized: Incorrect API key provided: [redacted]."),
        "{message}"
    );
    assert!(message.contains("openai POST /embeddings"), "{message}");
    assert!(!shown.contains(SECRET), "{shown}");
}

// ---------------------------------------------------------------- transient failures

#[test]
fn rate_limit_with_retry_after_seconds() {
    let server = TestServer::start(vec![Behaviour::raw(
        429,
        &[("Retry-After", "2")],
        r#"{"error":"slow down"}"#,
    )]);
    let (status, retry_after, message) =
        expect_transient(ollama(&server).embed("m", &inputs(&["x"]), None, &mut never()));
    assert_eq!(status, Some(429));
    assert_eq!(retry_after, Some(Duration::from_secs(2)));
    assert!(
        message.contains("HTTP 429 Too Many Requests: slow down"),
        "{message}"
    );
}

#[test]
fn retry_after_as_http_date() {
    let server = TestServer::start(vec![
        Behaviour::raw(503, &[("Retry-After", "Fri, 31 Dec 2100 23:59:59 GMT")], ""),
        Behaviour::raw(429, &[("Retry-After", "Sun, 06 Nov 1994 08:49:37 GMT")], ""),
    ]);
    let provider = ollama(&server);
    let (_, retry_after, _) = expect_transient(provider.list_models(&mut never()));
    let years = retry_after.expect("future date parsed").as_secs_f64() / (365.25 * 86_400.0);
    assert!((70.0..80.0).contains(&years), "{years} years");
    let (_, retry_after, _) = expect_transient(provider.list_models(&mut never()));
    assert_eq!(
        retry_after,
        Some(Duration::ZERO),
        "a past date means retry now"
    );
}

#[test]
fn retry_after_ms_fallback_and_garbled_header() {
    let server = TestServer::start(vec![
        Behaviour::raw(429, &[("retry-after-ms", "1500")], ""),
        Behaviour::raw(429, &[("Retry-After", "whenever")], ""),
    ]);
    let provider = openai(&server);
    let (_, retry_after, _) = expect_transient(provider.list_models(&mut never()));
    assert_eq!(retry_after, Some(Duration::from_millis(1500)));
    let (_, retry_after, _) = expect_transient(provider.list_models(&mut never()));
    assert_eq!(retry_after, None);
}

#[test]
fn server_errors_are_transient_with_excerpt() {
    let html = format!(
        "<html><body>Service Unavailable {}</body></html>",
        "x".repeat(5000)
    );
    let server = TestServer::start(vec![Behaviour::raw(
        503,
        &[("Content-Type", "text/html")],
        &html,
    )]);
    let (status, retry_after, message) =
        expect_transient(openai(&server).embed("m", &inputs(&["x"]), None, &mut never()));
    assert_eq!((status, retry_after), (Some(503), None));
    // The page itself is not quoted: the server is whatever a provider's URL names.
    assert!(
        message.contains(&format!(
            "HTTP 503 Service Unavailable: a {}-byte body without a JSON error message (not quoted)",
            html.len()
        )),
        "{message}"
    );
    assert!(!message.contains("<html>"), "{message}");
    assert!(
        message.chars().count() < 420,
        "excerpt must be bounded: {} chars",
        message.chars().count()
    );
}

#[test]
fn connection_refused_is_transient() {
    let provider = provider(
        ProviderKind::Ollama,
        closed_port_url(),
        Duration::from_secs(5),
    );
    let (status, retry_after, message) =
        expect_transient(provider.embed("m", &inputs(&["x"]), None, &mut never()));
    assert_eq!((status, retry_after), (None, None));
    assert!(
        message.starts_with("ollama POST /api/embed (model \"m\"): "),
        "{message}"
    );
    assert!(message.to_lowercase().contains("connect"), "{message}");
}

#[test]
fn timeout_is_transient_and_the_hook_is_polled_meanwhile() {
    let server = TestServer::start(vec![Behaviour::Silent]);
    let provider = provider(
        ProviderKind::OpenAi,
        format!("{}/v1", server.url()),
        Duration::from_millis(300),
    );
    let mut polls = 0u32;
    let started = Instant::now();
    let result = provider.list_models(&mut || {
        polls += 1;
        false
    });
    let elapsed = started.elapsed();
    let (status, _, message) = expect_transient(result);
    assert_eq!(status, None);
    assert!(message.contains("timed out"), "{message}");
    assert!(
        elapsed >= Duration::from_millis(290) && elapsed < Duration::from_millis(1500),
        "{elapsed:?}"
    );
    assert!(polls >= 4, "hook polled only {polls} times in {elapsed:?}");
}

// ---------------------------------------------------------------- unusable success responses

fn ollama_embed_reply(body: &str, texts: &[&str]) -> Result<rag_embed::EmbedOutput, ProviderError> {
    let server = TestServer::start(vec![Behaviour::raw(
        200,
        &[("Content-Type", "application/json")],
        body,
    )]);
    ollama(&server).embed("m", &inputs(texts), None, &mut never())
}

#[test]
fn malformed_json_is_permanent() {
    let (status, message) =
        expect_permanent(ollama_embed_reply("{\"embeddings\": [[1.0, 2.0]", &["x"]));
    assert_eq!(status, Some(200));
    assert!(
        message.contains("unusable response (26 bytes): EOF while parsing"),
        "{message}"
    );
    assert!(!message.contains("{\"embeddings\""), "{message}");
}

// ---------------------------------------------------------------- what a provider's URL may reach and read back

#[test]
fn an_internal_page_is_not_read_back() {
    // What a rag_admin could point a provider at: any HTTP service the database server reaches.
    for status in [200, 403, 500] {
        let server = TestServer::start(vec![Behaviour::raw(
            status,
            &[("Content-Type", "text/plain")],
            "db_password=hunter2",
        )]);
        let result = openai(&server).list_models(&mut never());
        let message = match result {
            Err(error) => error.message().to_string(),
            Ok(models) => panic!("a text page gave models: {models:?}"),
        };
        assert!(!message.contains("hunter2"), "{message}");
    }
}

#[test]
fn redirects_are_not_followed() {
    let target = TestServer::start(vec![Behaviour::json(200, json!({"data": []}))]);
    let server = TestServer::start(vec![Behaviour::raw(
        302,
        &[("Location", &format!("{}/v1/models", target.url()))],
        "",
    )]);
    let (status, message) = expect_permanent(openai(&server).list_models(&mut never()));
    assert_eq!(status, Some(302), "{message}");
    assert_eq!(target.requests().len(), 0, "the redirect was followed");
}

#[test]
fn a_base_url_cannot_hide_the_route_or_carry_credentials() {
    for base_url in [
        "http://127.0.0.1:9/secret?x=",
        "http://127.0.0.1:9/secret#",
        "http://user:pass@127.0.0.1:9/v1",
        "http://user@127.0.0.1:9/v1",
    ] {
        let error = Provider::new(ProviderConfig {
            kind: ProviderKind::OpenAi,
            base_url: base_url.to_string(),
            api_key: None,
            timeout: Duration::from_secs(1),
            allowed_hosts: HostAllowlist::default(),
        })
        .expect_err(base_url);
        assert!(
            error.message().contains("must not carry a query"),
            "{base_url}: {}",
            error.message()
        );
        assert!(!error.message().contains("pass"), "{}", error.message());
    }
}

#[test]
fn an_echoed_key_cut_short_is_still_redacted() {
    // A server that echoes the Authorization header just before the cut of the quoted error text: the key is
    // taken out of the body before anything is cut, so no prefix of it survives.
    for padding in [250, 270, 285, 290] {
        let server = TestServer::start(vec![Behaviour::json(
            404,
            json!({"error": {"message": format!("{} Bearer {SECRET}", "a".repeat(padding))}}),
        )]);
        let (_, message) = expect_permanent(openai(&server).list_models(&mut never()));
        assert!(!message.contains("sk-test"), "{padding}: {message}");
    }
}

#[test]
fn wrongly_shaped_json_is_permanent() {
    for body in [
        r#"{"embeddings": "nope"}"#,
        r#"{"embedding": [1.0]}"#,
        r#"[[1.0]]"#,
        r#"{"embeddings": [[1.0, null]]}"#,
    ] {
        let (status, _) = expect_permanent(ollama_embed_reply(body, &["x"]));
        assert_eq!(status, Some(200), "{body}");
    }
    let server = TestServer::start(vec![Behaviour::json(200, json!({"data": [{"index": 0}]}))]);
    expect_permanent(openai(&server).embed("m", &inputs(&["x"]), None, &mut never()));
    let server = TestServer::start(vec![Behaviour::json(200, json!({"models": [{"size": 3}]}))]);
    expect_permanent(ollama(&server).list_models(&mut never()));
}

#[test]
fn vector_count_mismatch_is_permanent() {
    let (_, message) = expect_permanent(ollama_embed_reply(
        r#"{"embeddings": [[1.0, 2.0]]}"#,
        &["a", "b"],
    ));
    assert!(message.contains("1 vectors for 2 inputs"), "{message}");
}

#[test]
fn ragged_dimensions_are_permanent() {
    let (_, message) = expect_permanent(ollama_embed_reply(
        r#"{"embeddings": [[1.0, 2.0], [1.0]]}"#,
        &["a", "b"],
    ));
    assert!(message.contains("ragged dimensions"), "{message}");
}

#[test]
fn empty_vectors_are_permanent() {
    let (_, message) = expect_permanent(ollama_embed_reply(r#"{"embeddings": [[]]}"#, &["a"]));
    assert!(message.contains("empty"), "{message}");
}

#[test]
fn zero_vector_is_permanent() {
    let (_, message) = expect_permanent(ollama_embed_reply(
        r#"{"embeddings": [[0.5, 0.5], [0, 0.0]]}"#,
        &["a", "b"],
    ));
    assert!(message.contains("vector 1 has zero norm"), "{message}");
}

#[test]
fn value_overflowing_f32_is_permanent() {
    // JSON has no NaN, but a number beyond f32's range becomes infinite when narrowed.
    let (_, message) = expect_permanent(ollama_embed_reply(
        r#"{"embeddings": [[1e39, 1.0]]}"#,
        &["a"],
    ));
    assert!(message.contains("non-finite"), "{message}");
}

#[test]
fn empty_batch_makes_no_call() {
    let provider = provider(
        ProviderKind::Ollama,
        closed_port_url(),
        Duration::from_secs(1),
    );
    let output = provider.embed("m", &[], None, &mut never()).unwrap();
    assert!(output.vectors.is_empty());
}

// ---------------------------------------------------------------- interrupts

#[test]
fn interrupt_hook_stops_a_hanging_call_promptly() {
    let server = TestServer::start(vec![Behaviour::Silent]);
    let provider = provider(ProviderKind::Ollama, server.url(), Duration::from_secs(30));
    let started = Instant::now();
    let result = provider.embed("m", &inputs(&["x"]), None, &mut || {
        started.elapsed() >= Duration::from_millis(100)
    });
    let elapsed = started.elapsed();
    assert_eq!(result, Err(ProviderError::Interrupted));
    assert!(
        elapsed >= Duration::from_millis(100) && elapsed < Duration::from_millis(400),
        "{elapsed:?}"
    );
}

#[test]
fn pending_interrupt_sends_nothing() {
    let server = TestServer::start(vec![Behaviour::json(200, json!({"models": []}))]);
    let provider = ollama(&server);
    assert_eq!(
        provider.list_models(&mut || true),
        Err(ProviderError::Interrupted)
    );
    // A following call goes through, and it is the first request the server saw.
    assert_eq!(provider.list_models(&mut never()), Ok(vec![]));
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn unwinding_hook_propagates_and_leaves_the_provider_usable() {
    let server = TestServer::start(vec![
        Behaviour::Silent,
        Behaviour::json(200, json!({"models": []})),
    ]);
    let provider = ollama(&server);
    let unwound = panic::catch_unwind(AssertUnwindSafe(|| {
        let mut calls = 0;
        provider.list_models(&mut || {
            calls += 1;
            if calls > 2 {
                panic!("canceling statement due to user request");
            }
            false
        })
    }));
    assert!(unwound.is_err(), "the hook's unwind must reach the caller");
    assert_eq!(provider.list_models(&mut never()), Ok(vec![]));
}

#[test]
fn connections_and_provider_survive_many_calls() {
    let server = TestServer::start(vec![Behaviour::json(200, json!({"embeddings": [[1.0]]}))]);
    let provider = ollama(&server);
    for _ in 0..20 {
        assert_eq!(
            provider
                .embed("m", &inputs(&["x"]), None, &mut never())
                .unwrap()
                .vectors,
            vec![vec![1.0]]
        );
    }
    assert_eq!(server.requests().len(), 20);
}

fn listed_provider(base_url: String, list: &str) -> Result<Provider, ProviderError> {
    Provider::new(ProviderConfig {
        kind: ProviderKind::OpenAi,
        base_url,
        api_key: Some(SECRET.to_string()),
        timeout: Duration::from_secs(5),
        allowed_hosts: HostAllowlist::parse(list).expect("a valid list"),
    })
}

#[test]
fn provider_hosts_refuse_unlisted_servers_before_any_request() {
    let server = TestServer::start(vec![Behaviour::json(200, json!({"data": []}))]);
    let port = server.url().rsplit(':').next().unwrap().to_string();
    let by_name = format!("http://localhost:{port}/v1");
    let by_address = format!("http://127.0.0.1:{port}/v1");

    // Listed by address: an address literal passes, and a name passes only by resolving inside the block.
    for url in [&by_address, &by_name] {
        let provider = listed_provider(url.clone(), "127.0.0.0/8").expect(url);
        provider.list_models(&mut never()).expect(url);
    }
    // The port is part of an entry.
    let error = listed_provider(by_address.clone(), "127.0.0.1:1").expect_err("wrong port");
    assert!(
        error
            .message()
            .contains(&format!("127.0.0.1:{port} is not in rag.provider_hosts")),
        "{}",
        error.message()
    );
    // An unlisted address literal is refused when the provider is made.
    let error =
        listed_provider(by_address.clone(), "10.0.0.0/8, ollama.internal").expect_err("unlisted");
    assert!(
        error.message().contains("is not in rag.provider_hosts"),
        "{}",
        error.message()
    );
    // A name that resolves outside every listed block is refused at connect, permanently, and nothing was sent.
    let provider =
        listed_provider(by_name.clone(), "10.0.0.0/8").expect("names go to the resolver");
    let (status, message) = expect_permanent(provider.list_models(&mut never()));
    assert_eq!(status, None, "{message}");
    assert!(
        message.contains("localhost resolves to no address in rag.provider_hosts"),
        "{message}"
    );
    // Listed by name: its own DNS answer is trusted.
    listed_provider(by_name.clone(), &format!("localhost:{port}"))
        .expect("listed name")
        .list_models(&mut never())
        .expect("listed name");
    assert_eq!(
        server.requests().len(),
        3,
        "only the admitted calls reached the server"
    );
}

#[test]
fn chat_replies_keep_no_nul_and_trust_no_absurd_token_counts() {
    let server = TestServer::start(vec![Behaviour::json(
        200,
        json!({"choices": [{"message": {"content": "nul \u{0} hidden [1]"}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 9223372036854775807i64, "completion_tokens": -105}}),
    )]);
    let messages = [ChatMessage::new("user", "q")];
    let reply = openai(&server)
        .chat(
            &ChatRequest {
                model: "m",
                messages: &messages,
                json_schema: None,
                max_tokens: None,
                temperature: None,
            },
            &mut never(),
        )
        .unwrap();
    assert_eq!(reply.content, "nul \u{FFFD} hidden [1]");
    assert_eq!((reply.prompt_tokens, reply.completion_tokens), (None, None));
}

#[test]
fn chat_replies_longer_than_max_tokens_allows_are_refused() {
    // A server that ignores max_tokens: the content past the limit is refused before anything reads it, on both
    // protocols; content at the limit passes.
    let limit = rag_embed::chat_reply_limit(16);
    let markers = "[1]".repeat(limit / 3 + 1);
    let at_limit = "a".repeat(limit);
    let server = TestServer::start(vec![
        Behaviour::json(
            200,
            json!({"choices": [{"message": {"content": markers}, "finish_reason": "stop"}]}),
        ),
        Behaviour::json(
            200,
            json!({"choices": [{"message": {"content": at_limit}, "finish_reason": "stop"}]}),
        ),
        Behaviour::json(
            200,
            json!({"message": {"role": "assistant", "content": markers}, "done": true}),
        ),
    ]);
    let messages = [ChatMessage::new("user", "q")];
    let request = ChatRequest {
        model: "m",
        messages: &messages,
        json_schema: None,
        max_tokens: Some(16),
        temperature: None,
    };
    let (_, message) = expect_permanent(openai(&server).chat(&request, &mut never()));
    assert!(
        message.contains(&format!(
            "the reply's content is {} bytes, more than max_tokens 16 allows ({limit} bytes)",
            markers.len()
        )),
        "{message}"
    );
    let output = openai(&server).chat(&request, &mut never()).unwrap();
    assert_eq!(output.content.len(), limit);
    let (_, message) = expect_permanent(ollama(&server).chat(&request, &mut never()));
    assert!(message.contains("does not honour max_tokens"), "{message}");
}
