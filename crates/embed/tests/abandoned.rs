//! Requests given up on are bounded per process. In a test binary of its own: the count is process-wide, and
//! the protocol tests interrupt requests of their own in parallel.

mod support;

use std::time::{Duration, Instant};

use rag_embed::{
    abandoned_requests, HostAllowlist, Provider, ProviderConfig, ProviderError, ProviderKind,
    MAX_ABANDONED_REQUESTS,
};
use support::{Behaviour, TestServer};

fn provider(url: String, timeout: Duration) -> Provider {
    Provider::new(ProviderConfig {
        kind: ProviderKind::Ollama,
        base_url: url,
        api_key: None,
        timeout,
        allowed_hosts: HostAllowlist::default(),
    })
    .unwrap()
}

#[test]
fn a_session_that_cancels_call_after_call_is_held_to_a_few_running_requests() {
    let silent = TestServer::start(vec![Behaviour::Silent]);
    let hanging = provider(silent.url(), Duration::from_secs(3));
    for n in 0..MAX_ABANDONED_REQUESTS {
        let asked = Instant::now();
        // Cancelled once the request has had time to be sent: its thread goes on waiting for the answer.
        let mut cancel = move || asked.elapsed() > Duration::from_millis(200);
        let result = hanging.list_models(&mut cancel);
        assert!(
            matches!(result, Err(ProviderError::Interrupted)),
            "{result:?}"
        );
        assert_eq!(abandoned_requests(), n + 1);
    }
    assert_eq!(silent.requests().len(), MAX_ABANDONED_REQUESTS);
    // One more is not sent at all, to this server or any other, until those end.
    let answering = TestServer::start(vec![Behaviour::json(
        200,
        serde_json::json!({"models": []}),
    )]);
    let fine = provider(answering.url(), Duration::from_secs(3));
    match fine.list_models(&mut || false) {
        Err(ProviderError::Transient { message, .. }) => {
            assert!(message.contains("still running"), "{message}")
        }
        other => {
            panic!("sent while {MAX_ABANDONED_REQUESTS} requests were still running: {other:?}")
        }
    }
    assert_eq!(answering.requests().len(), 0);
    assert_eq!(silent.requests().len(), MAX_ABANDONED_REQUESTS);
    // Their own deadline ends them, and calls go out again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while abandoned_requests() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(abandoned_requests(), 0);
    fine.list_models(&mut || false)
        .expect("sent once the abandoned requests ended");
}
