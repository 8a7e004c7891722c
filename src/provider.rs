//! Turns a `rag.providers` row into a client from `rag-embed`. API keys are read here, from a setting no SQL
//! route displays or from a server-only file, so a key reaches the provider without ever being readable by
//! the role that runs the query; the table holds only where the key is, never the key.
use rag_embed::{Provider, ProviderConfig, ProviderError, ProviderKind};
use std::time::Duration;

#[derive(Clone, Debug, PartialEq)]
pub struct ProviderRow {
    pub name: String,
    pub kind: String,
    pub base_url: Option<String>,
    pub api_key_setting: Option<String>,
}

/// Reads a provider's API key from where its `api_key_setting` points: `rag.openai_api_key` (a setting that
/// is never displayed) or `file:NAME` (an entry of `rag.secrets_file`). None when unset.
pub fn read_secret_setting(name: &str) -> Result<Option<String>, String> {
    if let Some(entry) = name.strip_prefix("file:") {
        return read_secrets_file(entry);
    }
    if name == "rag.openai_api_key" {
        let value = crate::settings::string(&crate::settings::OPENAI_API_KEY);
        return Ok((!value.trim().is_empty()).then(|| value.trim().to_string()));
    }
    Err(format!(
        "api_key_setting \"{name}\" is neither rag.openai_api_key nor file:NAME"
    ))
}

fn read_secrets_file(entry: &str) -> Result<Option<String>, String> {
    use std::os::unix::fs::PermissionsExt;
    let path = crate::settings::string(&crate::settings::SECRETS_FILE);
    if path.trim().is_empty() {
        return Err(format!(
            "api key file:{entry} is wanted but rag.secrets_file is not set"
        ));
    }
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

pub fn config_for(row: &ProviderRow, timeout: Duration) -> Result<ProviderConfig, String> {
    let kind: ProviderKind = row.kind.parse().map_err(|_| {
        format!(
            "provider \"{}\" has unknown kind \"{}\"",
            row.name, row.kind
        )
    })?;
    let base_url = match (&row.base_url, kind) {
        (Some(url), _) if !url.trim().is_empty() => url.trim().to_string(),
        (_, ProviderKind::Ollama) => crate::settings::string(&crate::settings::OLLAMA_URL),
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
    })
}

pub fn connect(row: &ProviderRow, timeout: Duration) -> Result<Provider, String> {
    let config = config_for(row, timeout)?;
    Provider::new(config).map_err(|error| describe(&error))
}

pub fn describe(error: &ProviderError) -> String {
    error.to_string()
}
