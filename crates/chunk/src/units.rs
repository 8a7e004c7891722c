//! Cutting the text into the units the packer places whole: paragraphs, or the sentences of a
//! paragraph too large for one chunk.

use unicode_segmentation::UnicodeSegmentation;

use crate::boundary::{next_break_run, soften_line_breaks, Pos, Span};
use crate::sentences::FastBreaks;

/// Paragraphs (split on blank lines) that fit in `max_chars`, and the sentences of those that do not,
/// in text order, each trimmed of surrounding whitespace and never empty.
///
/// A sentence may still exceed `max_chars` (tables, minified JSON, base64); the packer hard-cuts it.
/// Units are produced lazily so that a text of millions of one-line paragraphs costs no list of them.
pub(crate) struct Units<'t, 'c> {
    text: &'t str,
    /// Called every [`CHECKPOINT_BYTES`] bytes of a paragraph scan, so one huge paragraph can be abandoned.
    checkpoint: Option<&'c dyn Fn()>,
    max_chars: usize,
    /// Where the scan for the next paragraph resumes: never inside a whitespace run.
    cursor: Pos,
    oversized: Option<Sentences>,
}

/// How many bytes a paragraph scan goes between two checkpoints: well under a millisecond.
const CHECKPOINT_BYTES: usize = 1 << 16;

impl<'t, 'c> Units<'t, 'c> {
    #[cfg(test)]
    pub(crate) fn new(text: &'t str, max_chars: usize) -> Units<'t, 'c> {
        Units::with_checkpoint(text, max_chars, None)
    }

    pub(crate) fn with_checkpoint(
        text: &'t str,
        max_chars: usize,
        checkpoint: Option<&'c dyn Fn()>,
    ) -> Units<'t, 'c> {
        Units {
            text,
            checkpoint,
            max_chars,
            cursor: Pos::ORIGIN,
            oversized: None,
        }
    }

    fn next_paragraph(&mut self) -> Option<Span> {
        let text = self.text;
        let rest = &text[self.cursor.byte..];
        let blank_prefix = rest.len() - rest.trim_start().len();
        if blank_prefix == rest.len() {
            self.cursor = self.cursor.advanced_to(text, text.len());
            return None;
        }
        let start = self
            .cursor
            .advanced_to(text, self.cursor.byte + blank_prefix);
        let mut floor = start.byte;
        let mut scan_from = floor;
        let (content_end, resume) = loop {
            let until = scan_from.saturating_add(CHECKPOINT_BYTES).min(text.len());
            match next_break_run(text, floor, scan_from, until) {
                Some(run) if run.breaks >= 2 => break (run.start, run.end),
                Some(run) => {
                    floor = run.end;
                    scan_from = run.end;
                }
                None if until == text.len() => break (text.trim_end().len(), text.len()),
                None => {
                    // `until` may fall inside a char; the next window starts at the char's start.
                    scan_from = (0..=until)
                        .rev()
                        .find(|&byte| text.is_char_boundary(byte))
                        .unwrap_or(until);
                    if let Some(checkpoint) = self.checkpoint {
                        checkpoint();
                    }
                }
            }
        };
        let end = start.advanced_to(text, content_end);
        self.cursor = end.advanced_to(text, resume);
        Some(Span { start, end })
    }
}

impl Iterator for Units<'_, '_> {
    type Item = Span;

    fn next(&mut self) -> Option<Span> {
        loop {
            if let Some(sentences) = &mut self.oversized {
                if let Some(sentence) = sentences.next(self.text) {
                    return Some(sentence);
                }
                self.oversized = None;
            }
            let paragraph = self.next_paragraph()?;
            if paragraph.chars() <= self.max_chars {
                return Some(paragraph);
            }
            self.oversized = Some(Sentences::new(self.text, paragraph));
        }
    }
}

/// The sentences of one oversized paragraph, segmented on its softened copy.
struct Sentences {
    paragraph: Span,
    softened: String,
    /// One pass when the fast segmenter covers the paragraph; `None` restarts the crate's segmenter at each boundary.
    fast: Option<FastBreaks>,
    /// Bytes of `softened` already handed out.
    consumed: usize,
    cursor: Pos,
}

impl Sentences {
    fn new(text: &str, paragraph: Span) -> Sentences {
        let softened = soften_line_breaks(paragraph.slice(text));
        let fast = FastBreaks::covers(&softened).then(|| {
            let mut breaks = FastBreaks::new();
            // The first boundary is the paragraph's start.
            breaks.next_break(&softened);
            breaks
        });
        Sentences {
            paragraph,
            softened,
            fast,
            consumed: 0,
            cursor: paragraph.start,
        }
    }

    /// The next piece between two boundaries, as a byte range of `softened`.
    fn next_piece(&mut self) -> Option<(usize, usize)> {
        let from = self.consumed;
        let to = match &mut self.fast {
            Some(breaks) => breaks.next_break(&self.softened)?,
            // Segmentation restarts at each boundary already found: a sentence boundary resets the
            // UAX #29 state, so this finds the same boundaries as one pass while owning no iterator
            // that borrows `softened`.
            None => from + self.softened[from..].split_sentence_bounds().next()?.len(),
        };
        self.consumed = to;
        Some((from, to))
    }

    fn next(&mut self, text: &str) -> Option<Span> {
        loop {
            let (piece_offset, piece_end) = self.next_piece()?;
            let piece = &self.softened[piece_offset..piece_end];
            let kept = piece.trim();
            if kept.is_empty() {
                continue;
            }
            let blank_prefix = piece.len() - piece.trim_start().len();
            let start = self.cursor.advanced_to(
                text,
                self.paragraph.start.byte + piece_offset + blank_prefix,
            );
            let end = start.advanced_to(text, start.byte + kept.len());
            self.cursor = end;
            return Some(Span { start, end });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit_texts(text: &str, max_chars: usize) -> Vec<&str> {
        Units::new(text, max_chars)
            .map(|unit| unit.slice(text))
            .collect()
    }

    #[test]
    fn paragraphs_split_on_blank_lines_only() {
        let text = "  First line\nsame paragraph.\n \t\nSecond.\r\n\r\nThird.\u{0C}Fourth.\n";
        assert_eq!(
            unit_texts(text, 100),
            vec![
                "First line\nsame paragraph.",
                "Second.",
                "Third.",
                "Fourth."
            ]
        );
    }

    #[test]
    fn oversized_paragraph_becomes_sentences_despite_hard_wrapping() {
        let text = "Alpha beta gamma delta\nepsilon zeta. Eta theta iota kappa\nlambda mu. Nu xi.";
        assert_eq!(
            unit_texts(text, 30),
            vec![
                "Alpha beta gamma delta\nepsilon zeta.",
                "Eta theta iota kappa\nlambda mu.",
                "Nu xi."
            ]
        );
    }

    #[test]
    fn restarted_sentence_segmentation_matches_one_pass() {
        let text = "He said \"Stop.\" Then left (quickly.) The U.S. Army arrived. etc. and more!? \
                    Numbers 3.14 stay. 「引用。」次の文。 Вопрос? Ответ! Ende...  \u{2029}New para.\n\n\nLast";
        let paragraph = Span {
            start: Pos::ORIGIN,
            end: Pos::ORIGIN.advanced_to(text, text.len()),
        };
        let mut restarted = Sentences::new(text, paragraph);
        let restarted: Vec<&str> = std::iter::from_fn(|| restarted.next(text))
            .map(|span| span.slice(text))
            .collect();
        let one_pass: Vec<&str> = soften_line_breaks(text)
            .split_sentence_bound_indices()
            .filter(|(_, piece)| !piece.trim().is_empty())
            .map(|(offset, piece)| {
                let start = offset + piece.len() - piece.trim_start().len();
                &text[start..start + piece.trim().len()]
            })
            .collect();
        assert!(one_pass.len() > 10);
        assert_eq!(restarted, one_pass);
    }

    #[test]
    fn unit_offsets_count_chars() {
        let text = "ééé.\n\nñ ü.";
        let units: Vec<Span> = Units::new(text, 100).collect();
        assert_eq!(units.len(), 2);
        assert_eq!((units[1].start.char, units[1].end.char), (6, 10));
        assert_eq!(units[1].slice(text), "ñ ü.");
    }

    #[test]
    fn blank_text_has_no_units() {
        assert_eq!(Units::new("", 100).count(), 0);
        assert_eq!(Units::new(" \n\n\t\u{3000} ", 100).count(), 0);
    }
}
