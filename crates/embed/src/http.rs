//! One HTTP exchange, run on its own thread so the calling (Postgres backend) thread can keep polling its
//! interrupt hook. The spawned thread owns everything it touches: a clone of the client (an `Arc` inside) and
//! the request bytes. When the caller gives up, the thread is abandoned; it ends by itself at the latest when
//! the client's timeout fires, and its reply goes nowhere.

use std::fmt;
use std::io::Read;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use reqwest::blocking::Client;
use reqwest::header::{ACCEPT, CONTENT_TYPE};

use crate::error::{classify_status, ProviderError, StatusClass};
use crate::time::{parse_retry_after, parse_retry_after_ms};
use crate::ProviderKind;

/// How often the waiting thread polls the interrupt hook.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Largest successful body accepted. A batch of 256 inputs at 4096 dimensions printed as JSON floats is about
/// 25 MB; anything far beyond is a misbehaving server, and the backend must not allocate without bound.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Error bodies are only excerpted, so little of them is read.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;
/// Longest provider error text quoted in a message.
pub(crate) const EXCERPT_CHARS: usize = 300;

/// Requests of this process that were given up on (a cancel, the deadline) and whose threads still run: each
/// holds a thread and a connection until the provider answers or the HTTP client's own deadline ends it, and
/// the provider goes on generating (and billing) meanwhile. A session that cancels call after call is held to
/// this many before it may send another.
pub const MAX_ABANDONED_REQUESTS: usize = 4;
static ABANDONED: AtomicUsize = AtomicUsize::new(0);

const RUNNING: u8 = 0;
const FINISHED: u8 = 1;
const GIVEN_UP: u8 = 2;

/// The requests given up on whose threads still run, in this process.
pub fn abandoned_requests() -> usize {
    ABANDONED.load(Ordering::Acquire)
}

/// Marks the request's thread finished, giving back its slot if the caller had given up on it.
struct FinishOnDrop(Arc<AtomicU8>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        if self.0.swap(FINISHED, Ordering::AcqRel) == GIVEN_UP {
            ABANDONED.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Counts the request as given up on if the caller leaves without its reply (by returning, or by the interrupt
/// hook unwinding with a Postgres error) while its thread still runs.
struct GiveUpOnDrop {
    state: Arc<AtomicU8>,
    replied: bool,
}

impl Drop for GiveUpOnDrop {
    fn drop(&mut self) {
        if !self.replied
            && self
                .state
                .compare_exchange(RUNNING, GIVEN_UP, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            ABANDONED.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// The HTTP methods the provider protocols use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    Get,
    Post,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Get => "GET",
            Method::Post => "POST",
        })
    }
}

/// What a call was, for error messages: `openai POST /embeddings (model "text-embedding-3-small")`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallContext<'a> {
    pub kind: ProviderKind,
    pub method: Method,
    pub route: &'static str,
    pub model: Option<&'a str>,
}

impl fmt::Display for CallContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.kind, self.method, self.route)?;
        if let Some(model) = self.model {
            write!(f, " (model {:?})", excerpt(model, 200))?;
        }
        Ok(())
    }
}

impl CallContext<'_> {
    /// A permanent error about a response that arrived with a success status but cannot be used. The body
    /// is not quoted: the server is whatever the provider's URL names, which a `rag_admin` chooses, and a
    /// quote would read any internal HTTP service back to them (only its size is given).
    pub(crate) fn bad_response(&self, status: u16, problem: &str, body: &[u8]) -> ProviderError {
        // Checks made after parsing (counts, norms) pass no body.
        let size = if body.is_empty() {
            String::new()
        } else {
            format!(" ({} bytes)", body.len())
        };
        ProviderError::Permanent {
            status: Some(status),
            message: format!(
                "{self}: HTTP {status}: unusable response{size}: {}",
                excerpt(&without_quoted_values(problem), EXCERPT_CHARS)
            ),
        }
    }
}

/// A successful (2xx) reply.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Everything the worker thread brings back; plain owned data.
enum Outcome {
    Answered {
        status: u16,
        retry_after: Option<String>,
        retry_after_ms: Option<String>,
        body: Vec<u8>,
    },
    TooLarge {
        status: u16,
        limit: usize,
    },
    Failed {
        transient: bool,
        timed_out: bool,
        detail: String,
    },
}

/// What to send.
pub(crate) struct Outgoing {
    pub method: Method,
    pub url: String,
    pub bearer: Option<String>,
    pub json_body: Option<Vec<u8>>,
}

/// Sends the request on a fresh thread and waits for it, polling `interrupt` every [`POLL_INTERVAL`] and
/// enforcing `timeout` as the whole-request deadline. Non-2xx statuses become errors here.
pub(crate) fn exchange(
    client: &Client,
    outgoing: Outgoing,
    timeout: Duration,
    context: &CallContext<'_>,
    interrupt: &mut dyn FnMut() -> bool,
) -> Result<Reply, ProviderError> {
    // Not sending at all is the cheapest way to honour a cancel that is already pending.
    if interrupt() {
        return Err(ProviderError::Interrupted);
    }
    let started = Instant::now();
    // Kept to take the key out of what the server answers before any of it is quoted: a server that echoes
    // the Authorization header would otherwise have it cut short in an excerpt, where a replacement of the
    // whole key no longer finds it.
    let key = outgoing.bearer.clone().filter(|key| !key.is_empty());
    let abandoned = abandoned_requests();
    if abandoned >= MAX_ABANDONED_REQUESTS {
        return Err(ProviderError::Transient {
            status: None,
            retry_after: None,
            message: format!(
                "{context}: not sent: {abandoned} earlier requests of this session that were cancelled or timed \
                 out are still running; each ends when the provider answers or within its deadline \
                 (rag.http_timeout)"
            ),
        });
    }
    let (sender, receiver) = mpsc::sync_channel(1);
    let worker_client = client.clone();
    let state = Arc::new(AtomicU8::new(RUNNING));
    let thread_state = state.clone();
    let spawned = rag_threads::spawn(
        thread::Builder::new().name("rag-provider-http".to_string()),
        move || {
            // Released when the thread ends, a panic included: a slot held for ever would stop this process
            // from calling any provider once four were.
            let _finished = FinishOnDrop(thread_state);
            let outcome = perform(&worker_client, outgoing);
            // The caller may have given up and dropped the receiver; nobody is left to tell.
            let _ = sender.send(outcome);
        },
    );
    if let Err(error) = spawned {
        return Err(ProviderError::Transient {
            status: None,
            retry_after: None,
            message: format!("{context}: could not start the request thread: {error}"),
        });
    }
    let mut give_up = GiveUpOnDrop {
        state,
        replied: false,
    };
    let outcome = loop {
        let left = timeout.saturating_sub(started.elapsed());
        match receiver.recv_timeout(POLL_INTERVAL.min(left)) {
            Ok(outcome) => {
                give_up.replied = true;
                break outcome;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // No lock or borrow is held here: the hook may unwind with a Postgres error.
                if interrupt() {
                    return Err(ProviderError::Interrupted);
                }
                if started.elapsed() >= timeout {
                    return Err(timed_out(context, timeout));
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(ProviderError::Transient {
                    status: None,
                    retry_after: None,
                    message: format!("{context}: the request thread ended without a reply"),
                })
            }
        }
    };
    settle(
        without_key(outcome, key.as_deref()),
        timeout,
        context,
        key.as_deref(),
    )
}

/// A parser's complaint with the values it quotes from the body left out: serde quotes strings in double quotes
/// (`invalid type: string "…", expected a sequence`) and numbers and booleans in backticks (``invalid type:
/// integer `4111111111111111` ``), which would read a field of any JSON service back to whoever chose the URL.
fn without_quoted_values(problem: &str) -> String {
    const SERDE_VALUE_KINDS: [&str; 6] = [
        "integer ",
        "boolean ",
        "floating point ",
        "character ",
        "unknown variant ",
        "unknown field ",
    ];
    let mut out = String::with_capacity(problem.len());
    let mut quote: Option<char> = None;
    for ch in problem.chars() {
        match quote {
            Some(open) if ch == open => {
                out.push('…');
                out.push(ch);
                quote = None;
            }
            Some(_) => {}
            None => {
                // Backticks also name the protocol's own fields (`choices` is empty, missing field `data`):
                // only a value of the body's, after its kind, is left out.
                let value_follows =
                    ch == '`' && SERDE_VALUE_KINDS.iter().any(|kind| out.ends_with(kind));
                out.push(ch);
                if ch == '"' || value_follows {
                    quote = Some(ch);
                }
            }
        }
    }
    if quote.is_some() {
        out.push('…');
    }
    out
}

/// The outcome with every occurrence of `key` in the response body replaced by `[redacted]`.
fn without_key(outcome: Outcome, key: Option<&str>) -> Outcome {
    let Some(key) = key else {
        return outcome;
    };
    match outcome {
        Outcome::Answered {
            status,
            retry_after,
            retry_after_ms,
            body,
        } => Outcome::Answered {
            status,
            retry_after,
            retry_after_ms,
            body: replace_bytes(&body, key.as_bytes(), b"[redacted]"),
        },
        other => other,
    }
}

fn replace_bytes(haystack: &[u8], needle: &[u8], replacement: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut rest = haystack;
    while !needle.is_empty() && rest.len() >= needle.len() {
        match rest
            .windows(needle.len())
            .position(|window| window == needle)
        {
            Some(at) => {
                out.extend_from_slice(&rest[..at]);
                out.extend_from_slice(replacement);
                rest = &rest[at + needle.len()..];
            }
            None => break,
        }
    }
    out.extend_from_slice(rest);
    out
}

fn timed_out(context: &CallContext<'_>, timeout: Duration) -> ProviderError {
    ProviderError::Transient {
        status: None,
        retry_after: None,
        message: format!("{context}: timed out after {:.3}s", timeout.as_secs_f64()),
    }
}

fn settle(
    outcome: Outcome,
    timeout: Duration,
    context: &CallContext<'_>,
    key: Option<&str>,
) -> Result<Reply, ProviderError> {
    match outcome {
        Outcome::Answered { status, body, .. } if (200..300).contains(&status) => {
            Ok(Reply { status, body })
        }
        Outcome::Answered {
            status,
            retry_after,
            retry_after_ms,
            body,
        } => {
            let reason = reqwest::StatusCode::from_u16(status)
                .ok()
                .and_then(|code| code.canonical_reason());
            let mut message = format!("{context}: HTTP {status}");
            if let Some(reason) = reason {
                message.push(' ');
                message.push_str(reason);
            }
            let text = provider_error_text(&body, key);
            if !text.is_empty() {
                message.push_str(": ");
                message.push_str(&text);
            }
            // Whatever the status but those that say "later" (a rate limit's text may speak of too many tokens
            // a minute): llama.cpp's server answers 500 for it, which would be retried until the deadline, and
            // as a 400 it read as a wrong model name or key.
            if !matches!(status, 408 | 425 | 429 | 502 | 503 | 504) && says_input_too_long(&text) {
                return Err(ProviderError::InputTooLong { message });
            }
            match classify_status(status) {
                StatusClass::Transient => {
                    // The standard header wins; OpenAI's millisecond variant is a fallback.
                    let retry_after = retry_after
                        .as_deref()
                        .and_then(|value| parse_retry_after(value, SystemTime::now()))
                        .or_else(|| retry_after_ms.as_deref().and_then(parse_retry_after_ms));
                    Err(ProviderError::Transient {
                        status: Some(status),
                        retry_after,
                        message,
                    })
                }
                StatusClass::Permanent => Err(ProviderError::Permanent {
                    status: Some(status),
                    message,
                }),
            }
        }
        Outcome::TooLarge { status, limit } => Err(ProviderError::Permanent {
            status: Some(status),
            message: format!("{context}: HTTP {status}: response body exceeds {limit} bytes"),
        }),
        Outcome::Failed {
            timed_out: true, ..
        } => Err(timed_out(context, timeout)),
        Outcome::Failed {
            transient, detail, ..
        } => {
            let message = format!("{context}: {detail}");
            if transient {
                Err(ProviderError::Transient {
                    status: None,
                    retry_after: None,
                    message,
                })
            } else {
                Err(ProviderError::Permanent {
                    status: None,
                    message,
                })
            }
        }
    }
}

/// Runs on the worker thread: touches only its arguments.
fn perform(client: &Client, outgoing: Outgoing) -> Outcome {
    let mut request = match outgoing.method {
        Method::Get => client.get(&outgoing.url),
        Method::Post => client.post(&outgoing.url),
    };
    request = request.header(ACCEPT, "application/json");
    if let Some(key) = outgoing.bearer {
        // bearer_auth marks the header sensitive, keeping it out of reqwest's own Debug output.
        request = request.bearer_auth(key);
    }
    if let Some(body) = outgoing.json_body {
        request = request.header(CONTENT_TYPE, "application/json").body(body);
    }
    let response = match request.send() {
        Ok(response) => response,
        Err(error) => return failure(error),
    };
    let status = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_string)
    };
    let retry_after = header("retry-after");
    let retry_after_ms = header("retry-after-ms");
    let success = (200..300).contains(&status);
    let limit = if success {
        MAX_BODY_BYTES
    } else {
        MAX_ERROR_BODY_BYTES
    };
    if success
        && response
            .content_length()
            .is_some_and(|length| length > limit as u64)
    {
        return Outcome::TooLarge { status, limit };
    }
    let mut body = Vec::new();
    if let Err(error) = response.take(limit as u64 + 1).read_to_end(&mut body) {
        let timed_out = error.kind() == std::io::ErrorKind::TimedOut;
        return Outcome::Failed {
            transient: true,
            timed_out,
            detail: format!("HTTP {status}: reading the response body failed: {error}"),
        };
    }
    if body.len() > limit {
        if success {
            return Outcome::TooLarge { status, limit };
        }
        body.truncate(limit);
    }
    Outcome::Answered {
        status,
        retry_after,
        retry_after_ms,
        body,
    }
}

fn failure(error: reqwest::Error) -> Outcome {
    let timed_out = error.is_timeout();
    // Builder errors (bad URL, bad header value), redirect loops and a host rag.provider_hosts refuses will not
    // heal by waiting.
    let refused_host = {
        let mut source = std::error::Error::source(&error);
        let mut refused = false;
        while let Some(cause) = source {
            refused |= cause.is::<crate::hosts::HostRefused>();
            source = cause.source();
        }
        refused
    };
    let transient = !(error.is_builder() || error.is_redirect() || refused_host);
    // The URL is dropped: the route is already in the context, and a URL could carry credentials.
    let error = error.without_url();
    let mut detail = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !detail.contains(&text) {
            detail.push_str(": ");
            detail.push_str(&text);
        }
        source = cause.source();
    }
    Outcome::Failed {
        transient,
        timed_out,
        detail: excerpt(&detail, 2 * EXCERPT_CHARS),
    }
}

/// What an error response says, for the message: the error text of a JSON body in the dialects providers use
/// (Ollama `{"error": "..."}`, OpenAI `{"error": {"message": "..."}}`, FastAPI-style `{"detail": "..."}`), a
/// string only, with `key` taken out of it before it is cut to [`EXCERPT_CHARS`] characters on one line. Never
/// the raw body or a structured value (an HTML page, a file, an internal service's answer: the server is the
/// provider's URL's, which a `rag_admin` chooses), of which only the size is given.
pub(crate) fn provider_error_text(body: &[u8], key: Option<&str>) -> String {
    let raw = String::from_utf8_lossy(body);
    let explained = match serde_json::from_str::<serde_json::Value>(&raw) {
        Ok(serde_json::Value::Object(object)) => {
            let nested_message = object.get("error").and_then(|error| error.get("message"));
            [
                nested_message,
                object.get("error"),
                object.get("message"),
                object.get("detail"),
            ]
            .into_iter()
            .flatten()
            .find_map(|value| value.as_str().map(str::to_string))
        }
        _ => None,
    };
    match explained {
        // The body was scrubbed of the key as bytes; JSON escapes (`\u002d`) hide it from that, not from this.
        Some(text) => excerpt(
            &match key {
                Some(key) => text.replace(key, "[redacted]"),
                None => text,
            },
            EXCERPT_CHARS,
        ),
        None if body.is_empty() => String::new(),
        None => format!(
            "a {}-byte body without a JSON error message (not quoted)",
            body.len()
        ),
    }
}

/// How servers say that an input is longer than their model reads, lower-cased: Ollama ("the input length
/// exceeds the context length"), llama.cpp's server ("input is too large to process. increase the physical
/// batch size", later "the request exceeds the available context size"), OpenAI and vLLM ("This model's
/// maximum context length is 8192 tokens"), Cohere ("too many tokens"). Hugging Face's text-embeddings-inference
/// says "must have less than 512 tokens", matched by its two halves.
const INPUT_TOO_LONG_PHRASES: &[&str] = &[
    "exceeds the context length",
    "is too large to process",
    "exceeds the available context size",
    "maximum context length",
    "too many tokens",
];

/// True when a provider's error text says an input was too long for the model: the caller's to shorten, never
/// worth a retry.
pub(crate) fn says_input_too_long(text: &str) -> bool {
    let text = text.to_lowercase();
    INPUT_TOO_LONG_PHRASES
        .iter()
        .any(|phrase| text.contains(phrase))
        || (text.contains("must have less than") && text.contains("tokens"))
}

/// Collapses whitespace and control characters to single spaces and cuts at `max_chars` characters.
pub(crate) fn excerpt(text: &str, max_chars: usize) -> String {
    let mut out = String::new();
    let mut chars = 0usize;
    let mut pending_space = false;
    for ch in text.chars() {
        if ch.is_whitespace() || ch.is_control() {
            pending_space = !out.is_empty();
            continue;
        }
        let needed = usize::from(pending_space) + 1;
        if chars + needed > max_chars {
            out.push('…');
            return out;
        }
        if pending_space {
            out.push(' ');
            pending_space = false;
        }
        out.push(ch);
        chars += needed;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_too_long_are_told_apart_from_other_errors() {
        for said in [
            "the input length exceeds the context length",
            "input is too large to process. increase the physical batch size",
            "input (992 tokens) is too large to process. increase the physical batch size (current batch size: 512)",
            "the request exceeds the available context size, try increasing it",
            "This model's maximum context length is 8192 tokens, however you requested 9000 tokens",
            "Input validation error: `inputs` must have less than 512 tokens. Given: 600",
            "too many tokens: total number of tokens in the prompt cannot exceed 4081",
        ] {
            assert!(says_input_too_long(said), "{said}");
        }
        for said in [
            "",
            "model \"x\" not found, try pulling it first",
            "Incorrect API key provided",
            "the request took too long",
            "server busy, please try again.  maximum pending requests exceeded",
            "Rate limit reached: too many requests",
            "must have less than 3 inputs",
        ] {
            assert!(!says_input_too_long(said), "{said}");
        }
    }

    #[test]
    fn error_text_from_each_dialect() {
        assert_eq!(
            provider_error_text(br#"{"error":"model \"x\" not found"}"#, None),
            "model \"x\" not found"
        );
        assert_eq!(
            provider_error_text(
                br#"{"error":{"message":"Incorrect API key","type":"invalid_request_error"}}"#,
                None
            ),
            "Incorrect API key"
        );
        assert_eq!(
            provider_error_text(br#"{"detail":"Not Found"}"#, None),
            "Not Found"
        );
        // Only strings: a structured value could be any service's data.
        assert_eq!(
            provider_error_text(br#"{"detail":[{"loc":["body"]}]}"#, None),
            "a 29-byte body without a JSON error message (not quoted)"
        );
        assert_eq!(
            provider_error_text(b"<html>\n  Bad   Gateway\n</html>", None),
            "a 30-byte body without a JSON error message (not quoted)"
        );
        assert_eq!(provider_error_text(b"", None), "");
        assert_eq!(
            provider_error_text(&[0xff, 0xfe, b'o', b'k'], None),
            "a 4-byte body without a JSON error message (not quoted)"
        );
        assert_eq!(
            provider_error_text(
                br#"{"AccessKeyId":"AKIA","SecretAccessKey":"s3cr3t"}"#,
                None
            ),
            "a 49-byte body without a JSON error message (not quoted)"
        );
        // A key the body spelled with JSON escapes is found once decoded, before the cut.
        assert_eq!(
            provider_error_text(br#"{"error":"bad key sk\u002dabc"}"#, Some("sk-abc")),
            "bad key [redacted]"
        );
    }

    #[test]
    fn parser_complaints_quote_no_values() {
        assert_eq!(
            without_quoted_values(
                r#"invalid type: string "secret", expected a sequence at line 1 column 53"#
            ),
            r#"invalid type: string "…", expected a sequence at line 1 column 53"#
        );
        // Backticks name fields of the protocol (`choices` is empty), not values.
        assert_eq!(
            without_quoted_values("`choices` is empty"),
            "`choices` is empty"
        );
        assert_eq!(without_quoted_values(r#"cut "short"#), r#"cut "…"#);
        // Numbers, booleans and the body's own names in backticks are values too.
        for (complaint, said) in [
            (
                "invalid type: integer `4111111111111111`, expected a sequence",
                "invalid type: integer `…`, expected a sequence",
            ),
            (
                "invalid type: boolean `true`, expected a string",
                "invalid type: boolean `…`, expected a string",
            ),
            (
                "invalid type: floating point `2.5`, expected usize",
                "invalid type: floating point `…`, expected usize",
            ),
            (
                "unknown variant `internal_secret`, expected `a` or `b`",
                "unknown variant `…`, expected `a` or `b`",
            ),
            (
                "invalid type: character `k`, expected a number",
                "invalid type: character `…`, expected a number",
            ),
            ("missing field `data`", "missing field `data`"),
        ] {
            assert_eq!(without_quoted_values(complaint), said);
        }
        assert_eq!(
            without_quoted_values("2 results for 3 documents"),
            "2 results for 3 documents"
        );
    }

    #[test]
    fn excerpt_is_bounded_and_char_safe() {
        let long = "é".repeat(1000);
        let cut = excerpt(&long, EXCERPT_CHARS);
        assert_eq!(cut.chars().count(), EXCERPT_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(excerpt("  a \n\t b  ", 10), "a b");
        assert_eq!(excerpt("abc", 3), "abc");
        assert_eq!(excerpt("abcd", 3), "abc…");
    }

    #[test]
    fn context_display() {
        let context = CallContext {
            kind: ProviderKind::OpenAi,
            method: Method::Post,
            route: "/embeddings",
            model: Some("m1"),
        };
        assert_eq!(
            context.to_string(),
            "openai POST /embeddings (model \"m1\")"
        );
        let context = CallContext {
            kind: ProviderKind::Ollama,
            method: Method::Get,
            route: "/api/tags",
            model: None,
        };
        assert_eq!(context.to_string(), "ollama GET /api/tags");
    }
}
