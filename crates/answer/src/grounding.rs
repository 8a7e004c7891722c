//! Checking the model's citations against the sources that were actually sent.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::reply::{saturating_integer, ModelReply};

/// Refusal reason when the model says the sources are insufficient but gives no reason.
pub const DEFAULT_INSUFFICIENT_REASON: &str =
    "The sources retrieved do not contain enough information to answer.";
/// Refusal reason when no valid citation survives the check.
pub const NO_VALID_CITATION_REASON: &str = "The answer cited no source that was retrieved.";
/// Refusal reason when the model answered with nothing (or with nothing but citation markers).
pub const EMPTY_ANSWER_REASON: &str = "The model returned an empty answer.";
/// The note [`mark_truncated`] appends.
pub const TRUNCATION_NOTE: &str = "[answer truncated: the model reached its output limit]";

/// The verdict on a model reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Grounded {
    /// The answer stands, citing only sources that were sent.
    Answered {
        /// The answer text with invalid markers removed.
        answer: String,
        /// The valid source numbers cited in the text or the citations array, ascending, each once.
        kept: Vec<usize>,
        /// The invalid numbers that were removed, ascending, each once.
        stripped: Vec<i64>,
    },
    /// No answer is given.
    Refused {
        /// Why, in words for the user.
        reason: String,
        /// The invalid numbers that were removed, ascending, each once (empty when the model itself declined).
        stripped: Vec<i64>,
    },
}

impl Grounded {
    /// The invalid citation numbers removed from the reply.
    pub fn stripped(&self) -> &[i64] {
        match self {
            Grounded::Answered { stripped, .. } | Grounded::Refused { stripped, .. } => stripped,
        }
    }
}

/// Checks a reply's citations against the `sources_sent` numbered sources (valid numbers are 1..=sources_sent).
///
/// Rules, in order:
/// 1. `sufficient: false` refuses with the model's reason (or [`DEFAULT_INSUFFICIENT_REASON`]).
/// 2. Every citation, from the `citations` array and from the `[n]`, `[n, m]`, `[n-m]`, `[n][m]` markers in the text,
///    is checked. Invalid numbers (0, negative, beyond the sources sent) are stripped from the list and their markers
///    removed from the text, tidying the space left behind; in a group such as `[1, 9]` only `[1]` remains.
///    Brackets holding anything but numbers (`[x]`, `[see above]`) are plain text, not citations.
/// 3. An answer with no text besides citation markers refuses with [`EMPTY_ANSWER_REASON`].
/// 4. An answer with no valid citation left refuses with [`NO_VALID_CITATION_REASON`].
///
/// `kept` is the set of valid numbers from the text and the array together: a valid number the array lists but the
/// text never marks still counts, since the model says it drew on that source and the source was sent.
pub fn ground(reply: &ModelReply, sources_sent: usize) -> Grounded {
    if !reply.sufficient {
        let reason = reply
            .reason
            .as_deref()
            .map(str::trim)
            .filter(|reason| !reason.is_empty())
            .unwrap_or(DEFAULT_INSUFFICIENT_REASON);
        return Grounded::Refused {
            reason: reason.to_string(),
            stripped: Vec::new(),
        };
    }

    let checked = check_markers(&reply.answer, sources_sent);
    let mut kept = checked.valid;
    let mut stripped = checked.invalid;
    for &number in &reply.citations {
        match valid_number(number, sources_sent) {
            Some(valid) => kept.insert(valid),
            None => stripped.insert(number),
        };
    }
    let stripped: Vec<i64> = stripped.into_iter().collect();

    if !checked.has_content {
        return Grounded::Refused {
            reason: EMPTY_ANSWER_REASON.to_string(),
            stripped,
        };
    }
    if kept.is_empty() {
        return Grounded::Refused {
            reason: NO_VALID_CITATION_REASON.to_string(),
            stripped,
        };
    }
    Grounded::Answered {
        answer: checked.text.trim().to_string(),
        kept: kept.into_iter().collect(),
        stripped,
    }
}

/// Appends [`TRUNCATION_NOTE`] to an answer cut off at the output limit (once, however often it is called).
pub fn mark_truncated(answer: &str) -> String {
    let answer = answer.trim_end();
    if answer.ends_with(TRUNCATION_NOTE) {
        answer.to_string()
    } else if answer.is_empty() {
        TRUNCATION_NOTE.to_string()
    } else {
        format!("{answer} {TRUNCATION_NOTE}")
    }
}

fn valid_number(number: i64, sources_sent: usize) -> Option<usize> {
    usize::try_from(number)
        .ok()
        .filter(|&number| number >= 1 && number <= sources_sent)
}

/// A citation marker found in answer text: byte range and the numbers it cites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Marker {
    pub start: usize,
    pub end: usize,
    pub numbers: Vec<i64>,
}

/// Longest bracket body considered a citation; longer brackets are prose.
const MAX_MARKER_BODY_BYTES: usize = 64;
/// Widest range (`[1-20]`) expanded; anything wider is not a plausible citation.
const MAX_RANGE_SPAN: i64 = 20;

/// Finds the citation markers in a text, left to right, not overlapping.
pub(crate) fn find_markers(text: &str) -> Vec<Marker> {
    let mut markers = Vec::new();
    let mut search_from = 0;
    while let Some(offset) = text[search_from..].find('[') {
        let start = search_from + offset;
        let body_start = start + 1;
        let rest = &text[body_start..];
        // Stopping at the next '[' keeps the scan linear however many brackets the text holds.
        let stop = rest.find(['[', ']', '\n']);
        if let Some(body_len) =
            stop.filter(|&len| rest[len..].starts_with(']') && len <= MAX_MARKER_BODY_BYTES)
        {
            if let Some(numbers) = parse_marker_body(&rest[..body_len]) {
                let end = body_start + body_len + 1;
                markers.push(Marker {
                    start,
                    end,
                    numbers,
                });
                search_from = end;
                continue;
            }
        }
        search_from = body_start;
    }
    markers
}

/// Whether a text holds anything that [`ground`] would read as a citation.
pub(crate) fn contains_marker(text: &str) -> bool {
    !find_markers(text).is_empty()
}

/// Reads "1", "1, 2", "1; 2", "1 2", "1-3", "Source 2" into numbers; `None` if the body is anything else.
pub(crate) fn parse_marker_body(body: &str) -> Option<Vec<i64>> {
    let mut body = body.trim();
    for prefix in ["sources", "source"] {
        if body.len() >= prefix.len() && body.is_char_boundary(prefix.len()) {
            let (head, tail) = body.split_at(prefix.len());
            if head.eq_ignore_ascii_case(prefix) {
                body = tail.trim_start_matches([':', ' ']);
                break;
            }
        }
    }
    let mut numbers = Vec::new();
    for part in body.split([',', ';']) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        if let Some((low, high)) = parse_range(part) {
            let span = high.checked_sub(low)?;
            if !(0..=MAX_RANGE_SPAN).contains(&span) {
                return None;
            }
            numbers.extend(low..=high);
            continue;
        }
        for token in part.split_whitespace() {
            numbers.push(parse_integer(token)?);
        }
    }
    (!numbers.is_empty()).then_some(numbers)
}

fn parse_range(part: &str) -> Option<(i64, i64)> {
    let (low, high) = part.split_once(['-', '–', '—'])?;
    let (low, high) = (low.trim(), high.trim());
    let is_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (is_digits(low) && is_digits(high)).then(|| {
        (
            saturating_integer(low, false),
            saturating_integer(high, false),
        )
    })
}

fn parse_integer(token: &str) -> Option<i64> {
    let (negative, digits) = match token.strip_prefix('-') {
        Some(digits) => (true, digits),
        None => (false, token.strip_prefix('+').unwrap_or(token)),
    };
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| saturating_integer(digits, negative))
}

/// The answer text after the marker check, and what the markers cited.
struct CheckedText {
    text: String,
    valid: BTreeSet<usize>,
    invalid: BTreeSet<i64>,
    /// Whether anything besides markers and punctuation is left.
    has_content: bool,
}

/// Punctuation that attaches to the preceding word, so no space may be left before it.
fn attaches_left(c: char) -> bool {
    matches!(
        c,
        '.' | ','
            | ';'
            | ':'
            | '!'
            | '?'
            | ')'
            | ']'
            | '}'
            | '…'
            | '»'
            | '”'
            | '’'
            | '。'
            | '，'
            | '、'
    )
}

fn check_markers(answer: &str, sources_sent: usize) -> CheckedText {
    let mut checked = CheckedText {
        text: String::with_capacity(answer.len()),
        valid: BTreeSet::new(),
        invalid: BTreeSet::new(),
        has_content: false,
    };
    // After a marker removed at the start of a line, the space that followed it would be left dangling.
    let mut drop_leading_space = false;
    let mut cursor = 0;

    for marker in find_markers(answer) {
        push_segment(
            &mut checked,
            &answer[cursor..marker.start],
            &mut drop_leading_space,
        );
        let mut kept_here: Vec<usize> = Vec::new();
        let mut rewritten = false;
        for &number in &marker.numbers {
            match valid_number(number, sources_sent) {
                Some(valid) => {
                    checked.valid.insert(valid);
                    if kept_here.contains(&valid) {
                        rewritten = true;
                    } else {
                        kept_here.push(valid);
                    }
                }
                None => {
                    checked.invalid.insert(number);
                    rewritten = true;
                }
            }
        }
        if kept_here.is_empty() {
            drop_leading_space =
                remove_marker(&mut checked.text, answer[marker.end..].chars().next());
        } else {
            drop_leading_space = false;
            if rewritten {
                let list: Vec<String> = kept_here.iter().map(usize::to_string).collect();
                checked.text.push('[');
                checked.text.push_str(&list.join(", "));
                checked.text.push(']');
            } else {
                checked.text.push_str(&answer[marker.start..marker.end]);
            }
        }
        cursor = marker.end;
    }
    push_segment(&mut checked, &answer[cursor..], &mut drop_leading_space);
    checked
}

fn push_segment(checked: &mut CheckedText, segment: &str, drop_leading_space: &mut bool) {
    let segment = if *drop_leading_space {
        segment.trim_start_matches([' ', '\t'])
    } else {
        segment
    };
    if !segment.is_empty() {
        *drop_leading_space = false;
    }
    checked.has_content |= segment.chars().any(char::is_alphanumeric);
    checked.text.push_str(segment);
}

/// Tidies the text where a marker was dropped; returns whether spaces after the marker must be dropped too.
fn remove_marker(text: &mut String, next: Option<char>) -> bool {
    let kept_len = text.trim_end_matches([' ', '\t']).len();
    let had_space = kept_len < text.len();
    text.truncate(kept_len);
    if text.is_empty() || text.ends_with('\n') {
        return true;
    }
    match next {
        Some(c) if had_space && !c.is_whitespace() && !attaches_left(c) => text.push(' '),
        _ => {}
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(answer: &str, citations: &[i64]) -> ModelReply {
        ModelReply {
            answer: answer.to_string(),
            citations: citations.to_vec(),
            sufficient: true,
            reason: None,
        }
    }

    fn answered(grounded: Grounded) -> (String, Vec<usize>, Vec<i64>) {
        match grounded {
            Grounded::Answered {
                answer,
                kept,
                stripped,
            } => (answer, kept, stripped),
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    #[test]
    fn valid_citations_are_kept_untouched() {
        let (answer, kept, stripped) = answered(ground(
            &reply(
                "Thirty days for all staff [1]. Managers may agree otherwise [2].",
                &[1, 2],
            ),
            6,
        ));
        assert_eq!(
            answer,
            "Thirty days for all staff [1]. Managers may agree otherwise [2]."
        );
        assert_eq!(kept, vec![1, 2]);
        assert!(stripped.is_empty());
    }

    #[test]
    fn insufficient_refuses_with_the_models_reason() {
        let mut declined = reply("", &[]);
        declined.sufficient = false;
        declined.reason = Some(" The handbook says nothing about football. ".into());
        assert_eq!(
            ground(&declined, 6),
            Grounded::Refused {
                reason: "The handbook says nothing about football.".into(),
                stripped: vec![]
            }
        );
        declined.reason = None;
        assert_eq!(
            ground(&declined, 6),
            Grounded::Refused {
                reason: DEFAULT_INSUFFICIENT_REASON.into(),
                stripped: vec![]
            }
        );
    }

    #[test]
    fn insufficient_refuses_even_with_an_answer() {
        let mut hedged = reply("Probably thirty days [1].", &[1]);
        hedged.sufficient = false;
        assert!(matches!(ground(&hedged, 6), Grounded::Refused { .. }));
    }

    #[test]
    fn invented_citation_is_stripped_from_list_and_text() {
        let (answer, kept, stripped) = answered(ground(
            &reply(
                "Thirty days [1]. Managers may agree otherwise [9].",
                &[1, 9],
            ),
            6,
        ));
        assert_eq!(answer, "Thirty days [1]. Managers may agree otherwise.");
        assert_eq!(kept, vec![1]);
        assert_eq!(stripped, vec![9]);
    }

    #[test]
    fn all_invented_refuses_and_lists_them() {
        let grounded = ground(&reply("Thirty days [7]. Or sixty [9][12].", &[7, 9]), 6);
        assert_eq!(
            grounded,
            Grounded::Refused {
                reason: NO_VALID_CITATION_REASON.into(),
                stripped: vec![7, 9, 12]
            }
        );
    }

    #[test]
    fn no_citation_at_all_refuses() {
        let grounded = ground(&reply("Thirty days.", &[]), 6);
        assert_eq!(
            grounded,
            Grounded::Refused {
                reason: NO_VALID_CITATION_REASON.into(),
                stripped: vec![]
            }
        );
    }

    #[test]
    fn duplicates_are_collapsed() {
        let (answer, kept, stripped) = answered(ground(
            &reply("A [2][2]. B [2, 2, 9]. C [1].", &[2, 1, 2, 9, 9]),
            3,
        ));
        assert_eq!(answer, "A [2][2]. B [2]. C [1].");
        assert_eq!(kept, vec![1, 2]);
        assert_eq!(stripped, vec![9]);
    }

    #[test]
    fn out_of_range_markers_are_stripped() {
        let (answer, kept, stripped) = answered(ground(
            &reply("Zero [0], minus [-1], far [4], fine [3].", &[]),
            3,
        ));
        assert_eq!(answer, "Zero, minus, far, fine [3].");
        assert_eq!(kept, vec![3]);
        assert_eq!(stripped, vec![-1, 0, 4]);
    }

    #[test]
    fn group_keeps_its_valid_members() {
        let (answer, kept, stripped) =
            answered(ground(&reply("Thirty days [1, 9]; sixty [9; 2].", &[]), 6));
        assert_eq!(answer, "Thirty days [1]; sixty [2].");
        assert_eq!(kept, vec![1, 2]);
        assert_eq!(stripped, vec![9]);
    }

    #[test]
    fn malformed_brackets_are_plain_text() {
        let (answer, kept, stripped) = answered(ground(
            &reply(
                "See [x] and [see above] and [1a] and [] and [1, x] and [1-100] but [2].",
                &[],
            ),
            6,
        ));
        assert_eq!(
            answer,
            "See [x] and [see above] and [1a] and [] and [1, x] and [1-100] but [2]."
        );
        assert_eq!(kept, vec![2]);
        assert!(stripped.is_empty());
    }

    #[test]
    fn other_marker_forms_are_read() {
        let (answer, kept, stripped) =
            answered(ground(&reply("A [1-3]. B [Source 5]. C [ 6 ].", &[]), 4));
        assert_eq!(answer, "A [1-3]. B. C.");
        assert_eq!(kept, vec![1, 2, 3]);
        assert_eq!(stripped, vec![5, 6]);
    }

    #[test]
    fn array_only_citation_counts_as_kept() {
        let (answer, kept, _) = answered(ground(&reply("Thirty days.", &[4]), 6));
        assert_eq!(answer, "Thirty days.");
        assert_eq!(kept, vec![4]);
    }

    #[test]
    fn invalid_array_entries_are_stripped_even_when_the_text_is_fine() {
        let (_, kept, stripped) = answered(ground(&reply("Thirty days [1].", &[1, 0, 42]), 6));
        assert_eq!(kept, vec![1]);
        assert_eq!(stripped, vec![0, 42]);
    }

    #[test]
    fn removal_leaves_tidy_spacing() {
        let cases = [
            ("Days [9] and more [1].", "Days and more [1]."),
            ("[9] Starts here [1].", "Starts here [1]."),
            ("Line one [9]\n[9] line two [1].", "Line one\nline two [1]."),
            ("Glued[9]word [1].", "Gluedword [1]."),
            ("Spaced [9]word [1].", "Spaced word [1]."),
            ("Twice [9][8]. Next [1].", "Twice. Next [1]."),
            ("Mixed [9][1].", "Mixed [1]."),
            ("(see [9]) now [1]", "(see) now [1]"),
            ("Trailing [1] [9]", "Trailing [1]"),
        ];
        for (input, expected) in cases {
            let (answer, _, _) = answered(ground(&reply(input, &[]), 2));
            assert_eq!(answer, expected, "for {input:?}");
        }
    }

    #[test]
    fn empty_answers_refuse() {
        for text in ["", "   ", "[1]", "[1]. [2]"] {
            assert_eq!(
                ground(&reply(text, &[1]), 6),
                Grounded::Refused {
                    reason: EMPTY_ANSWER_REASON.into(),
                    stripped: vec![]
                },
                "for {text:?}"
            );
        }
    }

    #[test]
    fn huge_numbers_do_not_overflow() {
        let grounded = ground(
            &reply("A [99999999999999999999999] B [1].", &[i64::MAX, i64::MIN]),
            6,
        );
        assert_eq!(grounded.stripped(), &[i64::MIN, i64::MAX]);
    }

    #[test]
    fn unclosed_and_nested_brackets_do_not_confuse_the_scan() {
        let (answer, kept, stripped) =
            answered(ground(&reply("Open [1 and [[2]] and [9 and [3]", &[]), 3));
        assert_eq!(answer, "Open [1 and [[2]] and [9 and [3]");
        assert_eq!(kept, vec![2, 3]);
        assert!(stripped.is_empty());
    }

    #[test]
    fn truncation_note_is_appended_once_and_is_not_a_citation() {
        let marked = mark_truncated("Thirty days [1]. Managers  ");
        assert_eq!(
            marked,
            format!("Thirty days [1]. Managers {TRUNCATION_NOTE}")
        );
        assert_eq!(mark_truncated(&marked), marked);
        let (answer, kept, _) = answered(ground(&reply(&marked, &[]), 1));
        assert_eq!(answer, marked);
        assert_eq!(kept, vec![1]);
    }

    #[test]
    fn grounded_serialises_with_an_outcome_tag() {
        let value = serde_json::to_value(ground(&reply("A [1].", &[]), 1)).expect("serialises");
        assert_eq!(value["outcome"], "answered");
        assert_eq!(value["kept"], serde_json::json!([1]));
    }
}
