//! `rag_prompt()` and `rag_ask()`: retrieval, prompt assembly, the chat call and the grounding check. The
//! decisions (which sources, what the prompt says, which citations survive) are pure functions in
//! `crates/answer`; this module fetches, calls and records.
use super::query::embed_question;
use super::raise;
use crate::provider::{self, ProviderRow};
use pgrx::prelude::*;
use pgrx::{JsonB, PgSqlErrorCode};
use rag_answer::{
    answer_json_schema, assemble_sources, clean_rewritten_question, extractive_answer, ground,
    mark_truncated, parse_model_reply, render_prompt, rewrite_prompt, salvage_truncated_reply,
    Grounded, RetrievedChunk, Source, DEFAULT_TEMPLATE,
};
use rag_embed::{ChatMessage, ChatRequest, ProviderError};
use serde_json::json;
use std::time::Instant;

const NOTHING_CLOSE: &str =
    "Nothing in this collection is close enough to the question to answer it.";

struct Collection {
    id: i32,
    name: String,
    embedding_model: String,
    max_distance: f64,
    chat_provider: ProviderRow,
    chat_model: Option<String>,
    template: String,
    context_budget: usize,
    max_answer_tokens: u32,
}

fn load_collection(name: &str) -> Collection {
    let loaded = Spi::connect(|client| {
        let rows = client.select(
            "SELECT c.id, c.name, c.embedding_model, c.max_distance, p.name, p.kind, p.base_url, p.api_key_setting,
                    c.chat_model, c.prompt_template, c.context_budget, c.max_answer_tokens
               FROM rag.collections c JOIN rag.providers p ON p.name = c.chat_provider
              WHERE c.id = rag._collection_id($1)",
            Some(1),
            &[name.into()],
        )?;
        let mut found = None;
        for row in rows {
            found = Some(Collection {
                id: row.get(1)?.unwrap_or_default(),
                name: row.get(2)?.unwrap_or_default(),
                embedding_model: row.get(3)?.unwrap_or_default(),
                max_distance: row.get(4)?.unwrap_or(0.6),
                chat_provider: ProviderRow {
                    name: row.get(5)?.unwrap_or_default(),
                    kind: row.get(6)?.unwrap_or_default(),
                    base_url: row.get(7)?,
                    api_key_setting: row.get(8)?,
                },
                chat_model: row
                    .get::<String>(9)?
                    .filter(|model| !model.trim().is_empty()),
                template: row
                    .get::<String>(10)?
                    .unwrap_or_else(|| DEFAULT_TEMPLATE.to_string()),
                context_budget: row.get::<i32>(11)?.unwrap_or(3000).max(100) as usize,
                max_answer_tokens: row.get::<i32>(12)?.unwrap_or(1024).max(16) as u32,
            });
        }
        Ok::<_, pgrx::spi::Error>(found)
    });
    match loaded {
        Ok(Some(collection)) => collection,
        Ok(None) => raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            format!("collection \"{name}\" does not exist"),
            "",
        ),
        Err(error) => raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("reading collection \"{name}\": {error}"),
            "",
        ),
    }
}

fn retrieve(
    collection: &Collection,
    vector: &str,
    k: i32,
    max_distance: f64,
) -> Vec<RetrievedChunk> {
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT * FROM rag._retrieve_context($1, $2, $3, $4)",
            None,
            &[
                collection.id.into(),
                vector.into(),
                k.into(),
                max_distance.into(),
            ],
        )?;
        let mut chunks = Vec::new();
        for row in rows {
            chunks.push(RetrievedChunk {
                chunk_id: row.get(1)?.unwrap_or_default(),
                document_id: row.get(2)?.unwrap_or_default(),
                title: row.get(3)?.unwrap_or_default(),
                ordinal: row.get(4)?.unwrap_or_default(),
                char_start: row.get::<i32>(5)?.unwrap_or_default() as i64,
                char_end: row.get::<i32>(6)?.unwrap_or_default() as i64,
                text: row.get(7)?.unwrap_or_default(),
                distance: row.get(8)?,
                anchor_chunk_id: row.get(9)?,
                locator: row.get(10)?,
            });
        }
        Ok::<_, pgrx::spi::Error>(chunks)
    })
    .unwrap_or_else(|error| {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("retrieval failed: {error}"),
            "",
        )
    })
}

/// The sources that would be sent for `question`: anchors within the ceiling, their neighbours, the budget.
struct Context {
    sources: Vec<Source>,
    nearest: Option<f64>,
    embed_tokens: Option<i64>,
    embed_ms: f64,
    search_ms: f64,
}

fn build_context(
    collection: &Collection,
    question: &str,
    k: i32,
    max_distance: Option<f64>,
) -> Context {
    if !(1..=100).contains(&k) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("k must be between 1 and 100, not {k}"),
            "k is how many nearest chunks are considered.",
        );
    }
    let ceiling = max_distance.unwrap_or(collection.max_distance);
    let started = Instant::now();
    // Read-only SPI: pgrx's mutating calls take a transaction id, which a hot standby cannot give.
    let has_vectors = Spi::connect(|client| {
        client
            .select(
                "SELECT dimensions IS NOT NULL FROM rag.collections WHERE id = $1",
                Some(1),
                &[collection.id.into()],
            )?
            .first()
            .get_one::<bool>()
    })
    .ok()
    .flatten()
    .unwrap_or(false);
    if !has_vectors {
        return Context {
            sources: Vec::new(),
            nearest: None,
            embed_tokens: None,
            embed_ms: 0.0,
            search_ms: 0.0,
        };
    }
    let embedding = embed_question(collection.id, question);
    let embed_ms = started.elapsed().as_secs_f64() * 1000.0;
    let searched = Instant::now();
    let chunks = retrieve(collection, &embedding.literal, k, ceiling);
    let search_ms = searched.elapsed().as_secs_f64() * 1000.0;
    let nearest = chunks
        .iter()
        .filter_map(|chunk| chunk.distance)
        .reduce(f64::min);
    let close: Vec<i64> = chunks
        .iter()
        .filter(|chunk| chunk.distance.is_some_and(|distance| distance <= ceiling))
        .map(|chunk| chunk.chunk_id)
        .collect();
    let kept: Vec<RetrievedChunk> = chunks
        .into_iter()
        .filter(|chunk| {
            close.contains(&chunk.chunk_id)
                || chunk
                    .anchor_chunk_id
                    .is_some_and(|anchor| close.contains(&anchor))
        })
        .collect();
    let assembled = assemble_sources(&kept, collection.context_budget);
    Context {
        sources: assembled.sources,
        nearest,
        embed_tokens: embedding.prompt_tokens,
        embed_ms,
        search_ms,
    }
}

fn sources_json(sources: &[Source]) -> serde_json::Value {
    serde_json::Value::Array(
        sources
            .iter()
            .map(|source| {
                json!({
                    "n": source.number,
                    "document_id": source.document_id,
                    "title": source.title,
                    "locator": source.locator(),
                    "chunk_ids": source.chunk_ids,
                    "distance": source.distance,
                    "text": source.text,
                })
            })
            .collect(),
    )
}

fn citations_json(sources: &[Source], kept: &[usize]) -> serde_json::Value {
    let cited: Vec<&Source> = kept
        .iter()
        .filter_map(|number| sources.iter().find(|source| source.number == *number))
        .collect();
    // Documents made from watched rows name their table and row, so applications can join back to them.
    let ids: Vec<i64> = cited.iter().map(|source| source.document_id).collect();
    let origins: Vec<(i64, Option<String>, Option<JsonB>)> = Spi::connect(|client| {
        let rows = client.select(
            "SELECT id, source, source_key FROM rag.documents WHERE id = ANY($1)",
            None,
            &[ids.into()],
        )?;
        let mut origins = Vec::new();
        for row in rows {
            origins.push((
                row.get::<i64>(1)?.unwrap_or_default(),
                row.get::<String>(2)?,
                row.get::<JsonB>(3)?,
            ));
        }
        Ok::<_, pgrx::spi::Error>(origins)
    })
    .unwrap_or_default();
    serde_json::Value::Array(
        cited
            .into_iter()
            .map(|source| {
                let origin = origins.iter().find(|(id, _, _)| *id == source.document_id);
                json!({
                    "n": source.number,
                    "document_id": source.document_id,
                    "title": source.title,
                    "locator": source.locator(),
                    "chunk_ids": source.chunk_ids,
                    "source": origin.and_then(|(_, source, _)| source.clone()),
                    "source_key": origin.and_then(|(_, _, key)| key.as_ref().map(|JsonB(value)| value.clone())),
                })
            })
            .collect(),
    )
}

fn require_question(question: &str) {
    if question.trim().is_empty() {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "the question is empty",
            "Pass the question to answer.",
        );
    }
}

/// The prompt `rag_ask` would send, and its numbered sources.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
pub fn rag_prompt(
    collection: &str,
    question: &str,
    k: default!(i32, 5),
    max_distance: default!(Option<f64>, "NULL"),
) -> TableIterator<'static, (name!(prompt, Option<String>), name!(sources, JsonB))> {
    require_question(question);
    let collection = load_collection(collection);
    let context = build_context(&collection, question, k, max_distance);
    let prompt = if context.sources.is_empty() {
        None
    } else {
        Some(
            render_prompt(&collection.template, &context.sources, question).unwrap_or_else(
                |error| {
                    raise(
                        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                        error.to_string(),
                        "Fix the collection's prompt_template.",
                    )
                },
            ),
        )
    };
    TableIterator::once((prompt, JsonB(sources_json(&context.sources))))
}

#[derive(Default)]
struct Outcome {
    outcome: &'static str,
    answer: Option<String>,
    citations: serde_json::Value,
    stripped: i32,
    reason: Option<String>,
    prompt_tokens: Option<i64>,
    completion_tokens: Option<i64>,
    chat_calls: i32,
    generate_ms: Option<f64>,
}

impl Outcome {
    fn refused(reason: impl Into<String>) -> Outcome {
        Outcome {
            outcome: "refused",
            reason: Some(reason.into()),
            citations: json!([]),
            ..Outcome::default()
        }
    }
    fn failed(reason: impl Into<String>) -> Outcome {
        Outcome {
            outcome: "failed",
            reason: Some(reason.into()),
            citations: json!([]),
            ..Outcome::default()
        }
    }
}

fn interrupt() -> impl FnMut() -> bool {
    || {
        pgrx::check_for_interrupts!();
        false
    }
}

fn add(total: Option<i64>, more: Option<i64>) -> Option<i64> {
    match (total, more) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

fn answer_with_model(
    collection: &Collection,
    model: &str,
    question: &str,
    sources: &[Source],
) -> Outcome {
    let prompt = match render_prompt(&collection.template, sources, question) {
        Ok(prompt) => prompt,
        Err(error) => return Outcome::failed(format!("prompt template: {error}")),
    };
    let client = match provider::connect(&collection.chat_provider, crate::settings::http_timeout())
    {
        Ok(client) => client,
        Err(message) => return Outcome::failed(message),
    };
    let schema = answer_json_schema();
    let messages = [ChatMessage::new("user", prompt)];
    let request = ChatRequest {
        model,
        messages: &messages,
        json_schema: Some(&schema),
        max_tokens: Some(collection.max_answer_tokens),
        temperature: Some(0.0),
    };
    let started = Instant::now();
    let reply = client.chat(&request, &mut interrupt());
    let generate_ms = Some(started.elapsed().as_secs_f64() * 1000.0);
    let output = match reply {
        Ok(output) => output,
        Err(ProviderError::Interrupted) => {
            raise(PgSqlErrorCode::ERRCODE_QUERY_CANCELED, "canceled", "")
        }
        Err(error) => {
            return Outcome {
                chat_calls: 1,
                generate_ms,
                ..Outcome::failed(format!(
                    "chat provider \"{}\": {error}",
                    collection.chat_provider.name
                ))
            }
        }
    };
    let usage = |mut outcome: Outcome| {
        outcome.prompt_tokens = output.prompt_tokens;
        outcome.completion_tokens = output.completion_tokens;
        outcome.chat_calls = 1;
        outcome.generate_ms = generate_ms;
        outcome
    };
    let parsed = match parse_model_reply(&output.content) {
        Ok(reply) => reply,
        Err(error) => match output
            .truncated
            .then(|| salvage_truncated_reply(&output.content))
            .flatten()
        {
            Some(reply) => reply,
            None => {
                return usage(Outcome::failed(format!(
                    "the model did not answer in the required JSON: {error}"
                )))
            }
        },
    };
    match ground(&parsed, sources.len()) {
        Grounded::Answered {
            answer,
            kept,
            stripped,
        } => usage(Outcome {
            outcome: "answered",
            answer: Some(if output.truncated {
                mark_truncated(&answer)
            } else {
                answer
            }),
            citations: citations_json(sources, &kept),
            stripped: stripped.len() as i32,
            ..Outcome::default()
        }),
        Grounded::Refused { reason, stripped } => usage(Outcome {
            stripped: stripped.len() as i32,
            ..Outcome::refused(reason)
        }),
    }
}

fn answer_extractively(collection: &Collection, question: &str, sources: &[Source]) -> Outcome {
    // An extract is read, not generated: a few sentences say more than a page of them.
    let budget = (collection.max_answer_tokens as usize * 4).min(700);
    match extractive_answer(question, sources, budget) {
        Some(extract) => Outcome {
            outcome: "answered",
            answer: Some(extract.answer),
            citations: citations_json(sources, &extract.citations),
            ..Outcome::default()
        },
        None => Outcome::refused("No sentence in the retrieved passages matches the question."),
    }
}

struct Conversation {
    id: i64,
    history: Vec<(String, String)>,
}

fn load_conversation(id: i64, collection: &Collection) -> Conversation {
    let history = Spi::connect(|client| {
        let owner = client.select(
            "SELECT collection_id FROM rag._conversation_of_caller($1)",
            Some(1),
            &[id.into()],
        )?;
        let collection_id: Option<i32> = owner.first().get_one()?;
        if collection_id != Some(collection.id) {
            return Ok(None);
        }
        let rows = client.select(
            "SELECT role, coalesce(rewritten_question, content) FROM rag.messages WHERE conversation_id = $1 ORDER BY id",
            None,
            &[id.into()],
        )?;
        let mut history = Vec::new();
        for row in rows {
            history.push((row.get::<String>(1)?.unwrap_or_default(), row.get::<String>(2)?.unwrap_or_default()));
        }
        Ok::<_, pgrx::spi::Error>(Some(history))
    })
    .unwrap_or_else(|error| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("reading conversation {id}: {error}"), ""));
    match history {
        Some(history) => Conversation { id, history },
        None => raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "conversation {id} belongs to another collection than \"{}\"",
                collection.name
            ),
            "Start a conversation per collection with rag_conversation_start(collection).",
        ),
    }
}

/// Turns a follow-up into a standalone question with the chat model; extractive collections, which have none,
/// put the previous question in front of the follow-up so retrieval still sees what "it" was.
fn rewrite_follow_up(
    collection: &Collection,
    history: &[(String, String)],
    question: &str,
) -> (String, Option<i64>, Option<i64>, i32) {
    let Some(model) = collection.chat_model.as_deref() else {
        let previous = history
            .iter()
            .rev()
            .find(|(role, _)| role == "user")
            .map(|(_, text)| text.as_str());
        return (
            previous
                .map(|p| format!("{p} {question}"))
                .unwrap_or_else(|| question.to_string()),
            None,
            None,
            0,
        );
    };
    let Ok(client) = provider::connect(&collection.chat_provider, crate::settings::http_timeout())
    else {
        return (question.to_string(), None, None, 0);
    };
    let messages = [ChatMessage::new("user", rewrite_prompt(history, question))];
    let request = ChatRequest {
        model,
        messages: &messages,
        json_schema: None,
        max_tokens: Some(200),
        temperature: Some(0.0),
    };
    match client.chat(&request, &mut interrupt()) {
        Ok(output) => (
            clean_rewritten_question(&output.content, question),
            output.prompt_tokens,
            output.completion_tokens,
            1,
        ),
        Err(ProviderError::Interrupted) => {
            raise(PgSqlErrorCode::ERRCODE_QUERY_CANCELED, "canceled", "")
        }
        // Without a rewrite the follow-up is still answered, only less well: no reason to fail the question.
        Err(_) => (question.to_string(), None, None, 1),
    }
}

/// Answers a question from the collection with citations checked against what was retrieved, or refuses.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
pub fn rag_ask(
    collection: &str,
    question: &str,
    k: default!(i32, 5),
    conversation: default!(Option<i64>, "NULL"),
    max_distance: default!(Option<f64>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(outcome, String),
        name!(answer, Option<String>),
        name!(citations, JsonB),
        name!(reason, Option<String>),
        name!(nearest_distance, Option<f64>),
        name!(prompt_tokens, Option<i64>),
        name!(completion_tokens, Option<i64>),
        name!(cost_usd, Option<pgrx::AnyNumeric>),
        name!(latency_ms, f64),
        name!(model, String),
        name!(query_id, Option<i64>),
        name!(rewritten_question, Option<String>),
    ),
> {
    let started = Instant::now();
    require_question(question);
    let collection = load_collection(collection);
    if conversation.is_some() {
        // Its messages are written as it goes; a hot standby refuses it with the primary's address.
        Spi::connect(|client| {
            client
                .select(
                    "SELECT rag._refuse_writes_on_standby('a conversation')",
                    None,
                    &[],
                )
                .map(|_| ())
        })
        .unwrap_or_else(|error| {
            raise(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                format!("checking for a standby: {error}"),
                "",
            )
        });
    }
    let conversation = conversation.map(|id| load_conversation(id, &collection));

    let (standalone, mut prompt_tokens, mut completion_tokens, mut chat_calls) = match &conversation
    {
        Some(conversation) if !conversation.history.is_empty() => {
            rewrite_follow_up(&collection, &conversation.history, question)
        }
        _ => (question.to_string(), None, None, 0),
    };
    let rewritten = (standalone != question).then(|| standalone.clone());

    let context = build_context(&collection, &standalone, k, max_distance);
    let model_label = collection
        .chat_model
        .clone()
        .unwrap_or_else(|| "extractive".to_string());
    let mut outcome = if context.sources.is_empty() {
        Outcome::refused(NOTHING_CLOSE)
    } else {
        match collection.chat_model.as_deref() {
            Some(model) => answer_with_model(&collection, model, &standalone, &context.sources),
            None => answer_extractively(&collection, &standalone, &context.sources),
        }
    };
    prompt_tokens = add(prompt_tokens, outcome.prompt_tokens);
    completion_tokens = add(completion_tokens, outcome.completion_tokens);
    chat_calls += outcome.chat_calls;
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    let citations = std::mem::take(&mut outcome.citations);

    let ledger_args: [pgrx::datum::DatumWithOid; 21] = [
        collection.id.into(),
        question.into(),
        rewritten.clone().into(),
        conversation.as_ref().map(|c| c.id).into(),
        outcome.outcome.into(),
        outcome.answer.clone().into(),
        outcome.reason.clone().into(),
        context.nearest.into(),
        (context.sources.len() as i32).into(),
        JsonB(citations.clone()).into(),
        outcome.stripped.into(),
        collection.embedding_model.clone().into(),
        collection.chat_model.clone().into(),
        context.embed_tokens.into(),
        prompt_tokens.into(),
        completion_tokens.into(),
        chat_calls.into(),
        context.embed_ms.into(),
        context.search_ms.into(),
        outcome.generate_ms.into(),
        latency_ms.into(),
    ];
    let cost_args: [pgrx::datum::DatumWithOid; 5] = [
        collection.embedding_model.clone().into(),
        collection.chat_model.clone().into(),
        context.embed_tokens.into(),
        prompt_tokens.into(),
        completion_tokens.into(),
    ];
    const RECORD: &str = "SELECT rag._record_query($1, 'ask', $2, $3, $4, $5, $6, $7, $8, $9,
                                $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)";
    const COST: &str = "SELECT rag._query_cost($1, $2, $3, $4, $5)";
    let recorded = if crate::pg::in_recovery() {
        // A hot standby: _record_query writes the call to the server log and returns NULL. Only read-only SPI
        // is possible here (a mutating pgrx call would ask for a transaction id).
        Spi::connect(|client| {
            let id: Option<i64> = client
                .select(RECORD, Some(1), &ledger_args)?
                .first()
                .get_one()?;
            let cost: Option<pgrx::AnyNumeric> = client
                .select(COST, Some(1), &cost_args)?
                .first()
                .get_one()?;
            Ok::<_, pgrx::spi::Error>((id, cost))
        })
    } else {
        Spi::connect_mut(|client| {
            let id: Option<i64> = client
                .update(RECORD, Some(1), &ledger_args)?
                .first()
                .get_one()?;
            let cost: Option<pgrx::AnyNumeric> = client
                .update(COST, Some(1), &cost_args)?
                .first()
                .get_one()?;
            if let (Some(conversation), Some(id)) = (&conversation, id) {
                client.update(
                    "INSERT INTO rag.messages (conversation_id, role, content, rewritten_question, query_id)
                     VALUES ($1, 'user', $2, $3, $4), ($1, 'assistant', coalesce($5, $6, ''), NULL, $4)",
                    None,
                    &[
                        conversation.id.into(),
                        question.into(),
                        rewritten.clone().into(),
                        id.into(),
                        outcome.answer.clone().into(),
                        outcome.reason.clone().into(),
                    ],
                )?;
            }
            Ok::<_, pgrx::spi::Error>((id, cost))
        })
    };
    let (query_id, cost) = recorded.unwrap_or_else(|error| {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("recording the answer: {error}"),
            "",
        )
    });

    TableIterator::once((
        outcome.outcome.to_string(),
        outcome.answer,
        JsonB(citations),
        outcome.reason,
        context.nearest,
        prompt_tokens,
        completion_tokens,
        cost,
        latency_ms,
        model_label,
        query_id,
        rewritten,
    ))
}
