//! Positions in the original text and the boundaries a chunk may start or end on.
//!
//! Every position carries both its byte offset (to slice the `&str`) and its char offset (what callers
//! and PostgreSQL count). Char offsets are only ever derived by counting forward from an earlier known
//! position, so no scan goes back to the start of the text.

use std::ops::ControlFlow;

use unicode_segmentation::UnicodeSegmentation;

use crate::sentences::sentence_bound_indices;

/// A place between two chars of the original text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pos {
    pub(crate) byte: usize,
    pub(crate) char: usize,
}

impl Pos {
    pub(crate) const ORIGIN: Pos = Pos { byte: 0, char: 0 };

    /// The position at `byte`, which must be a char boundary at or after `self`.
    pub(crate) fn advanced_to(self, text: &str, byte: usize) -> Pos {
        Pos {
            byte,
            char: self.char + text[self.byte..byte].chars().count(),
        }
    }

    /// The position `count` chars further on, or the end of the text if it is closer.
    pub(crate) fn advanced_by_chars(self, text: &str, count: usize) -> Pos {
        let rest = &text[self.byte..];
        match rest.char_indices().nth(count) {
            Some((offset, _)) => Pos {
                byte: self.byte + offset,
                char: self.char + count,
            },
            None => Pos {
                byte: text.len(),
                char: self.char + rest.chars().count(),
            },
        }
    }
}

/// A half-open range of the original text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: Pos,
    pub(crate) end: Pos,
}

impl Span {
    pub(crate) fn chars(&self) -> usize {
        self.end.char - self.start.char
    }

    pub(crate) fn slice<'t>(&self, text: &'t str) -> &'t str {
        &text[self.start.byte..self.end.byte]
    }
}

pub(crate) fn is_line_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r' | '\u{0B}' | '\u{0C}' | '\u{85}' | '\u{2028}' | '\u{2029}'
    )
}

/// How many line breaks `c` adds to a whitespace run; two or more make the run a paragraph break.
///
/// CRLF counts once, and a form feed (the page break pdftotext emits) or U+2029 is a paragraph
/// break by itself.
pub(crate) fn break_weight(c: char, next: Option<char>) -> usize {
    match c {
        '\u{0C}' | '\u{2029}' => 2,
        '\r' => usize::from(next != Some('\n')),
        '\n' | '\u{0B}' | '\u{85}' | '\u{2028}' => 1,
        _ => 0,
    }
}

/// A run of whitespace chars holding at least one line break, as byte offsets into the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BreakRun {
    pub(crate) start: usize,
    pub(crate) end: usize,
    /// The run's [`break_weight`]s summed: two or more make it a paragraph break.
    pub(crate) breaks: usize,
}

/// The first [`BreakRun`] whose first line break lies in bytes `from..until` of `text`; the run itself
/// may reach past `until`. `floor`, at or before `from`, is a char boundary that does not lie inside a
/// whitespace run: the run is looked for back to there.
///
/// Only bytes that can begin a line break are looked at one by one, so text between breaks costs a
/// table lookup per byte instead of a char decode.
pub(crate) fn next_break_run(
    text: &str,
    floor: usize,
    from: usize,
    until: usize,
) -> Option<BreakRun> {
    let bytes = text.as_bytes();
    let until = until.min(bytes.len());
    let mut at = from;
    loop {
        at = first_possible_break(bytes, at, until)?;
        // `at` is a char boundary: every byte in the table is ASCII or a UTF-8 lead byte.
        let c = text[at..].chars().next()?;
        if !is_line_break(c) {
            at += c.len_utf8();
            continue;
        }
        // Most breaks are one LF between two visible ASCII chars (hard-wrapped lines): a run of one.
        let visible = |byte: Option<&u8>| byte.is_some_and(|&b| b.is_ascii_graphic());
        if c == '\n' && at > floor && visible(bytes.get(at - 1)) && visible(bytes.get(at + 1)) {
            return Some(BreakRun {
                start: at,
                end: at + 1,
                breaks: 1,
            });
        }
        let start = floor + text[floor..at].trim_end_matches(char::is_whitespace).len();
        let end = text.len() - text[at..].trim_start_matches(char::is_whitespace).len();
        let mut breaks = 0;
        let mut chars = text[start..end].chars().peekable();
        while let Some(c) = chars.next() {
            let next = chars.peek().copied().or_else(|| text[end..].chars().next());
            breaks += break_weight(c, next);
        }
        return Some(BreakRun { start, end, breaks });
    }
}

/// The first byte of `bytes[from..until]` that may begin a line break: a control byte up to CR, or a
/// UTF-8 lead byte (U+0085, U+2028 and U+2029 are the non-ASCII line breaks).
///
/// Eight bytes are tested at a time, since line breaks are a byte in a hundred or fewer in prose:
/// a word has such a byte when one of its bytes is below 0x0E or has its top bit set.
fn first_possible_break(bytes: &[u8], from: usize, until: usize) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH_BITS: u64 = u64::from_ne_bytes([0x80; 8]);
    let mut at = from;
    while at < until {
        if let Some(eight) = bytes.get(at..at + 8).filter(|_| at + 8 <= until) {
            let word = u64::from_ne_bytes(eight.try_into().expect("eight bytes"));
            // A borrow can only mark bytes after one that really is below 0x0E: no false negatives.
            let below_0x0e = word.wrapping_sub(ONES * 0x0E) & !word & HIGH_BITS;
            if (below_0x0e | (word & HIGH_BITS)) == 0 {
                at += 8;
                continue;
            }
        }
        if MAY_BEGIN_BREAK[usize::from(bytes[at])] {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// Bytes that begin a line break: \n \r VT FF, and the lead bytes of U+0085 (C2 85) and U+2028/U+2029
/// (E2 80 A8/A9).
const MAY_BEGIN_BREAK: [bool; 256] = {
    let mut table = [false; 256];
    table[0x0A] = true;
    table[0x0B] = true;
    table[0x0C] = true;
    table[0x0D] = true;
    table[0xC2] = true;
    table[0xE2] = true;
    table
};

/// A copy of `slice`, byte for byte the same length, in which line breaks that do not form a blank line
/// are spaces.
///
/// UAX #29 ends a sentence at every line break, which would turn each line of hard-wrapped prose (PDF
/// and HTML extracts) into a "sentence". Replacing a break by as many spaces as it has bytes keeps every
/// byte offset valid for the original, and non-whitespace chars stay where they were.
pub(crate) fn soften_line_breaks(slice: &str) -> String {
    let mut out = slice.as_bytes().to_vec();
    let mut from = 0;
    while let Some(run) = next_break_run(slice, from, from, slice.len()) {
        if run.breaks < 2 {
            for (offset, c) in slice[run.start..run.end].char_indices() {
                if is_line_break(c) {
                    let at = run.start + offset;
                    out[at..at + c.len_utf8()].fill(b' ');
                }
            }
        }
        from = run.end;
    }
    String::from_utf8(out).expect("only whole chars were replaced, by ASCII spaces")
}

/// Kinds of place a chunk may start on, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tier {
    /// The first non-blank char of a UAX #29 sentence.
    Sentence,
    /// A UAX #29 word boundary right after whitespace: the start of a word.
    WordAfterSpace,
    /// Any UAX #29 word boundary before a non-blank char (CJK ideographs, punctuation).
    Word,
    /// Any extended grapheme cluster boundary before a non-blank char.
    Grapheme,
}

pub(crate) const TIERS: [Tier; 4] = [
    Tier::Sentence,
    Tier::WordAfterSpace,
    Tier::Word,
    Tier::Grapheme,
];

/// Calls `visit`, in text order, with every position strictly inside `span` where a chunk may start
/// under `tier`; stops early when `visit` breaks.
///
/// Segmentation begins at `span.start`, which callers set on a boundary, so the boundaries found are those of
/// the whole text; the one exception is a chunk that starts after whitespace carrying combining marks (a space
/// followed by U+0301: whitespace is trimmed by the char, so the chunk starts at the mark, inside the
/// grapheme), where segmenting from the mark still finds every later boundary. Cost is linear in the span.
pub(crate) fn for_each_start(
    text: &str,
    span: Span,
    tier: Tier,
    mut visit: impl FnMut(Pos) -> ControlFlow<()>,
) {
    let slice = span.slice(text);
    let mut cursor = span.start;
    let mut emit = |offset: usize| {
        cursor = cursor.advanced_to(text, span.start.byte + offset);
        visit(cursor)
    };
    match tier {
        Tier::Sentence => {
            let softened = soften_line_breaks(slice);
            for (offset, piece) in sentence_bound_indices(&softened) {
                let blank_prefix = piece.len() - piece.trim_start().len();
                if offset == 0 || blank_prefix == piece.len() {
                    continue;
                }
                if emit(offset + blank_prefix).is_break() {
                    return;
                }
            }
        }
        Tier::WordAfterSpace if slice.is_ascii() => {
            // In ASCII text every non-blank char after a blank one starts a UAX #29 word: no word rule
            // joins whitespace to what follows it.
            let bytes = slice.as_bytes();
            for offset in 1..bytes.len() {
                let after_space = char::from(bytes[offset - 1]).is_whitespace();
                if after_space
                    && !char::from(bytes[offset]).is_whitespace()
                    && emit(offset).is_break()
                {
                    return;
                }
            }
        }
        Tier::WordAfterSpace | Tier::Word => {
            let mut after_space = false;
            for (offset, word) in slice.split_word_bound_indices() {
                let eligible = offset > 0
                    && !word.starts_with(char::is_whitespace)
                    && (after_space || tier == Tier::Word);
                if eligible && emit(offset).is_break() {
                    return;
                }
                after_space = word.ends_with(char::is_whitespace);
            }
        }
        Tier::Grapheme => {
            for (offset, grapheme) in slice.grapheme_indices(true) {
                let eligible = offset > 0 && !grapheme.starts_with(char::is_whitespace);
                if eligible && emit(offset).is_break() {
                    return;
                }
            }
        }
    }
}

/// How far before the first position of interest a resumed segmentation starts looking for a place to
/// begin.
const RESYNC_MARGIN_CHARS: usize = 64;

/// Where to begin segmenting `span` for `tier` when only starts at or after `from_char` matter.
///
/// Searching the end of a 10,000-char chunk should not segment all of it again. Segmentation may begin
/// wherever the boundaries after it do not depend on the text before it: at a word that follows
/// whitespace (for every tier), or between two ASCII chars other than CR LF (for graphemes). Such a
/// place is looked for in the few chars before `from_char`; without one, the whole span is segmented.
/// Finding it walks chars only, which is far cheaper than segmenting.
pub(crate) fn resync_point(text: &str, span: Span, from_char: usize, tier: Tier) -> Pos {
    if from_char >= span.end.char || from_char <= span.start.char + RESYNC_MARGIN_CHARS {
        return span.start;
    }
    let look_from = from_char - RESYNC_MARGIN_CHARS;
    let slice = span.slice(text);
    let offset = if slice.len() == span.chars() {
        // As many bytes as chars: ASCII, where chars are bytes.
        look_from - span.start.char
    } else {
        let Some((offset, _)) = slice
            .char_indices()
            .rev()
            .nth(span.end.char - 1 - look_from)
        else {
            return span.start;
        };
        offset
    };
    let mut before = slice[..offset].chars().next_back();
    let mut pos = Pos {
        byte: span.start.byte + offset,
        char: look_from,
    };
    for c in slice[offset..].chars() {
        if pos.char >= from_char {
            break;
        }
        if let Some(previous) = before {
            let after_space = previous.is_whitespace()
                && !c.is_whitespace()
                && (c.is_ascii() || c.is_alphanumeric());
            let between_ascii = tier == Tier::Grapheme
                && previous.is_ascii()
                && c.is_ascii()
                && !(previous == '\r' && c == '\n');
            if after_space || between_ascii {
                return pos;
            }
        }
        before = Some(c);
        pos = Pos {
            byte: pos.byte + c.len_utf8(),
            char: pos.char + 1,
        };
    }
    span.start
}

/// The end of the non-blank text before `cut`, never moving before `floor`.
pub(crate) fn trim_end_before(text: &str, floor: Pos, cut: Pos) -> Pos {
    let kept = text[floor.byte..cut.byte].trim_end();
    let byte = floor.byte + kept.len();
    Pos {
        byte,
        char: cut.char - text[byte..cut.byte].chars().count(),
    }
}

/// The first position at or after `from` (and before `limit_byte`) that is not whitespace, or `limit_byte`
/// itself when there is none: where the chunk after a hard cut starts. Whitespace chars, not graphemes: a
/// space that carries combining marks is one grapheme that starts with whitespace, and skipping such graphemes
/// whole left a run of them (" ́ ́ ́") after a hard cut out of every chunk. Asking the segmenter for the next
/// grapheme also measured the whole of it: after a cut inside one grapheme of a million combining marks (or of
/// emoji joined by U+200D), the whole rest of it at every cut, which made such a text take the square of its
/// length (a 6 MB one held the worker for five minutes). The chunk then starts with the marks, without the
/// space they sat on.
pub(crate) fn skip_blank(text: &str, from: Pos, limit_byte: usize) -> Pos {
    let rest = &text[from.byte..limit_byte];
    let skipped = &rest[..rest.len() - rest.trim_start().len()];
    Pos {
        byte: from.byte + skipped.len(),
        char: from.char + skipped.chars().count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softening_keeps_byte_length_and_paragraph_breaks() {
        let input = "one\ntwo\u{2028}three\r\nfour\n\nfive\u{85}six";
        let softened = soften_line_breaks(input);
        assert_eq!(softened.len(), input.len());
        assert_eq!(softened, "one two   three  four\n\nfive  six");
    }

    #[test]
    fn form_feed_counts_as_a_paragraph_break() {
        assert_eq!(soften_line_breaks("a\u{0C}b"), "a\u{0C}b");
        assert_eq!(soften_line_breaks("a\r\rb"), "a\r\rb");
        assert_eq!(soften_line_breaks("a\rb"), "a b");
    }

    #[test]
    fn sentence_starts_skip_the_span_start_and_blank_pieces() {
        let text = "First one. Second one.\n\nThird.";
        let span = Span {
            start: Pos::ORIGIN,
            end: Pos::ORIGIN.advanced_to(text, text.len()),
        };
        let mut starts = Vec::new();
        for_each_start(text, span, Tier::Sentence, |pos| {
            starts.push(pos.char);
            ControlFlow::Continue(())
        });
        assert_eq!(starts, vec![11, 24]);
    }

    #[test]
    fn word_starts_after_space_exclude_punctuation() {
        let text = "alpha, beta";
        let span = Span {
            start: Pos::ORIGIN,
            end: Pos::ORIGIN.advanced_to(text, text.len()),
        };
        let mut after_space = Vec::new();
        let mut any_word = Vec::new();
        for_each_start(text, span, Tier::WordAfterSpace, |pos| {
            after_space.push(pos.char);
            ControlFlow::Continue(())
        });
        for_each_start(text, span, Tier::Word, |pos| {
            any_word.push(pos.char);
            ControlFlow::Continue(())
        });
        assert_eq!(after_space, vec![7]);
        assert_eq!(any_word, vec![5, 7]);
    }

    #[test]
    fn resync_points_find_the_same_starts_as_a_full_segmentation() {
        let text = format!(
            "{} Last sentence here, with words. {}",
            "Opening words of a long sentence that runs on. ".repeat(4),
            "base64AAAAbbbbCCCCddddEEEE".repeat(6)
        );
        let span = Span {
            start: Pos::ORIGIN,
            end: Pos::ORIGIN.advanced_to(&text, text.len()),
        };
        for tier in TIERS {
            for from_char in [0, 70, 150, 200, 230, 300] {
                let starts_from = |search: Span| {
                    let mut starts = Vec::new();
                    for_each_start(&text, search, tier, |pos| {
                        if pos.char >= from_char {
                            starts.push(pos);
                        }
                        ControlFlow::Continue(())
                    });
                    starts
                };
                let resynced = Span {
                    start: resync_point(&text, span, from_char, tier),
                    end: span.end,
                };
                assert!(resynced.start.char < from_char.max(1) || resynced.start == span.start);
                assert_eq!(
                    resynced.start,
                    Pos::ORIGIN.advanced_to(&text, resynced.start.byte)
                );
                assert_eq!(
                    starts_from(resynced),
                    starts_from(span),
                    "{tier:?} from {from_char}"
                );
            }
        }
    }

    #[test]
    fn trimming_and_skipping_count_chars_not_bytes() {
        let text = "é  \u{3000}ü";
        let end = Pos::ORIGIN.advanced_to(text, text.len());
        let trimmed = trim_end_before(text, Pos::ORIGIN, Pos { byte: 7, char: 4 });
        assert_eq!(trimmed, Pos { byte: 2, char: 1 });
        assert_eq!(
            skip_blank(text, trimmed, end.byte),
            Pos { byte: 7, char: 4 }
        );
        assert_eq!(
            Pos::ORIGIN.advanced_by_chars(text, 10),
            Pos { byte: 9, char: 5 }
        );
    }
}
