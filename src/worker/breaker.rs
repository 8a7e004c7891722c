//! The worker's providers: the last client is kept so a run of documents on one provider reuses its
//! connections, and a circuit breaker per provider and model (`breaker_key`): after a transient failure (429,
//! 5xx, timeout) that model's documents wait out a cool-down that grows with consecutive failures, while
//! documents of other models go ahead. One provider that hangs until the HTTP timeout would otherwise stall
//! every collection behind it; keyed by model as well, a model change to a model that keeps failing does not
//! stall the collection's own documents on the same server.
use crate::provider::{self, Embedder, ProviderRow};
use rag_embed::{Pace, RetryPolicy};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What the breaker is keyed by; rag._embedding_key makes the same string in SQL for the claim to skip.
pub fn breaker_key(provider: &str, model: &str) -> String {
    format!("{provider}/{model}")
}

#[derive(Default)]
pub struct Providers {
    key: Option<(ProviderRow, String, Duration)>,
    client: Option<Embedder>,
    open_until: HashMap<String, (Instant, u32)>,
    /// How fast each provider/model embeds, as this worker has seen it: how much to claim at once.
    paces: HashMap<String, Pace>,
}

impl Providers {
    /// Provider/model keys whose breaker is open: their documents are not claimed until it closes.
    pub fn cooling_down(&mut self) -> Vec<String> {
        let now = Instant::now();
        self.open_until.retain(|_, (until, _)| *until > now);
        self.open_until.keys().cloned().collect()
    }

    /// When the earliest open breaker closes, so an idle worker knows when to look again.
    pub fn next_close(&self) -> Option<Duration> {
        let now = Instant::now();
        self.open_until
            .values()
            .map(|(until, _)| until.saturating_duration_since(now))
            .min()
    }

    /// Opens the provider's breaker for at least `delay`, longer after each consecutive failure.
    pub fn trip(&mut self, provider: &str, delay: Duration) {
        let failures = self
            .open_until
            .get(provider)
            .map(|(_, failures)| failures + 1)
            .unwrap_or(1);
        let cool_down = RetryPolicy::default().ceiling(failures).max(delay);
        self.open_until
            .insert(provider.to_string(), (Instant::now() + cool_down, failures));
    }

    /// A call to the provider/model `key` embedded `bytes` of text in `elapsed`.
    pub fn note_call(&mut self, key: &str, bytes: usize, elapsed: Duration) {
        self.paces
            .entry(key.to_string())
            .or_default()
            .record(bytes, elapsed);
    }

    /// Per provider/model key this worker has called, the text that embeds in about `slice` at the pace seen
    /// so far: None when its calls were too fast to measure (no bound needed). Keys never called are absent.
    pub fn claim_budgets(&self, slice: Duration) -> HashMap<String, Option<i32>> {
        self.paces
            .iter()
            .map(|(key, pace)| (key.clone(), pace.bytes_within(slice)))
            .collect()
    }

    pub fn reset(&mut self, provider: &str) {
        self.open_until.remove(provider);
    }

    /// Drops the cached client, so that settings just reloaded (keys, `rag.provider_hosts`, `rag.ollama_url`)
    /// apply to the next call.
    pub fn forget_client(&mut self) {
        self.client = None;
        self.key = None;
    }

    /// A client for the provider and model, reused while they and the timeout stay the same.
    pub fn client(&mut self, row: &ProviderRow, model: &str) -> Result<&Embedder, String> {
        let timeout = crate::settings::http_timeout();
        let wanted = (row.clone(), model.to_string(), timeout);
        if self.key.as_ref() != Some(&wanted) || self.client.is_none() {
            self.client = Some(provider::embedder(row, model, timeout)?);
            self.key = Some(wanted);
        }
        Ok(self.client.as_ref().expect("client was just set"))
    }
}
