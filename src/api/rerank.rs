//! Reranking inside the user's session: a cross-encoder run in this process rescores the candidates of
//! rag._search (which calls `rag._rerank`), so every search path that reranks does it the same way.
use crate::error::{RagError, SpiContext, UnwrapOrRaise};
use crate::provider::{Kind, ProviderRow};
use pgrx::prelude::*;

fn missing_model(message: String) -> RagError {
    RagError::MissingFile {
        message,
        hint: "Run scripts/fetch-model, which installs ms-marco-MiniLM-L-12-v2 under rag.model_path, or turn \
               reranking off with rag_set_reranker(collection, NULL)."
            .to_string(),
    }
}

/// The collection's reranker model and the provider that runs it.
fn collection_reranker(collection_id: i32) -> Result<Option<(String, ProviderRow)>, RagError> {
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT c.reranker, p.name, p.kind, p.base_url, p.api_key_setting
               FROM rag.collections c JOIN rag.providers p ON p.name = c.reranker_provider
              WHERE c.id = $1 AND c.reranker IS NOT NULL",
            Some(1),
            &[collection_id.into()],
        )?;
        let mut found = None;
        for row in rows {
            found = Some((
                row.get::<String>(1)?.unwrap_or_default(),
                ProviderRow {
                    name: row.get::<String>(2)?.unwrap_or_default(),
                    kind: Kind::from_column(&row.get::<String>(3)?.unwrap_or_default()),
                    base_url: row.get::<String>(4)?,
                    api_key_setting: row.get::<String>(5)?,
                },
            ));
        }
        Ok::<_, pgrx::spi::Error>(found)
    })
    .doing(|| format!("reading the reranker of collection {collection_id}"))
}

/// Scores through a server's `/rerank`, under the same deadline and cancellation as an embedding call.
fn rerank_on_server(
    row: &ProviderRow,
    model: &str,
    question: &str,
    texts: &[String],
) -> Result<Vec<f32>, RagError> {
    let client =
        crate::provider::connect(row, crate::settings::http_timeout()).map_err(|message| {
            RagError::ProviderSetup {
                message,
                hint: "Check the reranker's provider with rag_models().".to_string(),
            }
        })?;
    client
        .rerank(model, question, texts, &mut super::on_cancel())
        .map_err(|error| RagError::Provider {
            what: "reranking",
            provider: row.name.clone(),
            model: model.to_string(),
            error,
        })
}

/// The relevance logit of each passage for the question, by the collection's reranker. Passages that are
/// NULL score as the empty text.
fn rerank(
    collection_id: i32,
    question: &str,
    passages: &[Option<String>],
) -> Result<Vec<f32>, RagError> {
    let Some((model, provider_row)) = collection_reranker(collection_id)? else {
        return Err(RagError::invalid(
            format!("collection {collection_id} has no reranker"),
            "rag_set_reranker(collection, 'ms-marco-MiniLM-L-12-v2') turns reranking on.",
        ));
    };
    if provider_row.kind != Kind::Local {
        let texts: Vec<String> = passages
            .iter()
            .map(|passage| passage.clone().unwrap_or_default())
            .collect();
        super::ledger_trail::call_sent("reranking", collection_id, &provider_row.name, &model);
        return rerank_on_server(&provider_row, &model, question, &texts);
    }
    let reranker = crate::provider::local_reranker(&model).map_err(missing_model)?;
    let texts: Vec<&str> = passages
        .iter()
        .map(|passage| passage.as_deref().unwrap_or(""))
        .collect();
    let scored = reranker
        .score_interruptible(question, &texts, &mut super::on_cancel())
        .map_err(|error| RagError::Provider {
            what: "reranking",
            provider: "local".to_string(),
            model: model.clone(),
            error: match error {
                rag_embed_local::LocalModelError::Interrupted => {
                    rag_embed::ProviderError::Interrupted
                }
                error => rag_embed::ProviderError::Permanent {
                    status: None,
                    message: error.to_string(),
                },
            },
        })?;
    Ok(scored.scores)
}

#[pg_schema]
pub mod rag {
    use super::*;

    /// Relevance of each passage to the question by the collection's reranker, in passage order.
    #[pg_extern(volatile, parallel_unsafe, name = "_rerank")]
    pub fn rerank(collection_id: i32, question: &str, passages: Vec<Option<String>>) -> Vec<f32> {
        super::rerank(collection_id, question, &passages).unwrap_or_raise()
    }

    /// Loads the named reranker (or raises why it cannot be): what rag_set_reranker and rag_create_collection
    /// check before a collection names it.
    #[pg_extern(volatile, parallel_unsafe, name = "_check_reranker")]
    pub fn check_reranker(model: &str) -> bool {
        crate::provider::local_reranker(model)
            .map(|_| true)
            .map_err(missing_model)
            .unwrap_or_raise()
    }

    /// Whether the named reranker is installed under rag.model_path (without loading it).
    #[pg_extern(volatile, parallel_unsafe, name = "_reranker_installed")]
    pub fn reranker_installed(model: &str) -> bool {
        crate::provider::model_directory(model)
            .map(|directory| directory.join(rag_embed_local::WEIGHTS_FILE).is_file())
            .unwrap_or(false)
    }
}
