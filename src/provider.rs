//! Turns a `rag.providers` row into a client from `rag-embed`. API keys are read here, from a setting no SQL
//! route displays or from a server-only file, so a key reaches the provider without ever being readable by
//! the role that runs the query; the table holds only where the key is, never the key.
use rag_embed::{
    EmbedOutput, HostAllowlist, Provider, ProviderConfig, ProviderError, ProviderKind,
};
use rag_embed_local::{CrossEncoder, LoadOptions, LocalModel};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq)]
pub struct ProviderRow {
    pub name: String,
    pub kind: Kind,
    pub base_url: Option<String>,
    pub api_key_setting: Option<String>,
}

/// What a `rag.providers` row is: a model run in this process, or a server speaking one of rag-embed's
/// protocols. The column's CHECK allows only those; a value it does not know (a newer version's, read by an
/// older library) is kept so the error can name it when the provider is used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Local,
    Server(ProviderKind),
    Unknown(String),
}

impl Kind {
    pub fn from_column(kind: &str) -> Kind {
        match kind {
            "local" => Kind::Local,
            other => other
                .parse::<ProviderKind>()
                .map(Kind::Server)
                .unwrap_or_else(|_| Kind::Unknown(other.to_string())),
        }
    }
}

/// Reads a provider's API key from where its `api_key_setting` points: `rag.openai_api_key` (a setting that
/// is never displayed) or `file:NAME` (an entry of `rag.secrets_file`). None when unset.
pub fn read_secret_setting(name: &str) -> Result<Option<String>, String> {
    if let Some(entry) = name.strip_prefix("file:") {
        return read_secrets_file(entry);
    }
    if name == "rag.openai_api_key" {
        if !crate::pg::loaded_by_postmaster() {
            return Err("rag.openai_api_key is used only when rag is in shared_preload_libraries: until the \
                        library is loaded in a session, PostgreSQL shows a rag setting from the configuration \
                        to every role (SHOW rag.openai_api_key); preload rag, or keep the key in \
                        rag.secrets_file and name it file:NAME"
                .to_string());
        }
        let value = crate::settings::string(&crate::settings::OPENAI_API_KEY);
        return Ok((!value.trim().is_empty()).then(|| value.trim().to_string()));
    }
    Err(format!(
        "api_key_setting \"{name}\" is neither rag.openai_api_key nor file:NAME"
    ))
}

/// A base backup copies the data directory whole, and a role with REPLICATION (not a superuser) may take one
/// (`pg_basebackup`): a key file inside it went with every backup and to every standby (red team 15). A relative
/// path is relative to the data directory, so it must be absolute.
fn refuse_inside_data_directory(path: &std::path::Path) -> Result<(), String> {
    if !path.is_absolute() {
        return Err("rag.secrets_file must be an absolute path outside the data directory (a relative one is inside it, \
                    and base backups copy it)"
            .to_string());
    }
    // SAFETY: DataDir is set once at server start, before any backend runs SQL, and never changed; it is a
    // NUL-terminated string the postmaster owns.
    let data_directory = unsafe {
        (!pgrx::pg_sys::DataDir.is_null()).then(|| {
            std::ffi::CStr::from_ptr(pgrx::pg_sys::DataDir)
                .to_string_lossy()
                .into_owned()
        })
    };
    let Some(data_directory) = data_directory else {
        return Ok(());
    };
    let resolve =
        |path: &std::path::Path| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    if resolve(path).starts_with(resolve(std::path::Path::new(&data_directory))) {
        // The path is not repeated: this reaches whoever's call needed the key, and the data directory's
        // location is for pg_read_all_settings to read.
        return Err(
            "rag.secrets_file is inside the data directory: base backups and standbys copy it; move it outside"
                .to_string(),
        );
    }
    Ok(())
}

fn read_secrets_file(entry: &str) -> Result<Option<String>, String> {
    use std::os::unix::fs::PermissionsExt;
    let path = crate::settings::string(&crate::settings::SECRETS_FILE);
    if path.trim().is_empty() {
        return Err(format!(
            "api key file:{entry} is wanted but rag.secrets_file is not set"
        ));
    }
    refuse_inside_data_directory(std::path::Path::new(&path))?;
    let metadata =
        std::fs::metadata(&path).map_err(|error| format!("rag.secrets_file: {error}"))?;
    // Like .pgpass: a key file others can read is a leak waiting to happen, so it is refused, not used.
    if metadata.permissions().mode() & 0o077 != 0 {
        return Err("rag.secrets_file is readable by group or others; chmod 600 it".to_string());
    }
    let text =
        std::fs::read_to_string(&path).map_err(|error| format!("rag.secrets_file: {error}"))?;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((name, value)) = line.split_once('=') {
            if name.trim() == entry {
                let value = value.trim();
                return Ok((!value.is_empty()).then(|| value.to_string()));
            }
        }
    }
    Err(format!("rag.secrets_file has no entry \"{entry}\""))
}

/// The named provider's row, or None when there is no such provider.
pub fn load_row(name: &str) -> Result<Option<ProviderRow>, pgrx::spi::Error> {
    use pgrx::prelude::*;
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT name, kind, base_url, api_key_setting FROM rag.providers WHERE name = $1",
            Some(1),
            &[name.into()],
        )?;
        let mut found = None;
        for row in rows {
            found = Some(ProviderRow {
                name: row.get::<String>(1)?.unwrap_or_default(),
                kind: Kind::from_column(&row.get::<String>(2)?.unwrap_or_default()),
                base_url: row.get::<String>(3)?,
                api_key_setting: row.get::<String>(4)?,
            });
        }
        Ok(found)
    })
}

/// The named provider's row, or an ERROR naming it.
pub fn row_or_raise(name: &str) -> ProviderRow {
    use crate::error::{RagError, SpiContext, UnwrapOrRaise};
    load_row(name)
        .doing(|| format!("reading provider \"{name}\""))
        .and_then(|row| {
            row.ok_or_else(|| {
                RagError::undefined(
                    format!("provider \"{name}\" does not exist"),
                    "SELECT name, kind FROM rag.providers lists them.",
                )
            })
        })
        .unwrap_or_raise()
}

/// Where embeddings come from: a server over HTTP, or a model running in this process.
#[derive(Clone)]
pub enum Embedder {
    Remote(Provider),
    Local(&'static LocalModel),
}

impl Embedder {
    pub fn embed(
        &self,
        model: &str,
        inputs: &[String],
        dimensions: Option<u32>,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<EmbedOutput, ProviderError> {
        match self {
            Embedder::Remote(provider) => provider.embed(model, inputs, dimensions, interrupt),
            Embedder::Local(local) => {
                let texts: Vec<&str> = inputs.iter().map(String::as_str).collect();
                // The batch is CPU work in this process, checked for interrupts between forward passes.
                let embedded = local
                    .embed_interruptible(&texts, interrupt)
                    .map_err(|error| match error {
                        rag_embed_local::LocalModelError::Interrupted => ProviderError::Interrupted,
                        error @ (rag_embed_local::LocalModelError::TooLong { .. }
                        | rag_embed_local::LocalModelError::TooManyBytes { .. }) => {
                            ProviderError::InputTooLong {
                                message: format!("local model \"{model}\": {error}"),
                            }
                        }
                        error => ProviderError::Permanent {
                            status: None,
                            message: format!("local model \"{model}\": {error}"),
                        },
                    })?;
                Ok(EmbedOutput {
                    prompt_tokens: Some(embedded.tokens as i64),
                    vectors: embedded.vectors,
                })
            }
        }
    }
}

/// Loaded local models, one per model name and process: weights are mapped from the model directory once
/// and shared by every collection of this backend. A load failure is not remembered, so installing the
/// model fixes the next call without a reconnect.
static LOCAL_MODELS: Mutex<Option<HashMap<String, &'static LocalModel>>> = Mutex::new(None);

pub fn model_directory(model: &str) -> Result<PathBuf, String> {
    if model.is_empty() || model.contains('/') || model.contains("..") || model.starts_with('.') {
        return Err(format!(
            "\"{model}\" is not a model name: it names a directory under rag.model_path"
        ));
    }
    Ok(PathBuf::from(crate::settings::model_path()).join(model))
}

/// The model of this name from `registry`, loaded by `load` from its directory on first use. Loaded models
/// live as long as the backend: the mapping is what lets backends share the weights' pages.
fn loaded_once<T: 'static>(
    registry: &Mutex<Option<HashMap<String, &'static T>>>,
    model: &str,
    load: impl FnOnce(&std::path::Path, &LoadOptions) -> Result<T, String>,
) -> Result<&'static T, String> {
    let mut models = registry
        .lock()
        .map_err(|_| "local model registry is poisoned".to_string())?;
    let models = models.get_or_insert_with(HashMap::new);
    if let Some(loaded) = models.get(model) {
        return Ok(loaded);
    }
    let directory = model_directory(model)?;
    let options = LoadOptions {
        threads: crate::settings::LOCAL_THREADS.get().max(1) as usize,
    };
    let loaded: &'static T = Box::leak(Box::new(load(&directory, &options)?));
    models.insert(model.to_string(), loaded);
    Ok(loaded)
}

pub fn local_model(model: &str) -> Result<&'static LocalModel, String> {
    loaded_once(&LOCAL_MODELS, model, |directory, options| {
        LocalModel::load_with(directory, options)
            .map_err(|error| format!("local model \"{model}\": {error}"))
    })
}

/// Loaded rerankers, as `LOCAL_MODELS`: one per model name and process, weights mapped once.
static LOCAL_RERANKERS: Mutex<Option<HashMap<String, &'static CrossEncoder>>> = Mutex::new(None);

pub fn local_reranker(model: &str) -> Result<&'static CrossEncoder, String> {
    loaded_once(&LOCAL_RERANKERS, model, |directory, options| {
        CrossEncoder::load_with(directory, options, None)
            .map_err(|error| format!("reranker \"{model}\": {error}"))
    })
}

pub fn embedder(row: &ProviderRow, model: &str, timeout: Duration) -> Result<Embedder, String> {
    if row.kind == Kind::Local {
        return local_model(model).map(Embedder::Local);
    }
    connect(row, timeout).map(Embedder::Remote)
}

pub fn config_for(row: &ProviderRow, timeout: Duration) -> Result<ProviderConfig, String> {
    let kind = match &row.kind {
        Kind::Server(kind) => *kind,
        Kind::Local => {
            return Err(format!(
                "provider \"{}\" runs a local model, not a server",
                row.name
            ))
        }
        Kind::Unknown(kind) => {
            return Err(format!(
                "provider \"{}\" has unknown kind \"{kind}\"",
                row.name
            ))
        }
    };
    // rag.ollama_url is a superuser's own choice; only URLs a rag_admin wrote answer to rag.provider_hosts.
    let (base_url, allowed_hosts) = match (&row.base_url, kind) {
        (Some(url), _) if !url.trim().is_empty() => (url.trim().to_string(), provider_hosts()?),
        (_, ProviderKind::Ollama) => (
            crate::settings::string(&crate::settings::OLLAMA_URL),
            HostAllowlist::default(),
        ),
        (_, ProviderKind::OpenAi) => {
            return Err(format!("provider \"{}\" has no base_url", row.name))
        }
    };
    let api_key = match row.api_key_setting.as_deref() {
        Some(setting) => read_secret_setting(setting)
            .map_err(|message| format!("provider \"{}\": {message}", row.name))?,
        None => None,
    };
    Ok(ProviderConfig {
        kind,
        base_url,
        api_key,
        timeout,
        allowed_hosts,
    })
}

/// `rag.provider_hosts` parsed; a list that does not parse refuses every listed-URL provider rather than
/// allowing them all.
pub fn provider_hosts() -> Result<HostAllowlist, String> {
    HostAllowlist::parse(&crate::settings::string(&crate::settings::PROVIDER_HOSTS))
        .map_err(|why| format!("rag.provider_hosts is not valid: {why}"))
}

pub fn connect(row: &ProviderRow, timeout: Duration) -> Result<Provider, String> {
    if row.kind == Kind::Local {
        return Err(format!(
            "provider \"{}\" runs a local embedding model and has no chat model; leave chat_model NULL for extractive answers",
            row.name
        ));
    }
    let config = config_for(row, timeout)?;
    Provider::new(config).map_err(|error| error.to_string())
}
