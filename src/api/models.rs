//! `rag_models()`: what a provider serves (Ollama's /api/tags, OpenAI's /models).
use super::query::provider_error;
use crate::error::{RagError, SpiContext, UnwrapOrRaise};
use crate::provider;
use pgrx::prelude::*;

/// A local model's row of rag_models(): name, size of its weights, modified, family.
type ModelRow = (String, Option<i64>, Option<String>, Option<String>);

// pgrx reads the column names from the literal return type, so it cannot be an alias.
#[allow(clippy::type_complexity)]
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
    // A keyed provider's list is fetched with its key, and shows the account behind it: its creator's to ask.
    // Read-only SPI: `Spi::run_with_args` assigns a transaction id, which a hot standby refuses ("cannot
    // assign TransactionIds during recovery", red team 23), and a primary spent one on every call.
    Spi::connect(|client| {
        client
            .select(
                "SELECT rag._require_direct_use($1)",
                None,
                &[provider.into()],
            )
            .map(|_| ())
    })
    .doing(|| format!("checking provider \"{provider}\""))
    .unwrap_or_raise();
    if row.kind == provider::Kind::Local {
        return TableIterator::new(local_models());
    }
    let models = provider::connect(&row, crate::settings::http_timeout())
        .map_err(RagError::setup)
        .and_then(|client| {
            client
                .list_models(&mut super::on_cancel())
                .map_err(|error| provider_error("embedding", &row.name, "-", error))
        })
        .unwrap_or_raise();
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
fn local_models() -> Vec<ModelRow> {
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

/// The known-models table (`rag_embed::known_models`): what a collection made for each model gets by default.
#[pg_extern(immutable, parallel_safe)]
pub fn rag_known_models() -> TableIterator<
    'static,
    (
        name!(model, String),
        name!(document_prefix, String),
        name!(query_prefix, String),
        name!(pooling, String),
        name!(window_tokens, i32),
        name!(max_distance, Option<f64>),
    ),
> {
    TableIterator::new(rag_embed::known_models::all().iter().map(|known| {
        (
            known.name.to_string(),
            known.prefixes.document.to_string(),
            known.prefixes.query.to_string(),
            known.pooling.as_str().to_string(),
            known.window_tokens as i32,
            known.max_distance,
        )
    }))
}

#[pgrx::pg_schema]
pub mod rag {
    use pgrx::prelude::*;

    /// The prefixes a model expects before documents and before queries (none when the model is unknown),
    /// for rag_create_collection.
    #[pg_extern(immutable, parallel_safe, name = "_model_prefixes")]
    pub fn model_prefixes(
        model: &str,
    ) -> TableIterator<'static, (name!(document_prefix, String), name!(query_prefix, String))> {
        let prefixes = rag_embed::known_models::prefixes_for(model);
        TableIterator::once((prefixes.document.to_string(), prefixes.query.to_string()))
    }

    /// The distance ceiling measured for a known model (NULL otherwise), for rag_create_collection.
    #[pg_extern(immutable, parallel_safe, name = "_model_max_distance")]
    pub fn model_max_distance(model: &str) -> Option<f64> {
        rag_embed::known_models::default_max_distance(model)
    }

    /// Refuses a provider URL that `rag.provider_hosts` does not admit, so that rag_create_provider says so at
    /// once; the HTTP client checks again at every connection, on the addresses it connects to.
    #[pg_extern(stable, parallel_safe, name = "_check_provider_url")]
    pub fn check_provider_url(base_url: &str) {
        let refused = |message: String| -> ! {
            crate::error::RagError::InsufficientPrivilege {
                message,
                hint: "A superuser lists the servers providers may reach in rag.provider_hosts (postgresql.conf or ALTER SYSTEM, then SELECT pg_reload_conf()).".into(),
            }
            .raise()
        };
        let list = crate::provider::provider_hosts().unwrap_or_else(|why| refused(why));
        let Ok(url) = parse_url(base_url) else {
            return; // the SQL checks the URL's shape and say what is wrong with it
        };
        if let Err(why) = list.admit(&url) {
            refused(format!("base_url: {why}"));
        }
    }

    fn parse_url(base_url: &str) -> Result<rag_embed::Url, ()> {
        rag_embed::Url::parse(base_url.trim()).map_err(|_| ())
    }

    /// The tokens a known model reads at most (NULL otherwise), for rag_create_collection.
    #[pg_extern(immutable, parallel_safe, name = "_model_window")]
    pub fn model_window(model: &str) -> Option<i32> {
        rag_embed::known_models::known_model(model).map(|known| known.window_tokens as i32)
    }
}
