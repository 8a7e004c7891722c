//! Turning a conversational follow-up into a question that retrieval can use on its own.

use crate::reply::strip_think_block;

/// How many of the latest messages the rewrite prompt shows; older turns rarely hold what a pronoun refers to.
pub const REWRITE_HISTORY_MESSAGES: usize = 6;
/// Longest message content shown in the rewrite prompt, in chars; long answers are cut with "…".
pub const REWRITE_MESSAGE_CHARS: usize = 1000;
/// A rewritten question longer than this many chars (or than three times the follow-up, if that is more) is
/// not a question but a model going astray.
pub const REWRITE_MAX_CHARS: usize = 400;

/// The prompt asking the chat model to rewrite `follow_up` into a standalone question.
///
/// `history` holds (role, content) pairs, oldest first; roles "user" and "assistant" are shown, others (such as
/// "system") are left out. Only the last [`REWRITE_HISTORY_MESSAGES`] shown messages are included, each cut to
/// [`REWRITE_MESSAGE_CHARS`] and flattened to one line so no message can pass for the prompt's own lines.
/// The prompt ends with the lines `Follow-up: <question>` and `Standalone question:`.
pub fn rewrite_prompt(history: &[(String, String)], follow_up: &str) -> String {
    let shown: Vec<(&str, String)> = history
        .iter()
        .filter_map(|(role, content)| {
            let speaker = match role.trim().to_ascii_lowercase().as_str() {
                "user" => "User",
                "assistant" => "Assistant",
                _ => return None,
            };
            Some((speaker, one_line(content, REWRITE_MESSAGE_CHARS)))
        })
        .collect();
    let recent = &shown[shown.len().saturating_sub(REWRITE_HISTORY_MESSAGES)..];

    let mut prompt = String::from(
        "Rewrite the follow-up question so that it can be understood without the conversation before it. \
         Replace pronouns and references such as \"it\", \"they\" or \"what about ...\" with what they refer to in \
         the conversation. Keep the language, meaning and scope of the follow-up; add nothing it does not ask. \
         If the follow-up already stands on its own, repeat it unchanged. \
         Reply with the standalone question only, on one line, without quotes or explanation.\n\nConversation:\n",
    );
    if recent.is_empty() {
        prompt.push_str("(no earlier messages)\n");
    }
    for (speaker, content) in recent {
        prompt.push_str(speaker);
        prompt.push_str(": ");
        prompt.push_str(content);
        prompt.push('\n');
    }
    prompt.push_str("\nFollow-up: ");
    prompt.push_str(&one_line(follow_up, REWRITE_MESSAGE_CHARS));
    prompt.push_str("\nStandalone question:");
    prompt
}

/// Extracts the rewritten question from the model's output, or returns `fallback` (the original follow-up).
///
/// Drops a leading `<think>` block, a "Standalone question:" (or "Rewritten question:", "Question:") prefix,
/// Markdown emphasis and surrounding quotes, and keeps the first line that has words in it. Falls back when
/// nothing is left or the result is absurdly long (see [`REWRITE_MAX_CHARS`]).
pub fn clean_rewritten_question(model_output: &str, fallback: &str) -> String {
    let fallback = fallback.trim();
    let output = strip_think_block(model_output);
    let lines: Vec<&str> = output
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();

    // A model that echoes the prompt's tail puts the answer after the "Standalone question:" line.
    let labelled = lines.iter().enumerate().find_map(|(index, line)| {
        let rest = strip_label(line)?;
        if rest.is_empty() {
            lines.get(index + 1).copied()
        } else {
            Some(rest)
        }
    });
    let candidate = labelled
        .or_else(|| {
            lines
                .iter()
                .copied()
                .find(|line| !line.to_ascii_lowercase().starts_with("follow-up:"))
        })
        .unwrap_or("");
    let question = strip_decoration(strip_label(candidate).unwrap_or(candidate));

    let limit = REWRITE_MAX_CHARS.max(3 * fallback.chars().count());
    if !question.chars().any(char::is_alphanumeric) || question.chars().count() > limit {
        return fallback.to_string();
    }
    question.to_string()
}

const LABELS: &[&str] = &["standalone question:", "rewritten question:", "question:"];

/// The text after a known label at the start of a line (ignoring case and emphasis), if there is one.
fn strip_label(line: &str) -> Option<&str> {
    let line = line.trim_start_matches(['*', '_', '#', ' ']);
    LABELS.iter().find_map(|label| {
        let head = line.get(..label.len())?;
        head.eq_ignore_ascii_case(label)
            .then(|| line[label.len()..].trim_start_matches(['*', '_']).trim())
    })
}

/// Removes emphasis and quotes wrapped around the whole question.
fn strip_decoration(text: &str) -> &str {
    let mut text = text.trim();
    loop {
        let before = text;
        text = text.trim_matches(['*', '_', '`']).trim();
        for (open, close) in [('"', '"'), ('\'', '\''), ('“', '”'), ('‘', '’'), ('«', '»')]
        {
            if text.chars().count() >= 2 && text.starts_with(open) && text.ends_with(close) {
                text = text[open.len_utf8()..text.len() - close.len_utf8()].trim();
            }
        }
        if text == before {
            return text;
        }
    }
}

/// Collapses whitespace (newlines included) and cuts to `max_chars` chars.
fn one_line(text: &str, max_chars: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max_chars {
        return flat;
    }
    let mut cut: String = flat.chars().take(max_chars.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(role: &str, content: &str) -> (String, String) {
        (role.to_string(), content.to_string())
    }

    #[test]
    fn prompt_shows_the_conversation_and_ends_with_the_follow_up() {
        let history = vec![
            turn("system", "You are helpful."),
            turn("user", "How much notice\ndo staff give?"),
            turn("assistant", "Thirty days [1]."),
        ];
        let prompt = rewrite_prompt(&history, "and what about managers?");
        assert!(
            prompt.contains("User: How much notice do staff give?\nAssistant: Thirty days [1].\n")
        );
        assert!(!prompt.contains("You are helpful"));
        assert!(prompt.ends_with("\nFollow-up: and what about managers?\nStandalone question:"));
    }

    #[test]
    fn prompt_keeps_only_recent_and_cut_messages() {
        let mut history: Vec<(String, String)> = (0..10)
            .map(|i| turn("user", &format!("message {i}")))
            .collect();
        history.push(turn("assistant", &"x".repeat(5000)));
        let prompt = rewrite_prompt(&history, "why?");
        assert!(!prompt.contains("message 4"));
        assert!(prompt.contains("message 5"));
        assert!(prompt.contains(&format!(
            "Assistant: {}…\n",
            "x".repeat(REWRITE_MESSAGE_CHARS - 1)
        )));
        assert!(!prompt.contains(&"x".repeat(REWRITE_MESSAGE_CHARS)));
    }

    #[test]
    fn prompt_without_history_says_so() {
        let prompt = rewrite_prompt(&[], "What is the notice period?");
        assert!(prompt.contains("(no earlier messages)"));
        assert!(prompt.ends_with("Follow-up: What is the notice period?\nStandalone question:"));
    }

    #[test]
    fn cleaning_strips_labels_quotes_and_thinking() {
        let fallback = "and managers?";
        for (output, expected) in [
            (
                "What notice must managers give?",
                "What notice must managers give?",
            ),
            (
                "  \"What notice must managers give?\"  ",
                "What notice must managers give?",
            ),
            (
                "Standalone question: What notice must managers give?",
                "What notice must managers give?",
            ),
            (
                "**Standalone question:** “What notice must managers give?”",
                "What notice must managers give?",
            ),
            (
                "<think>they mean managers</think>\nWhat notice must managers give?",
                "What notice must managers give?",
            ),
            (
                "Follow-up: and managers?\nStandalone question:\nWhat notice must managers give?",
                "What notice must managers give?",
            ),
            (
                "What notice must managers give?\nI replaced the pronoun.",
                "What notice must managers give?",
            ),
        ] {
            assert_eq!(
                clean_rewritten_question(output, fallback),
                expected,
                "for {output:?}"
            );
        }
    }

    #[test]
    fn cleaning_falls_back_when_empty_or_absurd() {
        assert_eq!(
            clean_rewritten_question("", " and managers? "),
            "and managers?"
        );
        assert_eq!(
            clean_rewritten_question("\"\"", "and managers?"),
            "and managers?"
        );
        assert_eq!(
            clean_rewritten_question("Standalone question:", "and managers?"),
            "and managers?"
        );
        assert_eq!(
            clean_rewritten_question(&"word ".repeat(200), "and managers?"),
            "and managers?"
        );
    }
}
