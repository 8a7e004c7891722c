//! The answering logic of `rag`, free of PostgreSQL and of any network: everything between "these chunks were
//! retrieved" and "this is the answer the user gets".
//!
//! 1. [`assemble_sources`] merges retrieved chunks (anchors and their neighbours) into numbered [`Source`]s within
//!    a token budget.
//! 2. [`render_prompt`] fills a template (by default [`DEFAULT_TEMPLATE`]) with [`format_context`] and the question;
//!    [`answer_json_schema`] is the reply shape to ask the provider for.
//! 3. [`parse_model_reply`] reads the reply ([`salvage_truncated_reply`] when the model hit its output limit,
//!    then [`mark_truncated`]).
//! 4. [`ground`] checks every citation against the sources actually sent, strips invented ones and refuses when
//!    nothing valid is left.
//!
//! Without a chat model, [`extractive_answer`] quotes the best-matching sentences verbatim with their citations.
//! For conversations, [`rewrite_prompt`] and [`clean_rewritten_question`] turn a follow-up into a standalone
//! question before retrieval.
//!
//! Every function is total: malformed input yields an error value or a refusal, never a panic, and the work done
//! is linear in the input size (this code runs inside a PostgreSQL backend).
//!
//! ```
//! use rag_answer::*;
//!
//! let hit = RetrievedChunk {
//!     chunk_id: 41, document_id: 7, title: "Employee Handbook 2026".into(), ordinal: 3,
//!     char_start: 900, char_end: 940, text: "All staff give thirty days notice.".into(),
//!     distance: Some(0.21), anchor_chunk_id: None, rank: None, locator: Some("p. 12".into()),
//! };
//! let assembled = assemble_sources(&[hit], 2000);
//! let prompt = render_prompt(DEFAULT_TEMPLATE, &assembled.sources, "How much notice?").unwrap();
//! assert!(prompt.contains("[1] Document 7 \"Employee Handbook 2026\", p. 12"));
//!
//! let reply = parse_model_reply(
//!     r#"{"answer": "Thirty days [1], or sixty [9].", "citations": [1, 9], "sufficient": true}"#,
//! ).unwrap();
//! assert_eq!(
//!     ground(&reply, assembled.sources.len()),
//!     Grounded::Answered { answer: "Thirty days [1], or sixty.".into(), kept: vec![1], stripped: vec![9] },
//! );
//! ```

mod extractive;
mod grounding;
mod prompt;
mod reply;
mod rewrite;
mod sources;

pub use extractive::{extractive_answer, extractive_answer_or_lead, ExtractiveAnswer};
pub use grounding::{
    ground, mark_truncated, Grounded, DEFAULT_INSUFFICIENT_REASON, EMPTY_ANSWER_REASON,
    NO_VALID_CITATION_REASON, TRUNCATION_NOTE,
};
pub use prompt::{
    answer_json_schema, format_context, render_prompt, source_header, validate_template,
    TemplateError, CONTEXT_PLACEHOLDER, DEFAULT_TEMPLATE, MAX_QUERY_PLACEHOLDERS,
    MAX_TEMPLATE_BYTES, QUERY_PLACEHOLDER,
};
pub use reply::{parse_model_reply, salvage_truncated_reply, ModelReply, ReplyError};
pub use rewrite::{
    clean_rewritten_question, rewrite_prompt, REWRITE_HISTORY_MESSAGES, REWRITE_MAX_CHARS,
    REWRITE_MESSAGE_CHARS,
};
pub use sources::{assemble_sources, estimate_tokens, AssembledSources, RetrievedChunk, Source};
