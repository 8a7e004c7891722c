//! Answering without a language model: quoting the sentences that best match the question.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use unicode_segmentation::UnicodeSegmentation;

use crate::grounding::contains_marker;
use crate::sources::Source;

/// An answer made of verbatim sentences from the sources, each followed by its citation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtractiveAnswer {
    /// The quoted sentences, each followed by ` [n]`, separated by single spaces.
    pub answer: String,
    /// The source numbers cited, ascending, each once.
    pub citations: Vec<usize>,
}

/// Quotes the sentences of `sources` that best match `question`, within `max_chars` chars.
///
/// Sentences (Unicode sentence boundaries) are scored by the content words they share with the question
/// (lowercased, stop words dropped, lightly stemmed so "notice" matches "notices"), each shared word weighted by
/// how rare it is among all the sentences, and the total weighted down by the source's rank (source 1 counts most).
/// The best sentences that fit are quoted verbatim, each followed by `[n]`, in source order and then text order.
///
/// Sentences containing something [`crate::ground`] would read as a citation marker (a footnote such as `[3]` in
/// the document) are never quoted, so the answer carries exactly the citations this function adds and passes
/// `ground` with all of them kept. Sources whose `number` is outside 1..=sources.len() are ignored for the same
/// reason.
///
/// `None` when no sentence shares a content word with the question or none fits `max_chars`: the caller refuses.
pub fn extractive_answer(
    question: &str,
    sources: &[Source],
    max_chars: usize,
) -> Option<ExtractiveAnswer> {
    let question_terms: HashSet<String> = content_terms(question).collect();
    if question_terms.is_empty() || max_chars == 0 {
        return None;
    }

    let mut sentence_count = 0usize;
    let mut candidates: Vec<Candidate> = Vec::new();
    for (rank, source) in sources.iter().enumerate() {
        if source.number == 0 || source.number > sources.len() {
            continue;
        }
        for (offset, raw) in source.text.split_sentence_bound_indices() {
            let sentence = raw.trim();
            if !sentence.chars().any(char::is_alphanumeric) {
                continue;
            }
            sentence_count += 1;
            let terms: Vec<String> = content_terms(sentence).collect();
            let matched: HashSet<String> = terms
                .iter()
                .filter(|term| question_terms.contains(*term))
                .cloned()
                .collect();
            if matched.is_empty() || contains_marker(sentence) {
                continue;
            }
            candidates.push(Candidate {
                rank,
                number: source.number,
                position: offset + (raw.len() - raw.trim_start().len()),
                text: sentence,
                echo: matched.len() == terms.iter().collect::<HashSet<_>>().len()
                    && !ends_a_sentence(sentence),
                matched,
                score: 0.0,
            });
        }
    }
    // A heading, title or synopsis line that only repeats the question's words ("CREATE DATABASE — create a new
    // database" for "How do I create a new database?") matches best and answers nothing: such lines are
    // quoted only when nothing else matches. A full sentence made of the question's words stays, since it can
    // be the answer to a yes-or-no question ("Pets are allowed.").
    if candidates.iter().any(|candidate| !candidate.echo) {
        candidates.retain(|candidate| !candidate.echo);
    }
    if candidates.is_empty() {
        return None;
    }

    let mut document_frequency: HashMap<&str, usize> = HashMap::new();
    for candidate in &candidates {
        for term in &candidate.matched {
            *document_frequency.entry(term.as_str()).or_default() += 1;
        }
    }
    let scores: Vec<f64> = candidates
        .iter()
        .map(|candidate| {
            let coverage: f64 = candidate
                .matched
                .iter()
                .map(|term| {
                    let frequency = document_frequency
                        .get(term.as_str())
                        .copied()
                        .unwrap_or(1)
                        .max(1);
                    (1.0 + sentence_count as f64 / frequency as f64).ln()
                })
                .sum();
            coverage / (1.0 + 0.5 * candidate.rank as f64)
        })
        .collect();
    for (candidate, score) in candidates.iter_mut().zip(scores) {
        candidate.score = score;
    }

    candidates.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(a.rank.cmp(&b.rank))
            .then(a.position.cmp(&b.position))
    });

    let mut chosen: Vec<&Candidate> = Vec::new();
    let mut used_chars = 0usize;
    for candidate in &candidates {
        if chosen.iter().any(|c| c.text == candidate.text) {
            continue;
        }
        let separator = usize::from(!chosen.is_empty());
        let cost =
            candidate.text.chars().count() + format!(" [{}]", candidate.number).len() + separator;
        if used_chars + cost > max_chars {
            continue;
        }
        used_chars += cost;
        chosen.push(candidate);
    }
    if chosen.is_empty() {
        return None;
    }

    chosen.sort_by(|a, b| a.rank.cmp(&b.rank).then(a.position.cmp(&b.position)));
    let answer = chosen
        .iter()
        .map(|c| format!("{} [{}]", c.text, c.number))
        .collect::<Vec<_>>()
        .join(" ");
    let mut citations: Vec<usize> = chosen.iter().map(|c| c.number).collect();
    citations.sort_unstable();
    citations.dedup();
    Some(ExtractiveAnswer { answer, citations })
}

/// [`extractive_answer`] for sources a cross-encoder has already judged relevant and ordered, so that the first
/// source, the one it judged most relevant, is always quoted. When none of its sentences shares a word with the
/// question, its opening sentences are quoted first (within `max_chars`, or half of it when other sources have
/// sentences that match), then what the others match in the room left. A paraphrase ("When do we get our
/// wages?" of "Salaries are paid on the last working day") shares no word with its answer, and the lexical match
/// alone would refuse it although the passage answers it, or quote a lower source that happens to share a word
/// ("stay at home" of a parental leave question matched the remote work rule) and cite the wrong passage.
pub fn extractive_answer_or_lead(
    question: &str,
    sources: &[Source],
    max_chars: usize,
) -> Option<ExtractiveAnswer> {
    let lexical = extractive_answer(question, sources, max_chars);
    let Some(first) = sources
        .iter()
        .find(|source| source.number >= 1 && source.number <= sources.len())
    else {
        return lexical;
    };
    if lexical
        .as_ref()
        .is_some_and(|answer| answer.citations.contains(&first.number))
    {
        return lexical;
    }
    let lead_budget = if lexical.is_some() {
        max_chars / 2
    } else {
        max_chars
    };
    let mut quoted: Vec<String> = Vec::new();
    let mut used_chars = 0usize;
    for raw in first.text.split_sentence_bounds() {
        let sentence = raw.trim();
        if !sentence.chars().any(char::is_alphanumeric) || contains_marker(sentence) {
            continue;
        }
        let quote = format!("{sentence} [{}]", first.number);
        let cost = quote.chars().count() + usize::from(!quoted.is_empty());
        if used_chars + cost > lead_budget {
            break;
        }
        used_chars += cost;
        quoted.push(quote);
    }
    if quoted.is_empty() {
        return lexical;
    }
    let mut citations = vec![first.number];
    // The first source has no sentence that matches (or none that fit), so what matches in the room left comes
    // from the others.
    if let Some(more) =
        extractive_answer(question, sources, max_chars.saturating_sub(used_chars + 1))
    {
        quoted.push(more.answer);
        citations.extend(more.citations);
        citations.sort_unstable();
        citations.dedup();
    }
    Some(ExtractiveAnswer {
        answer: quoted.join(" "),
        citations,
    })
}

struct Candidate<'a> {
    rank: usize,
    number: usize,
    /// Byte offset of the sentence in its source text.
    position: usize,
    text: &'a str,
    /// Every content word is one of the question's and it does not end as a sentence does: a heading echoing
    /// the question.
    echo: bool,
    matched: HashSet<String>,
    score: f64,
}

/// Whether a text ends as a sentence does (full stop, question or exclamation mark, ellipsis, or their CJK
/// forms), closing quotes and brackets aside; headings, titles, list labels and synopsis lines do not.
fn ends_a_sentence(text: &str) -> bool {
    text.trim_end()
        .trim_end_matches(['"', '\'', '’', '”', '»', ')', ']', '*'])
        .ends_with(['.', '!', '?', '…', '。', '！', '？'])
}

/// The stemmed, lowercased words of a text that carry meaning.
fn content_terms(text: &str) -> impl Iterator<Item = String> + '_ {
    text.unicode_words().filter_map(|word| {
        let lower = word.to_lowercase();
        let lower = lower.trim_end_matches("'s").trim_end_matches("’s");
        let is_short_word = lower.chars().count() < 2 && !lower.chars().all(|c| c.is_numeric());
        if lower.is_empty() || is_short_word || STOP_WORDS.contains(&lower) {
            return None;
        }
        Some(stem(lower))
    })
}

/// A light suffix-stripping stem: enough for "notices"/"notice", "policies"/"policy", "giving"/"give".
/// Not a linguistic stemmer; both sides of every comparison go through the same function, which is what matters.
fn stem(word: &str) -> String {
    let length = word.chars().count();
    let mut stemmed: String = if length > 4 && word.ends_with("ies") {
        format!("{}y", &word[..word.len() - 3])
    } else if length > 4 && word.ends_with("sses") {
        word[..word.len() - 2].to_string()
    } else if length > 3
        && word.ends_with('s')
        && !word.ends_with("ss")
        && !word.ends_with("us")
        && !word.ends_with("is")
    {
        word[..word.len() - 1].to_string()
    } else {
        word.to_string()
    };

    let length = stemmed.chars().count();
    if length > 5 && stemmed.ends_with("ing") {
        stemmed.truncate(stemmed.len() - 3);
    } else if length > 4 && (stemmed.ends_with("ed") || stemmed.ends_with("ly")) {
        stemmed.truncate(stemmed.len() - 2);
    }
    if stemmed.chars().count() > 3 && stemmed.ends_with('e') {
        stemmed.truncate(stemmed.len() - 1);
    }
    stemmed
}

/// Common English function words, plus the words questions are phrased with.
const STOP_WORDS: &[&str] = &[
    "a", "about", "above", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as",
    "at", "be", "because", "been", "before", "being", "between", "both", "but", "by", "can",
    "could", "did", "do", "does", "doing", "during", "each", "either", "else", "ever", "few",
    "for", "from", "get", "gets", "got", "had", "has", "have", "having", "he", "her", "here",
    "hers", "him", "his", "how", "however", "i", "if", "in", "into", "is", "it", "its", "itself",
    "just", "let", "may", "me", "might", "more", "most", "much", "must", "my", "no", "nor", "not",
    "of", "off", "on", "once", "only", "or", "other", "our", "ours", "out", "over", "own",
    "please", "same", "shall", "she", "should", "so", "some", "such", "tell", "than", "that",
    "the", "their", "theirs", "them", "then", "there", "these", "they", "this", "those", "through",
    "to", "too", "under", "until", "up", "us", "very", "was", "we", "were", "what", "when",
    "where", "whether", "which", "while", "who", "whom", "whose", "why", "will", "with", "would",
    "yes", "you", "your", "yours",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grounding::{ground, Grounded};
    use crate::reply::ModelReply;

    fn source(number: usize, text: &str) -> Source {
        Source {
            number,
            document_id: number as i64,
            title: format!("Doc {number}"),
            locators: vec![],
            chunk_ids: vec![number as i64],
            text: text.to_string(),
            distance: 0.1 * number as f64,
            token_estimate: 1,
        }
    }

    #[test]
    fn the_first_source_leads_when_only_a_lower_one_shares_a_word() {
        // The reranker put the parental leave rule first; only the remote work rule shares a word ("home").
        let sources = vec![
            source(
                1,
                "New parents may take up to six months off. The first three are paid in full.",
            ),
            source(
                2,
                "Team members may work from home up to three days a week.",
            ),
        ];
        let question = "How long can I stay at home after my baby is born?";
        assert_eq!(
            extractive_answer(question, &sources, 500)
                .unwrap()
                .citations,
            vec![2]
        );
        let answer = extractive_answer_or_lead(question, &sources, 500).unwrap();
        assert_eq!(
            answer.answer,
            "New parents may take up to six months off. [1] The first three are paid in full. [1] \
             Team members may work from home up to three days a week. [2]"
        );
        assert_eq!(answer.citations, vec![1, 2]);
        // With a matching sentence elsewhere, the lead gets half the budget (its first sentence here), and the
        // match does not fit in what is left.
        let short = extractive_answer_or_lead(question, &sources, 100).unwrap();
        assert_eq!(
            short.answer,
            "New parents may take up to six months off. [1]"
        );
        assert_eq!(short.citations, vec![1]);
        // The room left after the lead takes the match.
        let both = extractive_answer_or_lead(question, &sources, 110).unwrap();
        assert_eq!(
            both.answer,
            "New parents may take up to six months off. [1] Team members may work from home up to three days a week. [2]"
        );
        // The lead and the match pass the grounding check like any extract.
        let reply = ModelReply {
            answer: answer.answer.clone(),
            citations: answer.citations.iter().map(|&n| n as i64).collect(),
            sufficient: true,
            reason: None,
        };
        assert!(matches!(
            ground(&reply, sources.len()),
            Grounded::Answered { .. }
        ));
    }

    #[test]
    fn a_paraphrase_with_no_shared_word_quotes_the_lead_of_the_first_source() {
        let sources = vec![
            source(1, "Salaries are paid on the last working day of each month. Transfers take a day. See [4]."),
            source(2, "The canteen opens at noon."),
        ];
        let question = "When do we get our wages?";
        assert_eq!(extractive_answer(question, &sources, 500), None);
        let lead = extractive_answer_or_lead(question, &sources, 500).expect("the lead is quoted");
        // Sentences that look like citation markers are never quoted, as in extractive_answer.
        assert_eq!(
            lead.answer,
            "Salaries are paid on the last working day of each month. [1] Transfers take a day. [1]"
        );
        assert_eq!(lead.citations, vec![1]);
        // Within the budget, whole sentences only.
        let short = extractive_answer_or_lead(question, &sources, 70).expect("one sentence fits");
        assert_eq!(
            short.answer,
            "Salaries are paid on the last working day of each month. [1]"
        );
        assert_eq!(extractive_answer_or_lead(question, &sources, 10), None);
        // A lexical match in the first source is quoted as extractive_answer quotes it.
        let matched = extractive_answer_or_lead("When are salaries paid?", &sources, 500).unwrap();
        assert_eq!(
            matched,
            extractive_answer("When are salaries paid?", &sources, 500).unwrap()
        );
        // And the grounding check accepts the lead as it accepts any extract.
        let reply = ModelReply {
            answer: lead.answer.clone(),
            citations: lead.citations.iter().map(|&n| n as i64).collect(),
            sufficient: true,
            reason: None,
        };
        assert!(matches!(
            ground(&reply, sources.len()),
            Grounded::Answered { .. }
        ));
    }

    fn handbook() -> Vec<Source> {
        vec![
            source(
                1,
                "Resignations must be made in writing. All staff must give thirty days notice before leaving. \
                 The office is closed on public holidays.",
            ),
            source(
                2,
                "Managers may agree a shorter notice period with the employee. Parking is free for all visitors.",
            ),
            source(3, "The cafeteria serves lunch from noon."),
        ]
    }

    fn assert_grounded(extract: &ExtractiveAnswer, sources_sent: usize) {
        let reply = ModelReply {
            answer: extract.answer.clone(),
            citations: extract.citations.iter().map(|&n| n as i64).collect(),
            sufficient: true,
            reason: None,
        };
        match ground(&reply, sources_sent) {
            Grounded::Answered {
                answer,
                kept,
                stripped,
            } => {
                assert_eq!(
                    answer, extract.answer,
                    "grounding leaves the extract unchanged"
                );
                assert_eq!(kept, extract.citations);
                assert!(stripped.is_empty());
            }
            other => panic!("extract failed grounding: {other:?}"),
        }
    }

    #[test]
    fn quotes_matching_sentences_verbatim_with_citations_in_source_order() {
        let sources = handbook();
        let extract =
            extractive_answer("How many days of notice do I have to give?", &sources, 400)
                .expect("the handbook answers this");
        assert_eq!(
            extract.answer,
            "All staff must give thirty days notice before leaving. [1] \
             Managers may agree a shorter notice period with the employee. [2]"
        );
        assert_eq!(extract.citations, vec![1, 2]);
        assert_grounded(&extract, sources.len());
    }

    #[test]
    fn quoted_sentences_are_substrings_of_their_sources() {
        let sources = handbook();
        let extract = extractive_answer("notices for managers", &sources, 400).expect("matches");
        for piece in extract.answer.split(" [") {
            let sentence = piece
                .split_once("] ")
                .map_or(piece, |(_, sentence)| sentence);
            if sentence.ends_with(']') || sentence.is_empty() {
                continue;
            }
            assert!(
                sources.iter().any(|s| s.text.contains(sentence)),
                "{sentence:?} is verbatim"
            );
        }
    }

    #[test]
    fn stemming_matches_inflected_forms() {
        assert_eq!(stem("notices"), stem("notice"));
        assert_eq!(stem("policies"), stem("policy"));
        assert_eq!(stem("giving"), stem("give"));
        assert_eq!(stem("requested"), stem("request"));
        assert_eq!(stem("classes"), stem("class"));
        assert_ne!(stem("status"), "statu");
        let terms: Vec<String> = content_terms("What is the company's notice policy?").collect();
        assert_eq!(terms, vec![stem("company"), stem("notice"), stem("policy")]);
    }

    #[test]
    fn budget_limits_the_sentences_and_prefers_the_best() {
        let sources = handbook();
        let best_only = "All staff must give thirty days notice before leaving. [1]";
        let extract =
            extractive_answer("give notice days", &sources, best_only.len()).expect("one fits");
        assert_eq!(extract.answer, best_only);
        assert_eq!(extract.citations, vec![1]);
        assert_eq!(extractive_answer("give notice days", &sources, 10), None);
    }

    #[test]
    fn rank_breaks_ties_between_equal_sentences() {
        let sources = vec![
            source(1, "Bicycles are allowed."),
            source(2, "Bicycles are welcome."),
        ];
        let extract = extractive_answer("bicycles", &sources, 30).expect("one fits");
        assert_eq!(extract.answer, "Bicycles are allowed. [1]");
    }

    #[test]
    fn headings_that_only_echo_the_question_give_way_to_sentences() {
        // A manual page: title, synopsis and heading lines repeat the question's words and end without a stop.
        let sources = vec![source(
            1,
            "CREATE DATABASE\n\nCREATE DATABASE — create a new database\n\nSynopsis\n\nCREATE DATABASE name\n\n\
             CREATE DATABASE creates a new PostgreSQL database.",
        )];
        let answer = extractive_answer("How do I create a new database?", &sources, 500).unwrap();
        assert_eq!(
            answer.answer,
            "CREATE DATABASE name [1] CREATE DATABASE creates a new PostgreSQL database. [1]"
        );
        // Only echoes match: they are quoted rather than nothing.
        let only_headings = vec![source(1, "Annual leave\n\nRemote work\n\nParking")];
        assert_eq!(
            extractive_answer("annual leave", &only_headings, 500)
                .unwrap()
                .answer,
            "Annual leave [1]"
        );
        // A sentence of the question's words that ends as a sentence answers a yes-or-no question.
        let rules = vec![source(
            1,
            "Pets are allowed.\n\nPets\n\nSmoking is not allowed.",
        )];
        assert_eq!(
            extractive_answer("Are pets allowed?", &rules, 500)
                .unwrap()
                .answer,
            "Pets are allowed. [1] Smoking is not allowed. [1]"
        );
    }

    #[test]
    fn nothing_in_common_gives_none() {
        assert_eq!(
            extractive_answer("Who won the football last night?", &handbook(), 400),
            None
        );
        assert_eq!(extractive_answer("What is it?", &handbook(), 400), None);
        assert_eq!(extractive_answer("notice", &[], 400), None);
        assert_eq!(extractive_answer("notice", &handbook(), 0), None);
    }

    #[test]
    fn sentences_with_bracket_numbers_are_not_quoted() {
        let sources = vec![
            source(
                1,
                "Notice is thirty days [3]. Notice for managers is agreed separately.",
            ),
            source(2, "Short notice [x] applies to interns."),
        ];
        let extract = extractive_answer("notice", &sources, 400).expect("clean sentences remain");
        assert!(!extract.answer.contains("[3]"));
        assert!(extract
            .answer
            .contains("Short notice [x] applies to interns. [2]"));
        assert_grounded(&extract, sources.len());
    }

    #[test]
    fn misnumbered_sources_are_ignored() {
        let sources = vec![
            source(1, "Unrelated text."),
            source(7, "Notice is thirty days."),
        ];
        assert_eq!(extractive_answer("notice", &sources, 400), None);
    }

    #[test]
    fn repeated_sentences_are_quoted_once() {
        let sources = vec![
            source(1, "Notice is thirty days."),
            source(2, "Notice is thirty days."),
        ];
        let extract = extractive_answer("notice days", &sources, 400).expect("matches");
        assert_eq!(extract.answer, "Notice is thirty days. [1]");
        assert_grounded(&extract, 2);
    }

    #[test]
    fn multilingual_text_does_not_panic() {
        let sources = vec![source(
            1,
            "Die Kündigungsfrist beträgt dreißig Tage. 通知期間は三十日です。",
        )];
        let extract = extractive_answer("Kündigungsfrist Tage", &sources, 200).expect("matches");
        assert_eq!(
            extract.answer,
            "Die Kündigungsfrist beträgt dreißig Tage. [1]"
        );
        assert_grounded(&extract, 1);
    }
}
