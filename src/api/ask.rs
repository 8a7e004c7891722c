//! `rag_prompt()` and `rag_ask()`: retrieval, prompt assembly, the chat call and the grounding check. The
//! decisions (which sources, what the prompt says, which citations survive) are pure functions in
//! `crates/answer`; this module fetches, calls and records.
use super::query::{embed_in_space, query_space, QuerySpace};
use super::require_writable;
use crate::error::{not_null, RagError, SpiContext, UnwrapOrRaise};
use crate::limits;
use crate::provider::{self, ProviderRow};
use pgrx::prelude::*;
use pgrx::JsonB;
use rag_answer::{
    answer_json_schema, assemble_sources, clean_rewritten_question, extractive_answer,
    extractive_answer_or_lead, ground, mark_truncated, parse_model_reply, render_prompt,
    rewrite_prompt, salvage_truncated_reply, Grounded, RetrievedChunk, Source, DEFAULT_TEMPLATE,
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
    has_vectors: bool,
    chat_provider: ProviderRow,
    chat_model: Option<String>,
    template: String,
    context_budget: usize,
    max_answer_tokens: u32,
    /// rag.collections.watches_ended read here, before the search: the ledger row keeps it (schema.sql).
    watches_ended: i32,
}

/// The collection by name, for a caller holding the read privilege on it (rag._collection_id checks).
fn load_collection(name: &str) -> Result<Collection, RagError> {
    let loaded = Spi::connect(|client| {
        let rows = client.select(
            "SELECT c.id, c.name, c.embedding_model, p.name, p.kind, p.base_url, p.api_key_setting,
                    c.chat_model, c.prompt_template, c.context_budget, c.max_answer_tokens, c.dimensions IS NOT NULL,
                    c.watches_ended
               FROM rag.collections c JOIN rag.providers p ON p.name = c.chat_provider
              WHERE c.id = rag._collection_id($1)",
            Some(1),
            &[name.into()],
        )?;
        let mut found = Vec::new();
        for row in rows {
            found.push((
                row.get::<i32>(1)?,
                row.get::<String>(2)?,
                row.get::<String>(3)?,
                row.get::<String>(4)?,
                row.get::<String>(5)?,
                row.get::<String>(6)?,
                row.get::<String>(7)?,
                row.get::<String>(8)?,
                row.get::<String>(9)?,
                row.get::<i32>(10)?,
                row.get::<i32>(11)?,
                row.get::<bool>(12)?,
                row.get::<i32>(13)?,
            ));
        }
        Ok::<_, pgrx::spi::Error>(found)
    })
    .doing(|| format!("reading collection \"{name}\""))?;
    let Some(row) = loaded.into_iter().next() else {
        return Err(RagError::undefined(
            format!("collection \"{name}\" does not exist"),
            "",
        ));
    };
    let (
        id,
        found_name,
        embedding_model,
        provider_name,
        kind,
        base_url,
        key,
        chat_model,
        template,
        context_budget,
        max_answer_tokens,
        has_vectors,
        watches_ended,
    ) = row;
    Ok(Collection {
        id: not_null(id, "collections.id")?,
        name: not_null(found_name, "collections.name")?,
        embedding_model: not_null(embedding_model, "collections.embedding_model")?,
        has_vectors: not_null(has_vectors, "collections.dimensions IS NOT NULL")?,
        chat_provider: ProviderRow {
            name: not_null(provider_name, "providers.name")?,
            kind: provider::Kind::from_column(&not_null(kind, "providers.kind")?),
            base_url,
            api_key_setting: key,
        },
        chat_model: chat_model.filter(|model| !model.trim().is_empty()),
        // NULL means the built-in template; the column allows it on purpose.
        template: template.unwrap_or_else(|| DEFAULT_TEMPLATE.to_string()),
        context_budget: not_null(context_budget, "collections.context_budget")? as usize,
        max_answer_tokens: not_null(max_answer_tokens, "collections.max_answer_tokens")? as u32,
        watches_ended: not_null(watches_ended, "collections.watches_ended")?,
    })
}

/// A chunk from rag._retrieve_context, with what the refusal threshold (rag._close_enough) decided for anchors.
struct Retrieved {
    chunk: RetrievedChunk,
    relevance: Option<f32>,
    close: bool,
}

/// The anchors and their neighbours through rag._retrieve_context (which searches through rag._search, in the
/// collection's mode: the question's text goes along for the full-text side).
fn retrieve(
    space: &QuerySpace,
    vector: &str,
    question: &str,
    k: i32,
    max_distance: Option<f64>,
) -> Result<Vec<Retrieved>, RagError> {
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT * FROM rag._retrieve_context($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            None,
            &[
                space.collection_id.into(),
                space.provider.name.as_str().into(),
                space.model.as_str().into(),
                space.prefix.as_str().into(),
                space.dimensions.into(),
                vector.into(),
                k.into(),
                max_distance.into(),
                question.into(),
            ],
        )?;
        let mut chunks = Vec::new();
        for row in rows {
            let relevance: Option<f32> = row.get(11)?;
            let close: Option<bool> = row.get(13)?;
            let chunk = RetrievedChunk {
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
                rank: row.get(12)?,
            };
            chunks.push(Retrieved {
                chunk,
                relevance,
                close: close.unwrap_or(false),
            });
        }
        Ok::<_, pgrx::spi::Error>(chunks)
    })
    .doing(|| format!("searching collection {}", space.collection_id))
}

/// The sources that would be sent for `question`: anchors within the ceiling, their neighbours, the budget.
struct Context {
    sources: Vec<Source>,
    nearest: Option<f64>,
    /// The reranker's best relevance among the anchors; None when the collection does not rerank.
    best_relevance: Option<f32>,
    embed_tokens: Option<i64>,
    embed_ms: f64,
    search_ms: f64,
}

fn build_context(
    collection: &Collection,
    question: &str,
    k: i32,
    max_distance: Option<f64>,
    ledgered: bool,
) -> Result<Context, RagError> {
    if !(limits::SEARCH_K_MIN..=limits::SEARCH_K_MAX).contains(&k) {
        return Err(RagError::invalid(
            format!(
                "k must be between {} and {}, not {k}",
                limits::SEARCH_K_MIN,
                limits::SEARCH_K_MAX
            ),
            "k is how many nearest chunks are considered.",
        ));
    }
    if max_distance.is_some_and(|ceiling| ceiling.is_nan() || ceiling < 0.0) {
        return Err(RagError::invalid(
            format!(
                "max_distance must be a cosine distance of 0 or more, not {}",
                max_distance.unwrap_or_default()
            ),
            "NULL keeps the collection's ceiling; 2 or more lets every distance through.",
        ));
    }
    if !collection.has_vectors {
        return Ok(Context {
            sources: Vec::new(),
            nearest: None,
            best_relevance: None,
            embed_tokens: None,
            embed_ms: 0.0,
            search_ms: 0.0,
        });
    }
    // The question is embedded in the collection's space as read now, and the search finds nothing if the
    // collection has switched to another model since (rag._retrieve_context): then it is embedded again in the
    // new space. A switch is one transaction and rare; three tries outlast any sequence of them a test makes.
    let mut space = query_space(collection.id)?;
    let mut embed_ms = 0.0;
    let mut search_ms = 0.0;
    let mut embed_tokens = None;
    let mut tries = 0;
    let retrieved = loop {
        tries += 1;
        let started = Instant::now();
        let embedding = embed_in_space(&space, question, ledgered)?;
        embed_ms += started.elapsed().as_secs_f64() * 1000.0;
        embed_tokens = add(embed_tokens, embedding.prompt_tokens);
        let searched = Instant::now();
        let retrieved = retrieve(&space, &embedding.literal, question, k, max_distance)?;
        search_ms += searched.elapsed().as_secs_f64() * 1000.0;
        if !retrieved.is_empty() || tries == 3 {
            break retrieved;
        }
        let now = query_space(collection.id)?;
        if now.same_as(&space) {
            break retrieved;
        }
        space = now;
    };
    let nearest = retrieved
        .iter()
        .filter_map(|found| found.chunk.distance)
        .reduce(f64::min);
    let best_relevance = retrieved
        .iter()
        .filter_map(|found| found.relevance)
        .reduce(f32::max);
    // Neighbours come back only for anchors that passed; anchors that did not are the ledger's only.
    let kept: Vec<RetrievedChunk> = retrieved
        .into_iter()
        .filter(|found| found.close || found.chunk.anchor_chunk_id.is_some())
        .map(|found| found.chunk)
        .collect();
    let assembled = assemble_sources(&kept, collection.context_budget);
    Ok(Context {
        sources: assembled.sources,
        nearest,
        best_relevance,
        embed_tokens,
        embed_ms,
        search_ms,
    })
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

fn citations_json(sources: &[Source], kept: &[usize]) -> Result<serde_json::Value, RagError> {
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
    .doing(|| "reading where the cited documents came from".to_string())?;
    Ok(serde_json::Value::Array(
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
    ))
}

fn require_question(question: &str) -> Result<(), RagError> {
    if question.trim().is_empty() {
        return Err(RagError::invalid(
            "the question is empty",
            "Pass the question to answer.",
        ));
    }
    let limit = crate::limits::QUESTION_MAX_BYTES as usize;
    if question.len() > limit {
        return Err(RagError::invalid(
            format!(
                "the question is {} bytes; at most {limit} are allowed",
                question.len()
            ),
            "Ask a question; to work with a long text, ingest it and ask about it.",
        ));
    }
    Ok(())
}

/// The prompt `rag_ask` would send, and its numbered sources.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
pub fn rag_prompt(
    collection: Option<&str>,
    question: Option<&str>,
    k: default!(Option<i32>, 5),
    max_distance: default!(Option<f64>, "NULL"),
) -> TableIterator<'static, (name!(prompt, Option<String>), name!(sources, JsonB))> {
    let (collection, question, k) = required_arguments(collection, question, k).unwrap_or_raise();
    let prompted = require_question(question)
        .and_then(|()| load_collection(collection))
        .and_then(|collection| {
            let context = super::ledger_trail::not_ledgered(|| {
                build_context(&collection, question, k, max_distance, false)
            })?;
            let prompt = if context.sources.is_empty() {
                None
            } else {
                Some(
                    render_prompt(&collection.template, &context.sources, question).map_err(
                        |error| {
                            RagError::invalid(
                                error.to_string(),
                                "Fix the collection's prompt_template.",
                            )
                        },
                    )?,
                )
            };
            Ok((prompt, JsonB(sources_json(&context.sources))))
        });
    TableIterator::once(prompted.unwrap_or_raise())
}

/// What became of a question: the `outcome` column of rag_ask and of the ledger.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum AskOutcome {
    Answered,
    #[default]
    Refused,
    Failed,
}

impl AskOutcome {
    fn as_str(self) -> &'static str {
        match self {
            AskOutcome::Answered => "answered",
            AskOutcome::Refused => "refused",
            AskOutcome::Failed => "failed",
        }
    }
}

/// The answer (or refusal) to one question and what producing it cost.
#[derive(Default)]
struct Answer {
    outcome: AskOutcome,
    answer: Option<String>,
    citations: serde_json::Value,
    stripped: i32,
    reason: Option<String>,
    prompt_tokens: Option<i64>,
    completion_tokens: Option<i64>,
    chat_calls: i32,
    generate_ms: Option<f64>,
}

impl Answer {
    fn refused(reason: impl Into<String>) -> Answer {
        Answer {
            outcome: AskOutcome::Refused,
            reason: Some(reason.into()),
            citations: json!([]),
            ..Answer::default()
        }
    }
    fn failed(reason: impl Into<String>) -> Answer {
        Answer {
            outcome: AskOutcome::Failed,
            reason: Some(reason.into()),
            citations: json!([]),
            ..Answer::default()
        }
    }
}

fn add(total: Option<i64>, more: Option<i64>) -> Option<i64> {
    match (total, more) {
        (None, None) => None,
        // The provider's counts are bounded where they are read (rag_embed::validate); saturating all the same.
        (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
    }
}

fn answer_with_model(
    collection: &Collection,
    model: &str,
    question: &str,
    sources: &[Source],
) -> Result<Answer, RagError> {
    let prompt = match render_prompt(&collection.template, sources, question) {
        Ok(prompt) => prompt,
        Err(error) => return Ok(Answer::failed(format!("prompt template: {error}"))),
    };
    let client = match provider::connect(&collection.chat_provider, crate::settings::http_timeout())
    {
        Ok(client) => client,
        Err(message) => return Ok(Answer::failed(message)),
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
    super::ledger_trail::call_sent(
        "answering",
        collection.id,
        &collection.chat_provider.name,
        model,
    );
    let reply = client.chat(&request, &mut super::on_cancel());
    let generate_ms = Some(started.elapsed().as_secs_f64() * 1000.0);
    let output = match reply {
        Ok(output) => output,
        Err(error @ ProviderError::Interrupted) => {
            return Err(super::query::provider_error(
                "chat",
                &collection.chat_provider.name,
                model,
                error,
            ))
        }
        Err(error) => {
            return Ok(Answer {
                chat_calls: 1,
                generate_ms,
                ..Answer::failed(format!(
                    "chat provider \"{}\": {error}",
                    collection.chat_provider.name
                ))
            })
        }
    };
    let usage = |mut answer: Answer| {
        answer.prompt_tokens = output.prompt_tokens;
        answer.completion_tokens = output.completion_tokens;
        answer.chat_calls = 1;
        answer.generate_ms = generate_ms;
        answer
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
                return Ok(usage(Answer::failed(format!(
                    "the model did not answer in the required JSON: {error}"
                ))))
            }
        },
    };
    Ok(match ground(&parsed, sources.len()) {
        Grounded::Answered {
            answer,
            kept,
            stripped,
        } => usage(Answer {
            outcome: AskOutcome::Answered,
            answer: Some(if output.truncated {
                mark_truncated(&answer)
            } else {
                answer
            }),
            citations: citations_json(sources, &kept)?,
            stripped: stripped.len() as i32,
            ..Answer::default()
        }),
        Grounded::Refused { reason, stripped } => usage(Answer {
            stripped: stripped.len() as i32,
            ..Answer::refused(reason)
        }),
    })
}

fn answer_extractively(
    collection: &Collection,
    question: &str,
    sources: &[Source],
    reranked: bool,
) -> Result<Answer, RagError> {
    // An extract is read, not generated: a few sentences say more than a page of them.
    let budget = (collection.max_answer_tokens as usize * limits::CHARS_PER_TOKEN)
        .min(limits::EXTRACTIVE_ANSWER_MAX_CHARS);
    // Sources a reranker passed are relevant whatever words they share with the question: a paraphrase gets
    // the lead of the most relevant one rather than a refusal for want of a shared word.
    let extract = if reranked {
        extractive_answer_or_lead(question, sources, budget)
    } else {
        extractive_answer(question, sources, budget)
    };
    Ok(match extract {
        Some(extract) => Answer {
            outcome: AskOutcome::Answered,
            answer: Some(extract.answer),
            citations: citations_json(sources, &extract.citations)?,
            ..Answer::default()
        },
        None => Answer::refused("No sentence in the retrieved passages matches the question."),
    })
}

struct Conversation {
    id: i64,
    history: Vec<(String, String)>,
}

/// Why a conversation may not be continued by this call.
enum ConversationRefusal {
    NotOwned,
    OtherCollection,
}

fn load_conversation(id: i64, collection: &Collection) -> Result<Conversation, RagError> {
    let history = Spi::connect(|client| {
        // An admin of the collection may read another role's conversation (rag._conversation_of_caller), but
        // only its owner adds to it: an answer asked into it would be written into the owner's history, and
        // rewrite the owner's next questions. A superuser too, whose answer draws on rows the owner may not
        // read and which the owner would then read back (red team 26); SET ROLE to the owner continues it as
        // them.
        let found = client.select(
            "SELECT v.collection_id,
                    v.owner_id = r.oid
               FROM rag._conversation_of_caller($1) v, pg_catalog.pg_roles r
              WHERE r.rolname = rag._calling_role()",
            Some(1),
            &[id.into()],
        )?;
        let (collection_id, owned): (Option<i32>, Option<bool>) = found.first().get_two()?;
        if owned != Some(true) {
            return Ok(Err(ConversationRefusal::NotOwned));
        }
        if collection_id != Some(collection.id) {
            return Ok(Err(ConversationRefusal::OtherCollection));
        }
        // Only the last messages are used (the rewrite's window): a long conversation is not read whole on
        // every turn.
        let rows = client.select(
            "SELECT m.role, m.said FROM (SELECT id, role, coalesce(rewritten_question, content) AS said
                                          FROM rag.messages WHERE conversation_id = $1
                                         ORDER BY id DESC LIMIT $2) m
              ORDER BY m.id",
            None,
            &[id.into(), (rag_answer::REWRITE_HISTORY_MESSAGES as i64).into()],
        )?;
        let mut history = Vec::new();
        for row in rows {
            history.push((row.get::<String>(1)?.unwrap_or_default(), row.get::<String>(2)?.unwrap_or_default()));
        }
        Ok::<_, pgrx::spi::Error>(Ok(history))
    })
    .doing(|| format!("reading conversation {id}"))?;
    match history {
        Ok(history) => Ok(Conversation { id, history }),
        Err(ConversationRefusal::NotOwned) => Err(RagError::InsufficientPrivilege {
            message: format!("conversation {id} is another role's"),
            hint: "An admin of the collection (or a superuser) may read it with rag_conversation, but only its \
                   owner continues it (a superuser may SET ROLE to the owner); start one of your own with \
                   rag_conversation_start."
                .into(),
        }),
        Err(ConversationRefusal::OtherCollection) => Err(RagError::invalid(
            format!(
                "conversation {id} belongs to another collection than \"{}\"",
                collection.name
            ),
            "Start a conversation per collection with rag_conversation_start(collection).",
        )),
    }
}

/// A follow-up made standalone, and what the rewrite cost.
struct Rewrite {
    question: String,
    prompt_tokens: Option<i64>,
    completion_tokens: Option<i64>,
    chat_calls: i32,
}

impl Rewrite {
    fn unchanged(question: &str, chat_calls: i32) -> Rewrite {
        Rewrite {
            question: question.to_string(),
            prompt_tokens: None,
            completion_tokens: None,
            chat_calls,
        }
    }
}

/// Turns a follow-up into a standalone question with the chat model; extractive collections, which have none,
/// put the previous question in front of the follow-up so retrieval still sees what "it" was.
fn rewrite_follow_up(
    collection: &Collection,
    history: &[(String, String)],
    question: &str,
) -> Result<Rewrite, RagError> {
    let Some(model) = collection.chat_model.as_deref() else {
        let previous = history
            .iter()
            .rev()
            .find(|(role, _)| role == "user")
            .map(|(_, text)| text.as_str());
        let joined = previous
            .map(|p| format!("{p} {question}"))
            .unwrap_or_else(|| question.to_string());
        return Ok(Rewrite::unchanged(&joined, 0));
    };
    // A chat provider that cannot be reached fails the answer itself a moment later, with its reason in the
    // ledger; here the follow-up simply goes on as it was asked.
    let Ok(client) = provider::connect(&collection.chat_provider, crate::settings::http_timeout())
    else {
        return Ok(Rewrite::unchanged(question, 0));
    };
    let messages = [ChatMessage::new("user", rewrite_prompt(history, question))];
    let request = ChatRequest {
        model,
        messages: &messages,
        json_schema: None,
        max_tokens: Some(200),
        temperature: Some(0.0),
    };
    super::ledger_trail::call_sent(
        "rewriting the follow-up",
        collection.id,
        &collection.chat_provider.name,
        model,
    );
    match client.chat(&request, &mut super::on_cancel()) {
        Ok(output) => Ok(Rewrite {
            question: clean_rewritten_question(&output.content, question),
            prompt_tokens: output.prompt_tokens,
            completion_tokens: output.completion_tokens,
            chat_calls: 1,
        }),
        Err(error @ ProviderError::Interrupted) => Err(super::query::provider_error(
            "chat",
            &collection.chat_provider.name,
            model,
            error,
        )),
        // Without a rewrite the follow-up is still answered, only less well: no reason to fail the question.
        Err(_) => Ok(Rewrite::unchanged(question, 1)),
    }
}

/// One row of the ledger, written by rag._record_query with named arguments.
struct LedgerEntry<'a> {
    collection: &'a Collection,
    question: &'a str,
    rewritten: Option<String>,
    conversation_id: Option<i64>,
    answer: &'a Answer,
    citations: &'a serde_json::Value,
    context: &'a Context,
    prompt_tokens: Option<i64>,
    completion_tokens: Option<i64>,
    chat_calls: i32,
    latency_ms: f64,
}

const RECORD_QUERY: &str = "SELECT rag._record_query(
    p_collection_id => $1, p_kind => 'ask', p_question => $2, p_outcome => $3, p_rewritten => $4,
    p_conversation_id => $5, p_answer => $6, p_reason => $7, p_nearest => $8, p_sources_sent => $9,
    p_citations => $10, p_citations_stripped => $11, p_embedding_model => $12, p_chat_model => $13,
    p_embed_tokens => $14, p_prompt_tokens => $15, p_completion_tokens => $16, p_chat_calls => $17,
    p_embed_ms => $18, p_search_ms => $19, p_generate_ms => $20, p_latency_ms => $21,
    p_best_relevance => $22, p_watches_ended => $23)";
const QUERY_COST: &str = "SELECT rag._query_cost($1, $2, $3, $4, $5)";
const RECORD_EXCHANGE: &str = "SELECT rag._record_exchange($1, $2, $3, $4, $5)";

/// Writes the ledger row (and the conversation's two messages); returns its id and the call's cost. On a hot
/// standby rag._record_query writes the call to the server log and returns NULL, and only read-only SPI is
/// possible (a mutating pgrx call would ask for a transaction id).
fn record(entry: &LedgerEntry) -> Result<(Option<i64>, Option<pgrx::AnyNumeric>), RagError> {
    let a = entry.answer;
    let c = entry.collection;
    let ledger_args: [pgrx::datum::DatumWithOid; 23] = [
        c.id.into(),
        entry.question.into(),
        a.outcome.as_str().into(),
        entry.rewritten.clone().into(),
        entry.conversation_id.into(),
        a.answer.clone().into(),
        a.reason.clone().into(),
        entry.context.nearest.into(),
        (entry.context.sources.len() as i32).into(),
        JsonB(entry.citations.clone()).into(),
        a.stripped.into(),
        c.embedding_model.clone().into(),
        c.chat_model.clone().into(),
        entry.context.embed_tokens.into(),
        entry.prompt_tokens.into(),
        entry.completion_tokens.into(),
        entry.chat_calls.into(),
        entry.context.embed_ms.into(),
        entry.context.search_ms.into(),
        a.generate_ms.into(),
        entry.latency_ms.into(),
        entry.context.best_relevance.into(),
        c.watches_ended.into(),
    ];
    let cost_args: [pgrx::datum::DatumWithOid; 5] = [
        c.embedding_model.clone().into(),
        c.chat_model.clone().into(),
        entry.context.embed_tokens.into(),
        entry.prompt_tokens.into(),
        entry.completion_tokens.into(),
    ];
    let recorded = if crate::pg::in_recovery() {
        Spi::connect(|client| {
            let id: Option<i64> = client
                .select(RECORD_QUERY, Some(1), &ledger_args)?
                .first()
                .get_one()?;
            let cost: Option<pgrx::AnyNumeric> = client
                .select(QUERY_COST, Some(1), &cost_args)?
                .first()
                .get_one()?;
            Ok::<_, pgrx::spi::Error>((id, cost))
        })
    } else {
        Spi::connect_mut(|client| {
            let id: Option<i64> = client
                .update(RECORD_QUERY, Some(1), &ledger_args)?
                .first()
                .get_one()?;
            let cost: Option<pgrx::AnyNumeric> = client
                .update(QUERY_COST, Some(1), &cost_args)?
                .first()
                .get_one()?;
            if let (Some(conversation), Some(id)) = (entry.conversation_id, id) {
                client.update(
                    RECORD_EXCHANGE,
                    None,
                    &[
                        conversation.into(),
                        entry.question.into(),
                        entry.rewritten.clone().into(),
                        id.into(),
                        a.answer.clone().or_else(|| a.reason.clone()).into(),
                    ],
                )?;
            }
            Ok::<_, pgrx::spi::Error>((id, cost))
        })
    };
    recorded.doing(|| "recording the answer".to_string())
}

/// Answers a question from the collection with citations checked against what was retrieved, or refuses.
// The row type is spelled out here because pgrx derives the SQL signature from it.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe, security_definer)]
pub fn rag_ask(
    collection: Option<&str>,
    question: Option<&str>,
    k: default!(Option<i32>, 5),
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
        name!(best_relevance, Option<f32>),
    ),
> {
    let (collection, question, k) = required_arguments(collection, question, k).unwrap_or_raise();
    TableIterator::once(ask(collection, question, k, conversation, max_distance).unwrap_or_raise())
}

/// rag_ask's and rag_prompt's arguments that NULL cannot stand for.
fn required_arguments<'a>(
    collection: Option<&'a str>,
    question: Option<&'a str>,
    k: Option<i32>,
) -> Result<(&'a str, &'a str, i32), RagError> {
    Ok((
        crate::error::required(collection, "collection")?,
        crate::error::required(question, "question")?,
        crate::error::required(k, "k")?,
    ))
}

type AskRow = (
    String,
    Option<String>,
    JsonB,
    Option<String>,
    Option<f64>,
    Option<i64>,
    Option<i64>,
    Option<pgrx::AnyNumeric>,
    f64,
    String,
    Option<i64>,
    Option<String>,
    Option<f32>,
);

fn ask(
    collection: &str,
    question: &str,
    k: i32,
    conversation: Option<i64>,
    max_distance: Option<f64>,
) -> Result<AskRow, RagError> {
    let started = Instant::now();
    require_question(question)?;
    let collection = load_collection(collection)?;
    if conversation.is_some() {
        // Its messages are written as it goes: a hot standby (with the primary's address) and a read-only
        // transaction refuse it before any provider call.
        require_writable("a conversation")?;
    }
    let conversation = conversation
        .map(|id| load_conversation(id, &collection))
        .transpose()?;

    let rewrite = match &conversation {
        Some(conversation) if !conversation.history.is_empty() => {
            rewrite_follow_up(&collection, &conversation.history, question)?
        }
        _ => Rewrite::unchanged(question, 0),
    };
    let rewritten = (rewrite.question != question).then(|| rewrite.question.clone());

    let context = build_context(&collection, &rewrite.question, k, max_distance, true)?;
    let model_label = collection
        .chat_model
        .clone()
        .unwrap_or_else(|| "extractive".to_string());
    let mut answer = if context.sources.is_empty() {
        Answer::refused(NOTHING_CLOSE)
    } else {
        match collection.chat_model.as_deref() {
            Some(model) => {
                answer_with_model(&collection, model, &rewrite.question, &context.sources)?
            }
            None => answer_extractively(
                &collection,
                &rewrite.question,
                &context.sources,
                context.best_relevance.is_some(),
            )?,
        }
    };
    let prompt_tokens = add(rewrite.prompt_tokens, answer.prompt_tokens);
    let completion_tokens = add(rewrite.completion_tokens, answer.completion_tokens);
    let chat_calls = rewrite.chat_calls + answer.chat_calls;
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    let citations = std::mem::take(&mut answer.citations);
    let (query_id, cost) = record(&LedgerEntry {
        collection: &collection,
        question,
        rewritten: rewritten.clone(),
        conversation_id: conversation.as_ref().map(|c| c.id),
        answer: &answer,
        citations: &citations,
        context: &context,
        prompt_tokens,
        completion_tokens,
        chat_calls,
        latency_ms,
    })?;
    Ok((
        answer.outcome.as_str().to_string(),
        answer.answer,
        JsonB(citations),
        answer.reason,
        context.nearest,
        prompt_tokens,
        completion_tokens,
        cost,
        latency_ms,
        model_label,
        query_id,
        rewritten,
        context.best_relevance,
    ))
}
