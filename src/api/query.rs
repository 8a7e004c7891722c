//! The one provider call made inside a user's session: embedding the question. It has a deadline
//! (`rag.http_timeout`) and checks for interrupts while it waits, so query cancellation and
//! `statement_timeout` stop it like any other statement.
use crate::error::{RagError, SpiContext, UnwrapOrRaise};
use crate::provider::{self, ProviderRow};
use pgrx::prelude::*;
use rag_embed::ProviderError;

pub struct QueryEmbedding {
    pub literal: String,
    pub prompt_tokens: Option<i64>,
}

/// The space a question is embedded for: the collection's provider, model, query prefix and dimension, as one
/// read of its row saw them. A search must read the vectors of that same space: between two reads the worker
/// may switch the collection to another model (rag_set_embedding_model), and a question embedded with one
/// model compared with vectors of the other gives distances that mean nothing.
#[derive(Clone)]
pub struct QuerySpace {
    pub collection_id: i32,
    pub provider: ProviderRow,
    pub model: String,
    pub prefix: String,
    pub dimensions: Option<i32>,
}

impl QuerySpace {
    /// The same space: what a search's own read of the collection must still find.
    pub fn same_as(&self, other: &QuerySpace) -> bool {
        self.provider.name == other.provider.name
            && self.model == other.model
            && self.prefix == other.prefix
            && self.dimensions == other.dimensions
    }
}

/// The collection's query space now.
pub fn query_space(collection_id: i32) -> Result<QuerySpace, RagError> {
    let row = Spi::connect(|client| {
        let rows = client.select(
            "SELECT p.name, p.kind, p.base_url, p.api_key_setting, c.embedding_model, c.query_prefix, c.dimensions
               FROM rag.collections c JOIN rag.providers p ON p.name = c.embedding_provider
              WHERE c.id = $1",
            Some(1),
            &[collection_id.into()],
        )?;
        let mut found = None;
        for row in rows {
            found = Some(QuerySpace {
                collection_id,
                provider: ProviderRow {
                    name: row.get::<String>(1)?.unwrap_or_default(),
                    kind: crate::provider::Kind::from_column(&row.get::<String>(2)?.unwrap_or_default()),
                    base_url: row.get::<String>(3)?,
                    api_key_setting: row.get::<String>(4)?,
                },
                model: row.get::<String>(5)?.unwrap_or_default(),
                prefix: row.get::<String>(6)?.unwrap_or_default(),
                dimensions: row.get::<i32>(7)?,
            });
        }
        Ok::<_, pgrx::spi::Error>(found)
    })
    .doing(|| format!("reading collection {collection_id}"))?;
    row.ok_or_else(|| {
        RagError::undefined(
            format!("collection {collection_id} does not exist"),
            "List collections with: SELECT name FROM rag.collections;",
        )
    })
}

pub fn embed_question(collection_id: i32, question: &str) -> Result<QueryEmbedding, RagError> {
    embed_in_space(&query_space(collection_id)?, question, true)
}

/// The question's embedding in `space`, whatever the collection's row says by now. `ledgered`: the call is
/// one a ledger row will account for (rag_query, rag_ask), so a rollback before it is written logs it
/// (`super::ledger_trail`); rag_prompt writes none.
pub fn embed_in_space(
    space: &QuerySpace,
    question: &str,
    ledgered: bool,
) -> Result<QueryEmbedding, RagError> {
    let QuerySpace {
        collection_id,
        provider: provider_row,
        model,
        prefix,
        dimensions,
    } = space.clone();
    let input = format!("{prefix}{question}");
    // SAFETY: reads the session's current role (SET ROLE's), process-global state of this backend.
    let session_role = unsafe { pgrx::pg_sys::GetOuterUserId() };
    let cache_key = (
        session_role,
        provider_row.name.clone(),
        model.clone(),
        input.clone(),
    );
    if let Some(cached) = cached_query(&cache_key, dimensions) {
        return Ok(cached);
    }
    let client = provider::embedder(&provider_row, &model, crate::settings::http_timeout())
        .map_err(|message| RagError::ProviderSetup {
            message,
            hint: "Check the provider with rag_models().".to_string(),
        })?;
    let inputs = vec![input];
    if ledgered && provider_row.kind != crate::provider::Kind::Local {
        super::ledger_trail::call_sent(
            "embedding the question",
            collection_id,
            &provider_row.name,
            &model,
        );
    }
    let output = client
        .embed(&model, &inputs, None, &mut super::on_cancel())
        .map_err(|error| provider_error("embedding", &provider_row.name, &model, error))?;
    let Some(vector) = output.vectors.into_iter().next() else {
        return Err(no_embedding());
    };
    if let Some(expected) = dimensions {
        if vector.len() != expected as usize {
            return Err(RagError::ProviderReply {
                message: format!(
                    "model \"{model}\" returned a {}-dimensional query vector but the collection holds {expected}-dimensional vectors",
                    vector.len()
                ),
                hint: "The collection's model must not change under it; create a new collection for another model."
                    .to_string(),
            });
        }
    }
    let embedding = QueryEmbedding {
        literal: vector_literal(&vector),
        prompt_tokens: output.prompt_tokens,
    };
    remember_query(cache_key, &embedding);
    Ok(embedding)
}

fn no_embedding() -> RagError {
    RagError::ProviderReply {
        message: "the provider returned no embedding".to_string(),
        hint: String::new(),
    }
}

pub fn provider_error(
    what: &'static str,
    provider: &str,
    model: &str,
    error: ProviderError,
) -> RagError {
    RagError::Provider {
        what,
        provider: provider.to_string(),
        model: model.to_string(),
        error,
    }
}

/// Session role, provider, model and prefixed question. The role is part of it: a cached answer costs no
/// tokens, which the ledger shows, and on a pooled connection that switches roles (SET ROLE) another role
/// could tell a question had been asked before.
type QueryKey = (pgrx::pg_sys::Oid, String, String, String);

thread_local! {
    /// Recent question embeddings of this backend: asking the same question again costs no provider call
    /// (and no model run). Small and per process, so it never holds much.
    static QUERY_CACHE: std::cell::RefCell<Vec<(QueryKey, String)>> = const { std::cell::RefCell::new(Vec::new()) };
}
const QUERY_CACHE_ENTRIES: usize = 128;

fn cached_query(key: &QueryKey, dimensions: Option<i32>) -> Option<QueryEmbedding> {
    QUERY_CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        let position = cache.iter().position(|(cached, _)| cached == key)?;
        let entry = cache.remove(position);
        let literal = entry.1.clone();
        cache.push(entry);
        // A collection whose dimension changed meanwhile must not get a vector of the old size.
        let size = literal.matches(',').count() + 1;
        if dimensions.is_some_and(|expected| expected as usize != size) {
            return None;
        }
        Some(QueryEmbedding {
            literal,
            prompt_tokens: Some(0),
        })
    })
}

fn remember_query(key: QueryKey, embedding: &QueryEmbedding) {
    QUERY_CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        cache.retain(|(cached, _)| cached != &key);
        if cache.len() >= QUERY_CACHE_ENTRIES {
            cache.remove(0);
        }
        cache.push((key, embedding.literal.clone()));
    });
}

pub fn vector_literal(vector: &[f32]) -> String {
    let mut literal = String::with_capacity(vector.len() * 12 + 2);
    literal.push('[');
    for (index, value) in vector.iter().enumerate() {
        if index > 0 {
            literal.push(',');
        }
        literal.push_str(&value.to_string());
    }
    literal.push(']');
    literal
}

#[pg_schema]
pub mod rag {
    use super::*;

    /// Local model facts for SQL validation: the model's window in tokens (0 when the model is missing).
    #[pg_extern(volatile, parallel_unsafe, name = "_local_model_window")]
    pub fn local_model_window(model: &str) -> i32 {
        loaded_local_model(model).max_tokens() as i32
    }

    fn loaded_local_model(model: &str) -> &'static rag_embed_local::LocalModel {
        crate::provider::local_model(model).unwrap_or_else(|message| {
            RagError::MissingFile {
                message,
                hint: "Run scripts/fetch-model, or point rag.model_path at a directory holding the model."
                    .to_string(),
            }
            .raise()
        })
    }

    /// Refuses prefixes that leave a local model too little of its window: the query prefix goes in front of
    /// every question, the document prefix in front of every chunk, and one as long as the window made every
    /// search fail with "input too long" (review of session 35), a reader's short question included. Each may
    /// take at most half the window.
    #[pg_extern(volatile, parallel_unsafe, name = "_require_local_prefixes_fit")]
    pub fn require_local_prefixes_fit(
        model: &str,
        document_prefix: Option<&str>,
        query_prefix: Option<&str>,
    ) {
        let local = loaded_local_model(model);
        let window = local.max_tokens();
        for (name, prefix) in [
            ("document_prefix", document_prefix),
            ("query_prefix", query_prefix),
        ] {
            let Some(prefix) = prefix.filter(|prefix| !prefix.is_empty()) else {
                continue;
            };
            // Prefixes are at most rag's prefix limit (1 kB), far below what the tokenizer refuses by size.
            let tokens = local.count_tokens(prefix).unwrap_or(usize::MAX);
            if tokens > window / 2 {
                RagError::invalid(
                    format!(
                        "{name} takes {} tokens of model \"{model}\"'s window of {window}, more than half of it",
                        if tokens == usize::MAX { "too many".to_string() } else { tokens.to_string() }
                    ),
                    "Shorten it: every question (query_prefix) or chunk (document_prefix) must fit beside it in the model's window.",
                )
                .raise();
            }
        }
    }

    /// Any text's embedding through a provider, as a vector literal (rag_embed() casts it).
    #[pg_extern(volatile, parallel_unsafe, name = "_embed_text")]
    pub fn embed_text(provider_name: &str, model: &str, text: &str) -> String {
        let row = provider::row_or_raise(provider_name);
        let embedded = provider::embedder(&row, model, crate::settings::http_timeout())
            .map_err(RagError::setup)
            .and_then(|client| {
                client
                    .embed(
                        model,
                        &[text.to_string()],
                        None,
                        &mut super::super::on_cancel(),
                    )
                    .map_err(|error| provider_error("embedding", &row.name, model, error))
            })
            .and_then(|output| {
                output
                    .vectors
                    .first()
                    .map(|v| vector_literal(v))
                    .ok_or_else(no_embedding)
            });
        embedded.unwrap_or_raise()
    }

    /// 0.1.0's SQL embeds the question with these two (its rag_query and rag_prompt), between the library's
    /// install and `ALTER EXTENSION rag UPDATE`; this version's SQL uses `_embed_query_in`, which takes the
    /// space the search reads.
    #[pg_extern(volatile, parallel_unsafe, name = "_embed_query")]
    pub fn embed_query(collection_id: i32, question: &str) -> String {
        embed_question(collection_id, question)
            .unwrap_or_raise()
            .literal
    }

    /// See `_embed_query`.
    #[pg_extern(volatile, parallel_unsafe, name = "_embed_query_usage")]
    pub fn embed_query_usage(
        collection_id: i32,
        question: &str,
    ) -> TableIterator<'static, (name!(vector, String), name!(prompt_tokens, Option<i64>))> {
        let embedding = embed_question(collection_id, question).unwrap_or_raise();
        TableIterator::once((embedding.literal, embedding.prompt_tokens))
    }

    /// The question's embedding in the space the caller read from the collection's row (rag_query reads it
    /// once and searches that row's vector column), with the provider-reported token count for the ledger.
    #[pg_extern(volatile, parallel_unsafe, name = "_embed_query_in")]
    pub fn embed_query_in(
        collection_id: i32,
        question: &str,
        provider_name: &str,
        model: &str,
        prefix: &str,
        dimensions: Option<i32>,
    ) -> TableIterator<'static, (name!(vector, String), name!(prompt_tokens, Option<i64>))> {
        let space = QuerySpace {
            collection_id,
            provider: provider::row_or_raise(provider_name),
            model: model.to_string(),
            prefix: prefix.to_string(),
            dimensions,
        };
        let embedding = embed_in_space(&space, question, true).unwrap_or_raise();
        TableIterator::once((embedding.literal, embedding.prompt_tokens))
    }
}
