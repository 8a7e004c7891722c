//! Packing units into chunks, hard-cutting what has no structure, carrying overlap forward and
//! settling a too-small tail.

use std::ops::ControlFlow;

use unicode_segmentation::UnicodeSegmentation;

use crate::boundary::{
    for_each_start, is_line_break, resync_point, skip_blank, trim_end_before, Pos, Span, TIERS,
};
use crate::units::Units;

/// A hard cut looks for whitespace or a word boundary in this last fraction (1/N) of the window.
const HARD_CUT_SEARCH_DIVISOR: usize = 4;
/// A trailing chunk whose new text is under 1/N of the size is too small to embed on its own.
const TAIL_DIVISOR: usize = 4;
/// At least 1/N of every chunk is new text. Without it an overlap just below the size would make each
/// chunk advance by a few chars and the output grow to hundreds of times the input.
const MIN_NEW_TEXT_DIVISOR: usize = 4;
/// Bytes of text past a hard-cut window handed to the word segmenter, whose rules look ahead.
const WORD_LOOKAHEAD_BYTES: usize = 64;

/// Sizes in chars, with the overlap already capped to what the packer will use.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max: usize,
    pub(crate) overlap: usize,
}

impl Limits {
    pub(crate) fn new(max_chars: usize, overlap_chars: usize) -> Limits {
        Limits {
            max: max_chars,
            overlap: overlap_chars.min(max_chars - max_chars / MIN_NEW_TEXT_DIVISOR),
        }
    }

    fn tail_threshold(&self) -> usize {
        self.max / TAIL_DIVISOR
    }
}

/// The chunks of `text`, as trimmed spans in text order.
#[cfg(test)]
pub(crate) fn chunk_spans(text: &str, limits: Limits) -> Vec<Span> {
    chunk_spans_with_checkpoint(text, limits, &mut || {})
}

/// The chunks of `text`, as trimmed spans in text order, calling `checkpoint` before each chunk is packed.
pub(crate) fn chunk_spans_with_checkpoint(
    text: &str,
    limits: Limits,
    checkpoint: &mut dyn FnMut(),
) -> Vec<Span> {
    // Shared by the packer and the paragraph scanner it drives.
    let checkpoint = std::cell::RefCell::new(checkpoint);
    let tick = || (checkpoint.borrow_mut())();
    let mut spans = pack(text, limits, &tick);
    settle_tail(text, &mut spans, limits);
    spans
}

/// Greedy packing with overlap, before the tail is settled.
fn pack(text: &str, limits: Limits, checkpoint: &dyn Fn()) -> Vec<Span> {
    let mut units = Units::with_checkpoint(text, limits.max, Some(checkpoint)).peekable();
    let mut spans: Vec<Span> = Vec::new();
    // Where the rest of a unit begins after a hard cut took its head.
    let mut resume: Option<Pos> = None;
    // A heading taken off the end of a chunk, to start the next one with the text it introduces.
    let mut held: Option<Span> = None;
    // Where a heading before a unit too big for any chunk begins: that unit's first piece starts there.
    let mut lead: Option<Pos> = None;
    loop {
        checkpoint();
        let from_held = held.is_some();
        let Some(unit) = held.or_else(|| units.peek().copied()) else {
            break;
        };
        let new_from = resume.take().unwrap_or(unit.start);
        let rest_fits = unit.end.char - new_from.char <= limits.max;
        // A unit that fits is kept whole, so the overlap yields to it; a unit that must be cut anyway
        // only needs room for half a window of new text. A held heading also keeps room for the unit
        // it introduces, or it would only be cut off again.
        let needed_end = if from_held {
            units
                .peek()
                .map(|next| next.end.char)
                .filter(|&end| end - unit.start.char <= limits.max)
                .unwrap_or(unit.end.char)
        } else if rest_fits {
            unit.end.char
        } else {
            new_from.char + limits.max / 2
        };
        let start = match lead.take() {
            Some(heading_start) => heading_start,
            None => spans
                .last()
                .and_then(|previous| overlap_start(text, *previous, needed_end, limits))
                .unwrap_or(new_from),
        };

        if unit.end.char - start.char <= limits.max {
            let mut end = unit.end;
            consume(&mut held, &mut units);
            // The run of headings the chunk ends with (a held run counts as one), and where the
            // chunk's content before that run ends, if anything precedes it.
            let mut heading_run: Option<Pos> =
                crate::looks_like_heading(unit.slice(text)).then_some(unit.start);
            let mut end_before_run: Option<Pos> = None;
            while let Some(next) = units.next_if(|next| next.end.char - start.char <= limits.max) {
                if !crate::looks_like_heading(next.slice(text)) {
                    heading_run = None;
                } else if heading_run.is_none() {
                    heading_run = Some(next.start);
                    end_before_run = Some(end);
                }
                end = next.end;
            }
            if let (Some(run_start), Some(next)) = (heading_run, units.peek().copied()) {
                let run = Span {
                    start: run_start,
                    end,
                };
                let joins_next = next.end.char - run_start.char <= limits.max;
                let next_is_cut = next.chars() > limits.max;
                // Only a heading or two moves, and only when what stays behind is no fragment: a long
                // run of short lines is a list or a table, not a heading.
                let movable = run.chars() <= MAX_HEADING_RUN_CHARS
                    && end_before_run.is_none_or(|end_before| {
                        end_before.char - start.char >= limits.tail_threshold()
                    });
                match end_before_run {
                    Some(end_before) if movable && joins_next => {
                        end = end_before;
                        held = Some(run);
                    }
                    // The next unit is hard-cut anyway: its first piece starts with the headings,
                    // which are short enough to leave that piece half a window of new text.
                    _ if movable && next_is_cut && run.chars() <= limits.max / 2 => {
                        lead = Some(run_start);
                        match end_before_run {
                            Some(end_before) => end = end_before,
                            None => continue,
                        }
                    }
                    _ => {}
                }
            }
            spans.push(Span { start, end });
        } else {
            let cut = hard_cut(text, start, new_from, limits.max);
            spans.push(Span {
                start,
                end: trim_end_before(text, start, cut),
            });
            let rest = skip_blank(text, cut, unit.end.byte);
            if rest.byte < unit.end.byte {
                resume = Some(rest);
            } else {
                consume(&mut held, &mut units);
            }
        }
    }
    spans
}

/// Moves past the unit being placed: the held heading if there is one, else the next unit.
fn consume<I: Iterator<Item = Span>>(held: &mut Option<Span>, units: &mut std::iter::Peekable<I>) {
    if held.take().is_none() {
        units.next();
    }
}

/// The most a run of headings moved together may hold: a title and a subtitle, not a list.
const MAX_HEADING_RUN_CHARS: usize = 160;

/// Where the chunk after `previous` should start so that it repeats the end of `previous`.
///
/// The shared part is at most `limits.overlap` chars, leaves room for the new chunk to reach
/// `needed_end` within the size, starts after `previous` starts, and begins on the best boundary
/// kind available in that window (sentence, then word, then grapheme), as early as possible.
/// `None` means no overlap fits.
fn overlap_start(text: &str, previous: Span, needed_end: usize, limits: Limits) -> Option<Pos> {
    if limits.overlap == 0 {
        return None;
    }
    let earliest = previous
        .end
        .char
        .saturating_sub(limits.overlap)
        .max(needed_end.saturating_sub(limits.max))
        .max(previous.start.char + 1);
    if earliest >= previous.end.char {
        return None;
    }
    TIERS.into_iter().find_map(|tier| {
        let mut found = None;
        let search = Span {
            start: resync_point(text, previous, earliest, tier),
            end: previous.end,
        };
        for_each_start(text, search, tier, |pos| {
            if pos.char >= earliest {
                found = Some(pos);
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        found
    })
}

/// Where to cut a unit with no usable structure whose chunk starts at `start`, its new text at
/// `new_from`; the chunk may hold `max` chars.
///
/// Prefers, within the last quarter of the window, the last line break (rows of a table), then the
/// last whitespace, then the last word boundary; else the last grapheme boundary; else, for a single
/// grapheme longer than the window, the char at the window's end. The cut always leaves new text in
/// the chunk.
fn hard_cut(text: &str, start: Pos, new_from: Pos, max: usize) -> Pos {
    let window_end = start.advanced_by_chars(text, max);
    let search_from = window_end
        .char
        .saturating_sub(max / HARD_CUT_SEARCH_DIVISOR)
        .max(new_from.char + 1);
    let mut slice_end = (window_end.byte + WORD_LOOKAHEAD_BYTES).min(text.len());
    while !text.is_char_boundary(slice_end) {
        slice_end += 1;
    }
    let slice = &text[start.byte..slice_end];
    if slice.is_ascii() {
        if let Some(cut) = ascii_break_or_blank_cut(slice, start, new_from, window_end, search_from)
        {
            return cut;
        }
    }

    let mut line_break_cut = None;
    let mut blank_cut = None;
    let mut grapheme_cut = None;
    let mut pos = start;
    for grapheme in slice.graphemes(true) {
        if pos.char > window_end.char {
            break;
        }
        if pos.char > new_from.char {
            grapheme_cut = Some(pos);
            if pos.char >= search_from {
                if grapheme.starts_with(is_line_break) {
                    line_break_cut = Some(pos);
                }
                if grapheme.starts_with(char::is_whitespace) {
                    blank_cut = Some(pos);
                }
            }
        }
        pos = Pos {
            byte: pos.byte + grapheme.len(),
            char: pos.char + grapheme.chars().count(),
        };
    }
    if let Some(cut) = line_break_cut.or(blank_cut) {
        return cut;
    }

    let mut word_cut = None;
    let mut pos = start;
    for word in slice.split_word_bounds() {
        if pos.char > window_end.char {
            break;
        }
        if pos.char >= search_from {
            word_cut = Some(pos);
        }
        pos = Pos {
            byte: pos.byte + word.len(),
            char: pos.char + word.chars().count(),
        };
    }
    word_cut.or(grapheme_cut).unwrap_or(window_end)
}

/// [`hard_cut`]'s first two choices, the last line break and else the last whitespace in the searched
/// part of the window, for ASCII text starting at `start`: there every char is a grapheme except CR LF,
/// so a backward byte scan finds what segmenting the whole window into graphemes would.
fn ascii_break_or_blank_cut(
    slice: &str,
    start: Pos,
    new_from: Pos,
    window_end: Pos,
    search_from: usize,
) -> Option<Pos> {
    let bytes = slice.as_bytes();
    // Cuts lie where a grapheme starts: after the chunk's new text begins, inside the window.
    let lowest = (search_from.max(new_from.char + 1)).checked_sub(start.char)?;
    let highest = (window_end.char - start.char).min(bytes.len().checked_sub(1)?);
    let mut blank_cut = None;
    for offset in (lowest..=highest).rev() {
        let c = char::from(bytes[offset]);
        if !c.is_whitespace() || (offset > 0 && bytes[offset - 1] == b'\r' && c == '\n') {
            continue;
        }
        let cut = Pos {
            byte: start.byte + offset,
            char: start.char + offset,
        };
        if is_line_break(c) {
            return Some(cut);
        }
        blank_cut.get_or_insert(cut);
    }
    blank_cut
}

/// Folds a too-small last chunk into the one before it, or rebalances the two.
fn settle_tail(text: &str, spans: &mut Vec<Span>, limits: Limits) {
    let count = spans.len();
    if count < 2 {
        return;
    }
    let previous = spans[count - 2];
    let last = spans[count - 1];
    let before = count.checked_sub(3).map(|index| spans[index]);
    let last_new_chars = last.end.char - last.start.char.max(previous.end.char);
    if last_new_chars >= limits.tail_threshold() {
        return;
    }
    if let Some(start) = merged_start(text, before, previous, last.end, limits) {
        spans.truncate(count - 2);
        spans.push(Span {
            start,
            end: last.end,
        });
    } else if let Some((first, second)) = rebalance(text, before, previous, last, limits) {
        spans[count - 2] = first;
        spans[count - 1] = second;
    }
}

/// The start of one chunk covering `previous` and running to `end`, if it fits; gives up some or all
/// of the overlap `previous` shares with `before` when that is what it takes.
fn merged_start(
    text: &str,
    before: Option<Span>,
    previous: Span,
    end: Pos,
    limits: Limits,
) -> Option<Pos> {
    if end.char - previous.start.char <= limits.max {
        return Some(previous.start);
    }
    let before = before?;
    let own_start = if previous.start.byte >= before.end.byte {
        previous.start
    } else {
        skip_blank(text, before.end, previous.end.byte)
    };
    if end.char - own_start.char > limits.max {
        return None;
    }
    Some(overlap_start(text, before, end.char, limits).unwrap_or(own_start))
}

/// Two chunks over the text of `previous` and `last`, split near the middle of their new text on the
/// best boundary kind available, each with at least a tail threshold of new text.
fn rebalance(
    text: &str,
    before: Option<Span>,
    previous: Span,
    last: Span,
    limits: Limits,
) -> Option<(Span, Span)> {
    let union = Span {
        start: previous.start,
        end: last.end,
    };
    let threshold = limits.tail_threshold();
    // The first chunk must add text beyond what `before` already holds.
    let new_text_from = before.map_or(union.start.char, |before| {
        before.end.char.max(union.start.char)
    });
    let lowest = (new_text_from + threshold).max(union.end.char.saturating_sub(limits.max));
    let highest = (union.start.char + limits.max).min(union.end.char.saturating_sub(threshold));
    if lowest > highest {
        return None;
    }
    let target = (new_text_from + union.end.char) / 2;
    let target = target.clamp(lowest, highest);
    for tier in TIERS {
        let mut best: Option<Pos> = None;
        let search = Span {
            start: resync_point(text, union, lowest, tier),
            end: union.end,
        };
        for_each_start(text, search, tier, |pos| {
            if pos.char > highest {
                return ControlFlow::Break(());
            }
            let closer =
                best.is_none_or(|best| pos.char.abs_diff(target) < best.char.abs_diff(target));
            if pos.char >= lowest && closer {
                best = Some(pos);
            }
            ControlFlow::Continue(())
        });
        let Some(split) = best else { continue };
        let first = Span {
            start: union.start,
            end: trim_end_before(text, union.start, split),
        };
        if first.end.char <= new_text_from {
            continue;
        }
        let second_start = overlap_start(text, first, union.end.char, limits).unwrap_or(split);
        let second = Span {
            start: second_start,
            end: union.end,
        };
        return Some((first, second));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ascii_span(start: usize, end: usize) -> Span {
        Span {
            start: Pos {
                byte: start,
                char: start,
            },
            end: Pos {
                byte: end,
                char: end,
            },
        }
    }

    /// `count` sentences of 44 chars each, then "Done.".
    fn equal_sentences_then_done(count: usize) -> String {
        (1..=count)
            .map(|n| format!("Sentence {n:02} has the same length as the rest."))
            .chain(std::iter::once("Done.".to_owned()))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn overlap_is_capped_to_keep_a_quarter_of_each_chunk_new() {
        assert_eq!(Limits::new(100, 99).overlap, 75);
        assert_eq!(Limits::new(1000, 200).overlap, 200);
        assert_eq!(Limits::new(100, 0).overlap, 0);
    }

    #[test]
    fn greedy_packing_leaves_the_tail_that_settling_merges() {
        let text = equal_sentences_then_done(7);
        let limits = Limits::new(180, 60);
        let packed = pack(&text, limits, &|| {});
        // Four sentences per chunk, one of them repeated, then "Done." behind a repeated sentence.
        let bounds: Vec<(usize, usize)> =
            packed.iter().map(|s| (s.start.char, s.end.char)).collect();
        assert_eq!(bounds, vec![(0, 179), (135, 314), (270, 320)]);

        let settled = chunk_spans(&text, limits);
        let bounds: Vec<(usize, usize)> =
            settled.iter().map(|s| (s.start.char, s.end.char)).collect();
        // Merging whole would take 185 chars, so the merged chunk gives up part of its overlap; no
        // sentence starts late enough, so it starts on the word "04".
        assert_eq!(bounds, vec![(0, 179), (144, 320)]);
        assert!(settled[1]
            .slice(&text)
            .starts_with("04 has the same length"));
    }

    #[test]
    fn merging_gives_up_overlap_when_that_makes_the_tail_fit() {
        let words = |first: char| {
            (0..12)
                .map(|n| std::iter::repeat_n(char::from(first as u8 + n), 4).collect::<String>())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let text = format!("{}. {}. Finishing.", words('a'), words('m'));
        assert_eq!(text.len(), 132);
        let limits = Limits::new(100, 40);
        let mut spans = vec![ascii_span(0, 60), ascii_span(30, 121), ascii_span(96, 132)];
        settle_tail(&text, &mut spans, limits);
        // The earliest word start that keeps the merged chunk within 100 chars is at 35.
        assert_eq!(spans, vec![ascii_span(0, 60), ascii_span(35, 132)]);
    }

    #[test]
    fn a_tail_too_big_to_merge_is_rebalanced_on_a_sentence_boundary() {
        let text = equal_sentences_then_done(4);
        let limits = Limits::new(180, 60);
        let packed = pack(&text, limits, &|| {});
        let bounds: Vec<(usize, usize)> =
            packed.iter().map(|s| (s.start.char, s.end.char)).collect();
        assert_eq!(bounds, vec![(0, 179), (135, 185)]);

        let settled = chunk_spans(&text, limits);
        let bounds: Vec<(usize, usize)> =
            settled.iter().map(|s| (s.start.char, s.end.char)).collect();
        // Two sentences, then the second one repeated as overlap with the rest.
        assert_eq!(bounds, vec![(0, 89), (45, 185)]);
    }

    #[test]
    fn rebalancing_without_overlap_splits_new_text_evenly() {
        let text = equal_sentences_then_done(4);
        let settled = chunk_spans(&text, Limits::new(180, 0));
        let bounds: Vec<(usize, usize)> =
            settled.iter().map(|s| (s.start.char, s.end.char)).collect();
        assert_eq!(bounds, vec![(0, 89), (90, 185)]);
    }

    #[test]
    fn hard_cuts_always_add_new_text() {
        let blob = "x".repeat(1_000);
        for max in [100, 137, 400] {
            let start = Pos::ORIGIN;
            for new_from_char in [0, max / 2, max - max / MIN_NEW_TEXT_DIVISOR] {
                let new_from = Pos {
                    byte: new_from_char,
                    char: new_from_char,
                };
                let cut = hard_cut(&blob, start, new_from, max);
                assert!(cut.char > new_from.char && cut.char <= max);
            }
        }
    }

    #[test]
    fn hard_cut_prefers_line_breaks_then_spaces_then_words() {
        let limits_max = 100;
        let with_lines = format!("{}\n{} {}", "a".repeat(78), "b".repeat(10), "c".repeat(40));
        assert_eq!(
            hard_cut(&with_lines, Pos::ORIGIN, Pos::ORIGIN, limits_max).char,
            78
        );
        let with_spaces = format!("{} {}", "a".repeat(90), "c".repeat(40));
        assert_eq!(
            hard_cut(&with_spaces, Pos::ORIGIN, Pos::ORIGIN, limits_max).char,
            90
        );
        let with_words = format!("{}/{}", "a".repeat(85), "c".repeat(40));
        assert_eq!(
            hard_cut(&with_words, Pos::ORIGIN, Pos::ORIGIN, limits_max).char,
            86
        );
        // A separator too early in the window is ignored in favour of a full window.
        let early_space = format!("{} {}", "a".repeat(20), "c".repeat(200));
        assert_eq!(
            hard_cut(&early_space, Pos::ORIGIN, Pos::ORIGIN, limits_max).char,
            100
        );
    }
}
