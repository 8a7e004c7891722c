//! `rag_models()`: what a provider serves (Ollama's /api/tags, OpenAI's /models).
use super::query::raise_provider_error;
use super::raise;
use crate::provider;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

#[pg_extern(volatile, parallel_unsafe)]
pub fn rag_models(
    provider: default!(&str, "'ollama'"),
) -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(size_bytes, Option<i64>),
        name!(modified_at, Option<String>),
        name!(family, Option<String>),
    ),
> {
    let row = provider::row_or_raise(provider);
    if row.kind == "local" {
        return TableIterator::new(local_models().into_iter());
    }
    let client = provider::connect(&row, crate::settings::http_timeout())
        .unwrap_or_else(|message| raise(PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE, message, ""));
    let mut interrupt = || {
        pgrx::check_for_interrupts!();
        false
    };
    let models = client
        .list_models(&mut interrupt)
        .unwrap_or_else(|error| raise_provider_error(&row.name, "-", &error));
    TableIterator::new(models.into_iter().map(|model| {
        (
            model.name,
            model.size_bytes,
            model.modified_at,
            model.family,
        )
    }))
}

/// Subdirectories of rag.model_path that hold a model, with the size of their weights.
fn local_models() -> Vec<(String, Option<i64>, Option<String>, Option<String>)> {
    let Ok(entries) = std::fs::read_dir(crate::settings::model_path()) else {
        return Vec::new();
    };
    let mut models: Vec<_> = entries
        .flatten()
        .filter(|entry| entry.path().join("config.json").is_file())
        .map(|entry| {
            let weights = std::fs::metadata(entry.path().join("model.safetensors"))
                .ok()
                .map(|m| m.len() as i64);
            (
                entry.file_name().to_string_lossy().into_owned(),
                weights,
                None,
                Some("bert".to_string()),
            )
        })
        .collect();
    models.sort();
    models
}
