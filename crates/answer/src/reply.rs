//! Reading the chat model's JSON reply.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::grounding::parse_marker_body;

/// The model's reply, as asked for by the prompt and [`crate::answer_json_schema`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelReply {
    /// The answer text, with `[n]` markers.
    pub answer: String,
    /// The source numbers the model says it cited (unchecked: see [`crate::ground`]).
    pub citations: Vec<i64>,
    /// Whether the model found the sources sufficient.
    pub sufficient: bool,
    /// Why the sources were insufficient, if the model said.
    pub reason: Option<String>,
}

/// A reply that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// The content is not a JSON document (typically prose).
    NotJson {
        /// The parser's complaint.
        detail: String,
        /// The start of the content, for the log.
        excerpt: String,
    },
    /// The content is JSON but not the expected object.
    Shape {
        /// What is wrong with it.
        detail: String,
    },
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::NotJson { detail, excerpt } => {
                write!(
                    f,
                    "the model's reply is not JSON ({detail}); it begins: {excerpt:?}"
                )
            }
            ReplyError::Shape { detail } => {
                write!(f, "the model's reply has the wrong shape: {detail}")
            }
        }
    }
}

impl std::error::Error for ReplyError {}

const EXCERPT_CHARS: usize = 120;

/// Parses the reply content as one JSON object `{answer, citations, sufficient, reason}`.
///
/// Tolerated: surrounding whitespace, a Markdown code fence (```` ```json ````), a leading `<think>…</think>` block
/// some reasoning models emit, citations given as strings (`"1"`, `"[1]"`), a single citation not in an array,
/// `null` for `answer` (read as empty), `reason` or `citations`, and `sufficient` as the string `"true"`/`"false"`.
/// Citation entries that hold no number are ignored; the answer's own markers are still checked by
/// [`crate::ground`].
///
/// Prose, or JSON followed by prose, is [`ReplyError::NotJson`]; a missing `answer`, `citations` or `sufficient`
/// field, or a value of the wrong type, is [`ReplyError::Shape`].
pub fn parse_model_reply(content: &str) -> Result<ModelReply, ReplyError> {
    let body = unwrap_reply(content);
    let value: Value = serde_json::from_str(body).map_err(|error| ReplyError::NotJson {
        detail: error.to_string(),
        excerpt: body.chars().take(EXCERPT_CHARS).collect(),
    })?;
    let Value::Object(object) = value else {
        return Err(ReplyError::Shape {
            detail: format!("expected a JSON object, got {}", json_kind(&value)),
        });
    };
    Ok(ModelReply {
        answer: read_answer(&object)?,
        citations: read_citations(&object)?,
        sufficient: read_sufficient(&object)?,
        reason: read_optional_string(&object, "reason")?,
    }
    .storable())
}

impl ModelReply {
    /// The reply with every NUL turned into U+FFFD. The provider cleans the content it received, but a JSON
    /// escape (`\u0000`) in the answer or reason only becomes a NUL when the reply is decoded here: shown to
    /// the caller, a NUL ended the answer (and hid the text after it, the truncation note and the citation
    /// markers included, from the caller but not from the citation check), and stored, it made a ledger value
    /// that `COPY` and so pg_dump cut short (red team 20).
    fn storable(self) -> ModelReply {
        ModelReply {
            answer: without_nul(self.answer),
            reason: self.reason.map(without_nul),
            ..self
        }
    }
}

fn without_nul(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    }
}

/// Strips whitespace, a leading think block and a code fence around the reply.
fn unwrap_reply(content: &str) -> &str {
    let mut body = strip_think_block(content).trim();
    if let Some(fenced) = body.strip_prefix("```") {
        // The fence line may name a language (```json); the JSON starts on the next line.
        body = match fenced.split_once('\n') {
            Some((_, rest)) => rest,
            None => fenced.trim_start_matches(|c: char| c.is_ascii_alphabetic()),
        };
        body = body.trim_end();
        body = body.strip_suffix("```").unwrap_or(body).trim();
    }
    body
}

/// Drops a leading `<think>…</think>` block; an unclosed one is left for the JSON parser to reject.
pub(crate) fn strip_think_block(content: &str) -> &str {
    let trimmed = content.trim_start();
    match trimmed.strip_prefix("<think>") {
        Some(inside) => match inside.find("</think>") {
            Some(end) => &inside[end + "</think>".len()..],
            None => content,
        },
        None => content,
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn missing(field: &str) -> ReplyError {
    ReplyError::Shape {
        detail: format!("the field \"{field}\" is missing"),
    }
}

fn wrong_type(field: &str, expected: &str, value: &Value) -> ReplyError {
    ReplyError::Shape {
        detail: format!(
            "the field \"{field}\" should be {expected}, got {}",
            json_kind(value)
        ),
    }
}

fn read_answer(object: &Map<String, Value>) -> Result<String, ReplyError> {
    match object.get("answer") {
        None => Err(missing("answer")),
        Some(Value::String(answer)) => Ok(answer.clone()),
        Some(Value::Null) => Ok(String::new()),
        Some(other) => Err(wrong_type("answer", "a string", other)),
    }
}

fn read_sufficient(object: &Map<String, Value>) -> Result<bool, ReplyError> {
    match object.get("sufficient") {
        None => Err(missing("sufficient")),
        Some(Value::Bool(sufficient)) => Ok(*sufficient),
        Some(Value::String(text)) if text.trim().eq_ignore_ascii_case("true") => Ok(true),
        Some(Value::String(text)) if text.trim().eq_ignore_ascii_case("false") => Ok(false),
        Some(other) => Err(wrong_type("sufficient", "a boolean", other)),
    }
}

fn read_optional_string(
    object: &Map<String, Value>,
    field: &str,
) -> Result<Option<String>, ReplyError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if text.trim().is_empty() => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.trim().to_string())),
        Some(other) => Err(wrong_type(field, "a string", other)),
    }
}

fn read_citations(object: &Map<String, Value>) -> Result<Vec<i64>, ReplyError> {
    let mut citations = Vec::new();
    match object.get("citations") {
        None => return Err(missing("citations")),
        Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for item in items {
                match item {
                    Value::Number(_) | Value::String(_) => collect_citation(item, &mut citations),
                    other => return Err(wrong_type("citations", "an array of integers", other)),
                }
            }
        }
        Some(single @ (Value::Number(_) | Value::String(_))) => {
            collect_citation(single, &mut citations)
        }
        Some(other) => return Err(wrong_type("citations", "an array of integers", other)),
    }
    Ok(citations)
}

fn collect_citation(item: &Value, citations: &mut Vec<i64>) {
    match item {
        Value::Number(number) => {
            if let Some(integer) = number.as_i64() {
                citations.push(integer);
            } else if number.as_u64().is_some() {
                // Too large for i64: certainly out of range, so keep it visible as such rather than dropping it.
                citations.push(i64::MAX);
            } else if let Some(float) = number.as_f64() {
                if float.is_finite() && float.fract() == 0.0 {
                    // `as` saturates, which keeps absurd values out of range.
                    citations.push(float as i64);
                }
            }
        }
        Value::String(text) => citations.extend(numbers_in_text(text)),
        _ => {}
    }
}

/// The integers in a citation string such as "1", "[1]", "[1, 2]", "[1-3]" or "Source 3"; digits beyond i64
/// saturate.
pub(crate) fn numbers_in_text(text: &str) -> Vec<i64> {
    let inner = text.trim().trim_start_matches('[').trim_end_matches(']');
    if let Some(numbers) = parse_marker_body(inner) {
        return numbers;
    }
    let mut numbers = Vec::new();
    let mut previous: Option<char> = None;
    let mut chars = text.char_indices().peekable();
    while let Some((index, c)) = chars.next() {
        // A hyphen between words or numbers ("A-1", "2-3") is not a minus sign.
        let negative = c == '-'
            && !previous.is_some_and(char::is_alphanumeric)
            && chars.peek().is_some_and(|(_, next)| next.is_ascii_digit());
        previous = Some(c);
        if !(c.is_ascii_digit() || negative) {
            continue;
        }
        let digits_start = if negative { index + 1 } else { index };
        let mut digits_end = if negative {
            digits_start
        } else {
            index + c.len_utf8()
        };
        while let Some(&(next_index, next)) = chars.peek() {
            if !next.is_ascii_digit() {
                break;
            }
            digits_end = next_index + 1;
            previous = Some(next);
            chars.next();
        }
        numbers.push(saturating_integer(
            &text[digits_start..digits_end],
            negative,
        ));
    }
    numbers
}

/// Parses ASCII digits, saturating instead of failing on overflow.
pub(crate) fn saturating_integer(digits: &str, negative: bool) -> i64 {
    match digits.parse::<i64>() {
        Ok(value) if negative => -value,
        Ok(value) => value,
        Err(_) if negative => i64::MIN,
        Err(_) => i64::MAX,
    }
}

/// Recovers what it can from a reply cut off at the model's output limit, such as
/// `{"answer": "Thirty days [1]. Managers may`.
///
/// Reads the top-level fields of the (possibly unterminated) JSON object leniently: a string cut off mid-way is
/// kept up to the cut, a number at the very end (possibly incomplete) is dropped, `sufficient` defaults to `true`
/// (the model was answering when it was cut off). `None` when there is no answer text to recover or the content
/// does not start like the expected object. Pair the result with [`crate::mark_truncated`].
pub fn salvage_truncated_reply(content: &str) -> Option<ModelReply> {
    let mut body = strip_think_block(content).trim_start();
    if let Some(fenced) = body.strip_prefix("```") {
        body = fenced
            .split_once('\n')
            .map_or("", |(_, rest)| rest)
            .trim_start();
    }
    let mut cursor = Cursor {
        text: body,
        position: 0,
    };
    if cursor.next() != Some('{') {
        return None;
    }

    let mut answer: Option<String> = None;
    let mut citations: Vec<i64> = Vec::new();
    let mut sufficient: Option<bool> = None;
    let mut reason: Option<String> = None;
    loop {
        cursor.skip_whitespace();
        match cursor.peek() {
            Some(',') => {
                cursor.next();
                continue;
            }
            Some('"') => {}
            _ => break,
        }
        cursor.next();
        let Some(key) = cursor
            .string()
            .filter(|(_, complete)| *complete)
            .map(|(key, _)| key)
        else {
            break;
        };
        cursor.skip_whitespace();
        if cursor.next() != Some(':') {
            break;
        }
        cursor.skip_whitespace();
        match (key.as_str(), cursor.peek()) {
            ("answer" | "reason", Some('"')) => {
                cursor.next();
                let Some((text, complete)) = cursor.string() else {
                    break;
                };
                if key == "answer" {
                    answer = Some(text);
                } else if !text.trim().is_empty() {
                    reason = Some(text.trim().to_string());
                }
                if !complete {
                    break;
                }
            }
            ("citations", Some('[')) => {
                cursor.next();
                if !cursor.citation_array(&mut citations) {
                    break;
                }
            }
            (_, Some('t' | 'f' | 'n' | '-' | '0'..='9')) => {
                let literal = cursor.literal();
                if cursor.at_end() {
                    break;
                }
                if key == "sufficient" {
                    sufficient = match literal {
                        "true" => Some(true),
                        "false" => Some(false),
                        _ => sufficient,
                    };
                }
            }
            (_, Some('"')) => {
                cursor.next();
                match cursor.string() {
                    Some((_, true)) => {}
                    _ => break,
                }
            }
            _ => break,
        }
    }

    let answer = answer.filter(|answer| !answer.trim().is_empty())?;
    Some(
        ModelReply {
            answer,
            citations,
            sufficient: sufficient.unwrap_or(true),
            reason,
        }
        .storable(),
    )
}

/// A forward-only reader over possibly truncated JSON.
struct Cursor<'a> {
    text: &'a str,
    position: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<char> {
        self.text[self.position..].chars().next()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.position += c.len_utf8();
        Some(c)
    }

    fn at_end(&self) -> bool {
        self.position >= self.text.len()
    }

    fn skip_whitespace(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.next();
        }
    }

    /// Reads a bare literal (number, true, false, null).
    fn literal(&mut self) -> &'a str {
        let text: &'a str = self.text;
        let start = self.position;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '+' | '.'))
        {
            self.next();
        }
        &text[start..self.position]
    }

    /// Reads a string body after its opening quote: the text and whether the closing quote was reached.
    /// `None` only for an invalid escape.
    fn string(&mut self) -> Option<(String, bool)> {
        let mut text = String::new();
        loop {
            let Some(c) = self.next() else {
                return Some((text, false));
            };
            match c {
                '"' => return Some((text, true)),
                '\\' => match self.next() {
                    None => return Some((text, false)),
                    Some('n') => text.push('\n'),
                    Some('t') => text.push('\t'),
                    Some('r') => text.push('\r'),
                    Some('b') => text.push('\u{8}'),
                    Some('f') => text.push('\u{c}'),
                    Some(c @ ('"' | '\\' | '/')) => text.push(c),
                    Some('u') => match self.unicode_escape() {
                        Some(Some(decoded)) => text.push(decoded),
                        Some(None) => return Some((text, false)),
                        None => return None,
                    },
                    Some(_) => return None,
                },
                c => text.push(c),
            }
        }
    }

    /// Reads the four hex digits after `\u`, and a low surrogate after a high one.
    /// `Some(None)` when the input ends mid-escape, `None` for invalid hex.
    fn unicode_escape(&mut self) -> Option<Option<char>> {
        let Some(first) = self.hex4()? else {
            return Some(None);
        };
        if (0xD800..0xDC00).contains(&first) {
            let rest = &self.text[self.position..];
            if rest.len() < 6 {
                return Some(None);
            }
            if rest.starts_with("\\u") {
                self.position += 2;
                let Some(second) = self.hex4()? else {
                    return Some(None);
                };
                if (0xDC00..0xE000).contains(&second) {
                    let combined = 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
                    return Some(Some(
                        char::from_u32(combined).unwrap_or(char::REPLACEMENT_CHARACTER),
                    ));
                }
            }
            return Some(Some(char::REPLACEMENT_CHARACTER));
        }
        Some(Some(
            char::from_u32(first).unwrap_or(char::REPLACEMENT_CHARACTER),
        ))
    }

    fn hex4(&mut self) -> Option<Option<u32>> {
        let rest = &self.text[self.position..];
        if rest.len() < 4 {
            self.position = self.text.len();
            return Some(None);
        }
        let digits = rest.get(..4)?;
        if !digits.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let value = u32::from_str_radix(digits, 16).ok()?;
        self.position += 4;
        Some(Some(value))
    }

    /// Reads citation entries after `[`; returns whether the array was closed.
    fn citation_array(&mut self, citations: &mut Vec<i64>) -> bool {
        loop {
            self.skip_whitespace();
            match self.peek() {
                None => return false,
                Some(']') => {
                    self.next();
                    return true;
                }
                Some(',') => {
                    self.next();
                }
                Some('"') => {
                    self.next();
                    match self.string() {
                        Some((text, true)) => citations.extend(numbers_in_text(&text)),
                        _ => return false,
                    }
                }
                Some(_) => {
                    let literal = self.literal();
                    if self.at_end() {
                        // Possibly cut mid-number: "1" may have been "12".
                        return false;
                    }
                    if literal.is_empty() {
                        return false;
                    }
                    collect_citation(
                        &serde_json::from_str::<Value>(literal).unwrap_or(Value::Null),
                        citations,
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_json_reply_is_read() {
        let reply = parse_model_reply(
            r#" {"answer": "Thirty days [1].", "citations": [1], "sufficient": true, "reason": ""} "#,
        )
        .expect("valid reply");
        assert_eq!(
            reply,
            ModelReply {
                answer: "Thirty days [1].".into(),
                citations: vec![1],
                sufficient: true,
                reason: None,
            }
        );
    }

    #[test]
    fn an_escaped_nul_in_the_answer_or_reason_is_not_kept() {
        let reply = parse_model_reply(
            r#"{"answer": "before\u0000after [1]", "citations": [1], "sufficient": true, "reason": "x\u0000y"}"#,
        )
        .expect("valid reply");
        assert_eq!(reply.answer, "before\u{FFFD}after [1]");
        assert_eq!(reply.reason.as_deref(), Some("x\u{FFFD}y"));
        let salvaged = salvage_truncated_reply(r#"{"answer": "Thirty days [1].\u0000 Managers"#)
            .expect("salvaged");
        assert_eq!(salvaged.answer, "Thirty days [1].\u{FFFD} Managers");
    }

    #[test]
    fn fenced_json_is_accepted() {
        let content =
            "```json\n{\"answer\": \"A [2]\", \"citations\": [2], \"sufficient\": true}\n```\n";
        let reply = parse_model_reply(content).expect("fenced reply");
        assert_eq!(reply.citations, vec![2]);
        let bare_fence =
            "```\n{\"answer\": \"A [2]\", \"citations\": [], \"sufficient\": true}\n```";
        assert_eq!(
            parse_model_reply(bare_fence).expect("bare fence").answer,
            "A [2]"
        );
    }

    #[test]
    fn leading_think_block_is_ignored() {
        let content = "<think>The user wants...</think>\n{\"answer\": \"B [1]\", \"citations\": [1], \"sufficient\": true}";
        assert_eq!(
            parse_model_reply(content)
                .expect("reply after thinking")
                .answer,
            "B [1]"
        );
    }

    #[test]
    fn prose_is_not_json() {
        let error =
            parse_model_reply("Thirty days, according to the handbook [1].").expect_err("prose");
        match &error {
            ReplyError::NotJson { excerpt, .. } => assert!(excerpt.starts_with("Thirty days")),
            other => panic!("expected NotJson, got {other:?}"),
        }
        assert!(error.to_string().contains("not JSON"));
        assert!(matches!(
            parse_model_reply(""),
            Err(ReplyError::NotJson { .. })
        ));
        assert!(matches!(
            parse_model_reply(
                "{\"answer\": \"x\", \"citations\": [], \"sufficient\": true} I hope this helps!"
            ),
            Err(ReplyError::NotJson { .. })
        ));
    }

    #[test]
    fn missing_or_mistyped_fields_are_shape_errors() {
        for (content, field) in [
            (r#"{"citations": [1], "sufficient": true}"#, "answer"),
            (r#"{"answer": "a", "sufficient": true}"#, "citations"),
            (r#"{"answer": "a", "citations": [1]}"#, "sufficient"),
            (
                r#"{"answer": 5, "citations": [1], "sufficient": true}"#,
                "answer",
            ),
            (
                r#"{"answer": "a", "citations": [{"n": 1}], "sufficient": true}"#,
                "citations",
            ),
            (
                r#"{"answer": "a", "citations": [1], "sufficient": "maybe"}"#,
                "sufficient",
            ),
        ] {
            match parse_model_reply(content) {
                Err(ReplyError::Shape { detail }) => {
                    assert!(detail.contains(field), "{detail} names {field}")
                }
                other => panic!("{content}: expected a shape error, got {other:?}"),
            }
        }
        assert!(matches!(
            parse_model_reply("[1, 2]"),
            Err(ReplyError::Shape { .. })
        ));
    }

    #[test]
    fn citations_as_strings_are_accepted() {
        let reply = parse_model_reply(
            r#"{"answer": "a", "citations": ["1", "[2]", "[3, 4]", "Source 5", 6, 7.0, "none"], "sufficient": "true"}"#,
        )
        .expect("lenient citations");
        assert_eq!(reply.citations, vec![1, 2, 3, 4, 5, 6, 7]);
        assert!(reply.sufficient);
    }

    #[test]
    fn citation_strings_with_ranges_and_hyphens() {
        assert_eq!(numbers_in_text("[1-3]"), vec![1, 2, 3]);
        assert_eq!(numbers_in_text("[1][2]"), vec![1, 2]);
        assert_eq!(numbers_in_text("-2"), vec![-2]);
        assert_eq!(numbers_in_text("doc A-4, [-1]"), vec![4, -1]);
        assert!(numbers_in_text("none").is_empty());
    }

    #[test]
    fn out_of_range_numbers_stay_visible() {
        let reply = parse_model_reply(
            r#"{"answer": "a", "citations": [-2, 0, 99999999999999999999, "123456789012345678901234"], "sufficient": true}"#,
        )
        .expect("reply");
        assert_eq!(reply.citations, vec![-2, 0, i64::MAX, i64::MAX]);
    }

    #[test]
    fn nulls_are_read_as_absent() {
        let reply = parse_model_reply(
            r#"{"answer": null, "citations": null, "sufficient": false, "reason": "No policy."}"#,
        )
        .expect("reply");
        assert_eq!(reply.answer, "");
        assert!(reply.citations.is_empty());
        assert!(!reply.sufficient);
        assert_eq!(reply.reason.as_deref(), Some("No policy."));
    }

    #[test]
    fn truncated_reply_is_salvaged() {
        let reply = salvage_truncated_reply(
            r#"{"answer": "Thirty days [1]. Managers \"may\" agree\u00e9 otherw"#,
        )
        .expect("answer recovered");
        assert_eq!(
            reply.answer,
            "Thirty days [1]. Managers \"may\" agreeé otherw"
        );
        assert!(reply.citations.is_empty());
        assert!(reply.sufficient);
    }

    #[test]
    fn salvage_reads_complete_fields_and_drops_a_cut_number() {
        let reply = salvage_truncated_reply(
            "```json\n{\"answer\": \"A [1] B [2]\", \"citations\": [1, \"2\", 1",
        )
        .expect("answer recovered");
        assert_eq!(reply.answer, "A [1] B [2]");
        assert_eq!(reply.citations, vec![1, 2]);
        let complete = salvage_truncated_reply(
            r#"{"reason": "", "sufficient": false, "citations": [], "answer": "x"}"#,
        )
        .expect("complete object");
        assert!(!complete.sufficient);
    }

    #[test]
    fn salvage_gives_up_without_an_answer() {
        assert_eq!(salvage_truncated_reply("Thirty days"), None);
        assert_eq!(salvage_truncated_reply("{\"citations\": [1], \"answ"), None);
        assert_eq!(salvage_truncated_reply("{\"answer\": \"   "), None);
        let cut_in_escape =
            salvage_truncated_reply("{\"answer\": \"ab\\u12").expect("text before the cut");
        assert_eq!(cut_in_escape.answer, "ab");
    }

    #[test]
    fn salvage_decodes_surrogate_pairs() {
        let reply =
            salvage_truncated_reply(r#"{"answer": "smile \ud83d\ude00 [1]"#).expect("answer");
        assert_eq!(reply.answer, "smile 😀 [1]");
    }
}
