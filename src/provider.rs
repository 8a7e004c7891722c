//! Turns a `rag.providers` row into a client from `rag-embed`. API keys are read here, in C-level settings
//! code that skips the SQL privilege check, so a key held in a superuser-only setting reaches the provider
//! without ever being readable by the role that runs the query.
use pgrx::pg_sys;
use rag_embed::{Provider, ProviderConfig, ProviderError, ProviderKind};
use std::ffi::{CStr, CString};
use std::time::Duration;

#[derive(Clone, Debug, PartialEq)]
pub struct ProviderRow {
    pub name: String,
    pub kind: String,
    pub base_url: Option<String>,
    pub api_key_setting: Option<String>,
}

/// Reads a setting by name without the SQL-level privilege check; None when unset or empty.
pub fn read_secret_setting(name: &str) -> Option<String> {
    let name = CString::new(name).ok()?;
    unsafe {
        let value = pg_sys::GetConfigOption(name.as_ptr(), true, false);
        if value.is_null() {
            return None;
        }
        let value = CStr::from_ptr(value).to_string_lossy().trim().to_string();
        (!value.is_empty()).then_some(value)
    }
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
    let api_key = row.api_key_setting.as_deref().and_then(read_secret_setting);
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
