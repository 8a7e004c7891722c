//! UAX #29 sentence boundaries, exactly as `unicode-segmentation` finds them, with a fast path for ASCII.
//!
//! Sentence segmentation was two fifths of the chunker's time: the crate looks every char up in a
//! Unicode table by binary search. Most text that reaches it is ASCII plus a few common symbols (no-break
//! spaces, dashes, curly quotes, Latin-1 letters), whose categories fit in a small table, and there a
//! boundary can only follow `.`, `!`, `?` or a line break, so everything between those is crossed
//! without looking at it char by char. [`FastBreaks`] runs the crate's own state machine (same states,
//! same rule order) on such text; text with any other char goes to the crate itself. The tests check the
//! table and the machine against the crate, char by char and on generated text.

use unicode_segmentation::{USentenceBoundIndices, UnicodeSegmentation};

/// The pieces between consecutive sentence boundaries of `text`, with their byte offsets: the same
/// sequence as `text.split_sentence_bound_indices()`.
pub(crate) fn sentence_bound_indices(text: &str) -> SentenceBoundIndices<'_> {
    if FastBreaks::covers(text) {
        SentenceBoundIndices::Fast {
            text,
            breaks: FastBreaks::new(),
            start: None,
        }
    } else {
        SentenceBoundIndices::Unicode(text.split_sentence_bound_indices())
    }
}

pub(crate) enum SentenceBoundIndices<'t> {
    Fast {
        text: &'t str,
        breaks: FastBreaks,
        start: Option<usize>,
    },
    Unicode(USentenceBoundIndices<'t>),
}

impl<'t> Iterator for SentenceBoundIndices<'t> {
    type Item = (usize, &'t str);

    fn next(&mut self) -> Option<(usize, &'t str)> {
        match self {
            SentenceBoundIndices::Unicode(inner) => inner.next(),
            SentenceBoundIndices::Fast {
                text,
                breaks,
                start,
            } => {
                if start.is_none() {
                    *start = Some(breaks.next_break(text)?);
                }
                let from = (*start)?;
                let to = breaks.next_break(text)?;
                *start = Some(to);
                Some((from, &text[from..to]))
            }
        }
    }
}

/// A sentence-break category, as `unicode-segmentation`'s table names them; only those that chars of
/// [`category`]'s table have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cat {
    Cr,
    Lf,
    Sp,
    Lower,
    Upper,
    Numeric,
    ATerm,
    STerm,
    Close,
    SContinue,
    Other,
}

const fn ascii_category(byte: u8) -> Cat {
    match byte {
        b'\r' => Cat::Cr,
        b'\n' => Cat::Lf,
        b'\t' | 0x0B | 0x0C | b' ' => Cat::Sp,
        b'a'..=b'z' => Cat::Lower,
        b'A'..=b'Z' => Cat::Upper,
        b'0'..=b'9' => Cat::Numeric,
        b'.' => Cat::ATerm,
        b'!' | b'?' => Cat::STerm,
        b'"' | b'\'' | b'(' | b')' | b'[' | b']' | b'{' | b'}' => Cat::Close,
        b',' | b'-' | b':' | b';' => Cat::SContinue,
        _ => Cat::Other,
    }
}

const ASCII_CATEGORIES: [Cat; 128] = {
    let mut table = [Cat::Other; 128];
    let mut byte = 0;
    while byte < 128 {
        table[byte] = ascii_category(byte as u8);
        byte += 1;
    }
    table
};

/// The category of `c` when it is one of the chars the fast path knows: ASCII, Latin-1 and the
/// punctuation common in extracted prose. Categories with rules of their own that this module does
/// not run (`Sep`, `OLetter`, `Extend`, `Format`) and non-ASCII terminators are left out, so text that
/// has them goes to the crate.
fn category(c: char) -> Option<Cat> {
    if c.is_ascii() {
        return Some(ASCII_CATEGORIES[c as usize]);
    }
    Some(match c {
        '\u{A0}' | '\u{2002}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => Cat::Sp,
        '\u{AA}' | '\u{B5}' | '\u{BA}' | '\u{DF}'..='\u{F6}' | '\u{F8}'..='\u{FF}' => Cat::Lower,
        '\u{C0}'..='\u{D6}' | '\u{D8}'..='\u{DE}' => Cat::Upper,
        '\u{AB}' | '\u{BB}' | '\u{2018}'..='\u{201F}' | '\u{2039}' | '\u{203A}' => Cat::Close,
        '\u{2013}' | '\u{2014}' => Cat::SContinue,
        '\u{A1}'..='\u{A9}'
        | '\u{AC}'
        | '\u{AE}'..='\u{B4}'
        | '\u{B6}'..='\u{B9}'
        | '\u{BC}'..='\u{BF}' => Cat::Other,
        '\u{D7}' | '\u{F7}' | '\u{2010}'..='\u{2012}' | '\u{2015}' | '\u{2020}'..='\u{2023}' => {
            Cat::Other
        }
        '\u{2026}' | '\u{2030}' | '\u{2032}' | '\u{2033}' | '\u{20AC}' | '\u{2122}' => Cat::Other,
        '\u{2190}'..='\u{21FF}' | '\u{2200}'..='\u{22FF}' | '\u{2500}'..='\u{257F}' => Cat::Other,
        _ => return None,
    })
}

/// The category of the char `text` starts with.
fn first_category(text: &str) -> Option<(Cat, usize)> {
    let c = text.chars().next()?;
    Some((category(c)?, c.len_utf8()))
}

/// Whether a byte of this category can end a sentence or begin the context in which one ends.
const fn may_end_sentence(cat: Cat) -> bool {
    matches!(cat, Cat::ATerm | Cat::STerm | Cat::Cr | Cat::Lf)
}

/// The offset of the first byte of `bytes` that [`may_end_sentence`], or the length.
///
/// Eight bytes are tested at a time: sentences are tens of bytes long, and the five bytes looked
/// for are ASCII, so a word holds one of them exactly when one of its bytes equals one of them.
fn first_possible_end(bytes: &[u8]) -> usize {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH_BITS: u64 = u64::from_ne_bytes([0x80; 8]);
    let has_byte = |word: u64, byte: u8| {
        let xored = word ^ (ONES * u64::from(byte));
        xored.wrapping_sub(ONES) & !xored & HIGH_BITS != 0
    };
    let mut at = 0;
    while let Some(eight) = bytes.get(at..at + 8) {
        let word = u64::from_ne_bytes(eight.try_into().expect("eight bytes"));
        if [b'.', b'!', b'?', b'\r', b'\n']
            .iter()
            .any(|&byte| has_byte(word, byte))
        {
            break;
        }
        at += 8;
    }
    bytes[at..]
        .iter()
        .position(|&byte| byte.is_ascii() && may_end_sentence(ASCII_CATEGORIES[usize::from(byte)]))
        .map_or(bytes.len(), |offset| at + offset)
}

/// One slot of the crate's four-slot history of what came before the current position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Sot,
    Eot,
    Other,
    Cr,
    Lf,
    ATerm,
    UpperLower,
    ClosePlus,
    SpPlus,
    STerm,
}

impl Part {
    fn is_term(self) -> bool {
        matches!(self, Part::ATerm | Part::STerm)
    }
}

#[derive(Debug, Clone, Copy)]
struct State([Part; 4]);

impl State {
    fn next(self, cat: Cat) -> State {
        let parts = self.0;
        match (parts[3], cat) {
            (Part::ClosePlus, Cat::Close) | (Part::SpPlus, Cat::Sp) => self,
            _ => State([
                parts[1],
                parts[2],
                parts[3],
                match cat {
                    Cat::Cr => Part::Cr,
                    Cat::Lf => Part::Lf,
                    Cat::ATerm => Part::ATerm,
                    Cat::Upper | Cat::Lower => Part::UpperLower,
                    Cat::Close => Part::ClosePlus,
                    Cat::Sp => Part::SpPlus,
                    Cat::STerm => Part::STerm,
                    Cat::Numeric | Cat::SContinue | Cat::Other => Part::Other,
                },
            ]),
        }
    }

    fn last(self) -> Part {
        self.0[3]
    }

    /// The slot holding the terminator of an `SATerm Close* Sp*` tail, if the history ends in one.
    fn term_before_close_and_space(self) -> Part {
        let parts = self.0;
        let mut index = if parts[3] == Part::SpPlus { 2 } else { 3 };
        if parts[index] == Part::ClosePlus {
            index -= 1;
        }
        parts[index]
    }

    /// SB8: `ATerm Close* Sp* × (¬(OLetter | Upper | Lower | ParaSep | SATerm))* Lower`.
    fn continues_before_lower(self, ahead: &str) -> bool {
        if self.term_before_close_and_space() != Part::ATerm {
            return false;
        }
        for c in ahead.chars() {
            // Text on the fast path has only chars with a known category.
            match category(c).unwrap_or(Cat::Other) {
                Cat::Lower => return true,
                Cat::Upper | Cat::Cr | Cat::Lf | Cat::STerm | Cat::ATerm => return false,
                _ => {}
            }
        }
        false
    }

    /// SB8a: after `SATerm Close* Sp*`.
    fn after_term(self) -> bool {
        self.term_before_close_and_space().is_term()
    }

    /// SB9: after `SATerm Close*`.
    fn after_term_and_close(self) -> bool {
        let parts = self.0;
        let index = if parts[3] == Part::ClosePlus { 2 } else { 3 };
        parts[index].is_term()
    }

    /// Whether no rule but "no break" can apply to the next byte unless it is a terminator or a line
    /// break: the history holds no terminator, line break or start of text that a rule would look at.
    ///
    /// From such a state, a byte of any other category leads to a state that is quiet again (each rule
    /// looks back through at most one `Close` run and one `Sp` run to a terminator, and the byte adds
    /// no terminator), so a whole run of them is crossed without a boundary.
    fn is_quiet(self) -> bool {
        !matches!(
            self.last(),
            Part::Sot | Part::Eot | Part::Cr | Part::Lf | Part::ATerm | Part::STerm
        ) && !self.after_term()
            && !self.after_term_and_close()
            && !self.ends_sentence()
    }

    /// The state after `run` (chars none of which [`may_end_sentence`]) from this quiet state.
    ///
    /// Only the last four parts are kept, and a run of `Close` or of `Sp` chars is one part, so
    /// replaying from the fourth such group from the end gives exactly the state a replay of the
    /// whole run would: whatever the state before it, those four groups fill all four slots (a first
    /// group that merges into an equal last slot leaves that slot with the same value).
    fn after_quiet_run(self, run: &str) -> State {
        let cat_of = |c: char| category(c).unwrap_or(Cat::Other);
        let mut chars = run.char_indices().rev().peekable();
        let mut replay_from = run.len();
        let mut groups = 0;
        while groups < 4 {
            let Some((offset, c)) = chars.next() else {
                break;
            };
            replay_from = offset;
            let cat = cat_of(c);
            if matches!(cat, Cat::Close | Cat::Sp) {
                while let Some(&(offset, _)) = chars.peek().filter(|&&(_, c)| cat_of(c) == cat) {
                    replay_from = offset;
                    chars.next();
                }
            }
            groups += 1;
        }
        run[replay_from..]
            .chars()
            .fold(self, |state, c| state.next(cat_of(c)))
    }

    /// SB11: after `SATerm Close* Sp* ParaSep?`.
    fn ends_sentence(self) -> bool {
        let parts = self.0;
        let mut index = if matches!(parts[3], Part::Cr | Part::Lf) {
            2
        } else {
            3
        };
        if parts[index] == Part::SpPlus {
            index -= 1;
        }
        if parts[index] == Part::ClosePlus {
            index -= 1;
        }
        parts[index].is_term()
    }
}

/// The crate's sentence-break state machine over text whose chars all have a known [`category`]; it
/// owns no borrow of the text, so a caller can keep it beside the text it segments.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FastBreaks {
    pos: usize,
    state: State,
}

impl FastBreaks {
    pub(crate) fn new() -> FastBreaks {
        FastBreaks {
            pos: 0,
            state: State([Part::Sot; 4]),
        }
    }

    /// Whether every char of `text` has a known category, so that it can be segmented here.
    pub(crate) fn covers(text: &str) -> bool {
        text.is_ascii() || text.chars().all(|c| category(c).is_some())
    }

    /// The next boundary of `text`, which must be [`covered`](Self::covers) and the same text at every
    /// call: 0 first (unless empty), the length last.
    pub(crate) fn next_break(&mut self, text: &str) -> Option<usize> {
        while self.pos < text.len() {
            let before = self.state;
            let rest = &text[self.pos..];
            let (cat, width) = first_category(rest).unwrap_or((Cat::Other, 1));
            if !may_end_sentence(cat) && before.is_quiet() {
                // Every char that may end a sentence is ASCII, so a byte search finds the run's end.
                let run_length = first_possible_end(rest.as_bytes());
                self.state = before.after_quiet_run(&rest[..run_length]);
                self.pos += run_length;
                continue;
            }
            let position_before = self.pos;
            self.pos += width;
            self.state = before.next(cat);
            let last = before.last();
            if last == Part::Sot {
                return Some(position_before);
            }
            if cat == Cat::Lf && last == Part::Cr {
                continue;
            }
            if matches!(last, Part::Cr | Part::Lf) {
                return Some(position_before);
            }
            if cat == Cat::Numeric && last == Part::ATerm {
                continue;
            }
            if cat == Cat::Upper && before.0[2] == Part::UpperLower && last == Part::ATerm {
                continue;
            }
            if before.continues_before_lower(rest) {
                continue;
            }
            if matches!(cat, Cat::SContinue | Cat::STerm | Cat::ATerm) && before.after_term() {
                continue;
            }
            if matches!(cat, Cat::Close | Cat::Sp | Cat::Cr | Cat::Lf)
                && before.after_term_and_close()
            {
                continue;
            }
            if matches!(cat, Cat::Sp | Cat::Cr | Cat::Lf) && before.after_term() {
                continue;
            }
            if before.ends_sentence() {
                return Some(position_before);
            }
        }
        if matches!(self.state.last(), Part::Sot | Part::Eot) {
            None
        } else {
            let parts = self.state.0;
            self.state = State([parts[1], parts[2], parts[3], Part::Eot]);
            Some(self.pos)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<(usize, &str)> {
        sentence_bound_indices(text).collect()
    }

    fn crate_pieces(text: &str) -> Vec<(usize, &str)> {
        text.split_sentence_bound_indices().collect()
    }

    /// Contexts in which each category segments its own way: a char's category decides how text
    /// around it splits, so equal splits in all of them mean equal categories.
    const CONTEXTS: [&str; 15] = [
        "Ab.{}Cd",
        "ab. {}d",
        "ab.{} x",
        "x?{}Y",
        "a. ({})b",
        "1.{}2",
        "ok.{}\n",
        "Hi!{} z",
        "{}",
        "U.{}S",
        "a.{}.",
        "end. {} 1 b",
        "x. {}b",
        "Q.{}{}Z",
        "a. {}A",
    ];

    fn boundaries_in_contexts(c: char, segment: fn(&str) -> Vec<(usize, &str)>) -> Vec<Vec<usize>> {
        CONTEXTS
            .iter()
            .map(|context| {
                let text = context.replace("{}", &c.to_string());
                segment(&text)
                    .iter()
                    .map(|&(offset, _)| text[..offset].chars().count())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_contexts_tell_every_category_apart() {
        let representatives = ['\r', '\n', ' ', 'a', 'A', '1', '.', '!', ')', ',', '#'];
        for (i, a) in representatives.iter().enumerate() {
            for b in &representatives[i + 1..] {
                assert_ne!(
                    boundaries_in_contexts(*a, crate_pieces),
                    boundaries_in_contexts(*b, crate_pieces),
                    "{a:?} and {b:?} split alike in every context"
                );
            }
        }
    }

    #[test]
    fn every_known_char_segments_like_the_crate() {
        let known: Vec<char> = (0..=0x3100)
            .filter_map(char::from_u32)
            .filter(|&c| category(c).is_some())
            .collect();
        assert!(known.len() > 600, "{} known chars", known.len());
        for c in known {
            assert_eq!(
                boundaries_in_contexts(c, pieces),
                boundaries_in_contexts(c, crate_pieces),
                "{c:?} (U+{:04X})",
                c as u32
            );
        }
    }

    #[test]
    fn tricky_ascii_matches_the_crate() {
        for text in [
            "",
            " ",
            "\r\n",
            "He said \"Stop.\" Then left (quickly.) The U.S. Army arrived. etc. and more!? Numbers 3.14 stay.",
            "Ends. \r\n\r\nNext.\rCR. \n LF.",
            "e.g. lower. A.B.C. x.Y. 1. 2. a.) b.  \"c.\"  [d?]  {e!}",
            "a. - b. , c. ; d. : e.",
            "Stop...   Go?! Wait?!? (Yes.)) no",
            "one.   \t\x0b\x0c two",
            "trailing spaces.   ",
            "What. 123 456 lower and UPPER. 789 X",
        ] {
            assert_eq!(pieces(text), crate_pieces(text), "{text:?}");
        }
    }

    #[test]
    fn generated_ascii_matches_the_crate() {
        // Text drawn from the bytes whose categories drive the rules, long enough that runs,
        // terminators and lookaheads combine in many ways.
        const ALPHABET: &[char] = &[
            'a', 'A', 'z', 'Z', '0', '9', '.', '.', '!', '?', '"', '\'', ')', ']', '}', ',', '-',
            ':', ';', ' ', ' ', '\t', '\r', '\n', '#', 'x', '\u{A0}', '\u{201C}', '\u{201D}',
            '\u{2014}', '\u{E9}', '\u{C9}', '\u{2192}',
        ];
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        for round in 0..20_000 {
            let length = if round % 10 == 0 {
                100 + round % 200
            } else {
                1 + round % 40
            };
            let text: String = (0..length)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    ALPHABET[(seed % ALPHABET.len() as u64) as usize]
                })
                .collect();
            assert_eq!(pieces(&text), crate_pieces(&text), "{text:?}");
        }
    }

    #[test]
    fn text_with_unknown_chars_goes_to_the_crate() {
        let text = "「引用。」次の文。 Вопрос? Ответ! Ende...\u{85}Next. café. Ça va.";
        assert!(matches!(
            sentence_bound_indices(text),
            SentenceBoundIndices::Unicode(_)
        ));
        assert_eq!(pieces(text), crate_pieces(text));
        let common = "Caf\u{E9} \u{201C}quoted.\u{201D}\u{A0}Next \u{2014} then \u{2192} done.";
        assert!(matches!(
            sentence_bound_indices(common),
            SentenceBoundIndices::Fast { .. }
        ));
    }
}
