//! Contextual chunk headers: what a chunk sits under, said in front of it where it is embedded and searched.
//!
//! A chunk cut from the middle of a section often never names its subject ("Set it to zero to disable
//! the delay."): its document's title and the section heading above it do. Put in front of the chunk for
//! the embedding, the full-text index and the reranker, they let a question naming the subject find it
//! (BENCHMARKS.md §5: on the PostgreSQL manual, chunk recall@5 of hybrid search 0.62 → 0.70 when simulated).
//! The chunk's own text stays exactly the slice of the document, for citations and grounding.

use std::ops::Range;

use crate::{boundary, ChunkBounds};

/// The longest heading or title a header carries, in chars: a header is a pointer, not content, and must
/// leave the chunk almost all of an embedding model's window.
pub const MAX_HEADER_PART_CHARS: usize = 120;

/// For each chunk, the byte range in `text` of the section heading it sits under: the last heading paragraph
/// (a paragraph of one line that [`crate::looks_like_heading`] and does not end with a colon, which
/// introduces what follows rather than naming a section) starting no later than the chunk's new text (where
/// its overlap with the chunk before ends), and `None` when that heading lies inside the chunk (the chunk says
/// it itself) or no heading precedes it. A chunk whose overlap ends one section and whose new text opens the
/// next is not put under the section it only overlaps.
///
/// Paragraphs are found as the chunker finds them (a blank line, a form feed or U+2029, any line break
/// convention). `bounds` must be in text order, as the chunker gives them. One pass over the text: linear
/// whatever the number of chunks or headings.
pub fn headings_above(text: &str, bounds: &[ChunkBounds]) -> Vec<Option<Range<usize>>> {
    let mut headings = SectionHeadings::new(text).peekable();
    let mut last: Option<Range<usize>> = None;
    let mut previous_end = 0;
    bounds
        .iter()
        .map(|chunk| {
            // Bounds past the text (none the chunker makes) find nothing rather than panic.
            let chunk_end = chunk.byte_end.min(text.len());
            let overlap_end = chunk.byte_start.max(previous_end).min(chunk_end);
            previous_end = chunk_end;
            let rest = &text[overlap_end..chunk_end];
            let new_text = overlap_end + (rest.len() - rest.trim_start().len());
            while let Some(heading) = headings.next_if(|heading| heading.start <= new_text) {
                last = Some(heading);
            }
            last.clone()
                .filter(|heading| heading.start < chunk.byte_start)
        })
        .collect()
}

/// The heading paragraphs of a text in order, as byte ranges of their trimmed text.
struct SectionHeadings<'t> {
    text: &'t str,
    /// Where the search for the next paragraph resumes: never inside a whitespace run.
    cursor: usize,
}

impl<'t> SectionHeadings<'t> {
    fn new(text: &'t str) -> Self {
        SectionHeadings { text, cursor: 0 }
    }
}

impl Iterator for SectionHeadings<'_> {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        let text = self.text;
        loop {
            let rest = &text[self.cursor..];
            let start = self.cursor + (rest.len() - rest.trim_start().len());
            if start >= text.len() {
                self.cursor = text.len();
                return None;
            }
            // The paragraph ends at the first run of whitespace that breaks the line twice; a run that
            // breaks it once makes it a paragraph of several lines, never a heading.
            let mut one_line = true;
            let mut floor = start;
            let (end, resume) = loop {
                match boundary::next_break_run(text, floor, floor, text.len()) {
                    Some(run) if run.breaks >= 2 => break (run.start, run.end),
                    Some(run) => {
                        one_line = false;
                        floor = run.end;
                    }
                    None => break (text.trim_end().len(), text.len()),
                }
            };
            self.cursor = resume;
            if one_line && end > start && is_section_heading(&text[start..end]) {
                return Some(start..end);
            }
        }
    }
}

fn is_section_heading(line: &str) -> bool {
    crate::looks_like_heading(line) && !line.ends_with(':')
}

/// The header of a chunk: its document's title and the section heading above it ([`headings_above`]),
/// joined by " > ", each on one line and cut to [`MAX_HEADER_PART_CHARS`]; the heading is left out when it
/// repeats the title. `None` when neither says anything, and for the chunk that opens its document
/// (`opens_document`): a document's opening states its own subject, and a short document is all opening. In
/// front of a one-chunk policy text a one-word title outweighed the text ("Leave" drew "How much notice do I
/// give before leaving?" away from "Resignation"), where a chunk from deep inside a manual page gains from it.
pub fn chunk_header(title: &str, heading: Option<&str>, opens_document: bool) -> Option<String> {
    if opens_document {
        return None;
    }
    let title = one_line(title);
    let heading = heading
        .map(one_line)
        .filter(|heading| !heading.is_empty() && *heading != title);
    let parts: Vec<String> = [Some(title), heading].into_iter().flatten().collect();
    let header = parts
        .into_iter()
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" > ");
    (!header.is_empty()).then_some(header)
}

/// A title or heading as a header part: its words on one line (the header is followed by a blank line,
/// which must stay the only paragraph break it brings), at most [`MAX_HEADER_PART_CHARS`] chars.
fn one_line(part: &str) -> String {
    let mut line = String::new();
    for word in part.split_whitespace() {
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
        if line.len() >= MAX_HEADER_PART_CHARS * 4 {
            break;
        }
    }
    line.chars()
        .take(MAX_HEADER_PART_CHARS)
        .collect::<String>()
        .trim_end()
        .to_owned()
}

/// The text that stands for a chunk where it is embedded, indexed for full text and reranked: its header,
/// a blank line, then its text. PostgreSQL's `rag._with_header` joins them the same way.
pub fn with_header(header: Option<&str>, chunk_text: &str) -> String {
    match header {
        Some(header) => format!("{header}\n\n{chunk_text}"),
        None => chunk_text.to_owned(),
    }
}

/// The input an embedding model gets for a chunk: `prefix` (the model's document prefix), then the chunk
/// behind its header. The chunker fits the prefix and the chunk into a model's window, not the header, so
/// where `fits` says the whole would not fit, the header is left out of this one input rather than failing
/// or cutting the chunk.
pub fn embedding_input(
    prefix: &str,
    header: Option<&str>,
    chunk_text: &str,
    fits: impl FnOnce(&str) -> bool,
) -> String {
    let whole = format!("{prefix}{}", with_header(header, chunk_text));
    if header.is_none() || fits(&whole) {
        whole
    } else {
        format!("{prefix}{chunk_text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{chunk_bounds_with_checkpoint, ChunkConfig, SizeUnit};

    fn bounds_at(starts: &[usize]) -> Vec<ChunkBounds> {
        starts
            .iter()
            .map(|&start| ChunkBounds {
                byte_start: start,
                byte_end: start + 1,
                char_start: start,
                char_end: start + 1,
            })
            .collect()
    }

    /// Chunks of one char at `starts`, no overlap.
    fn headings<'t>(text: &'t str, starts: &[usize]) -> Vec<Option<&'t str>> {
        headings_above(text, &bounds_at(starts))
            .into_iter()
            .map(|range| range.map(|range| &text[range]))
            .collect()
    }

    #[test]
    fn a_chunk_gets_the_last_heading_before_it_and_none_it_says_itself() {
        let text = "Intro text here.\n\nBackups\n\nTake them daily. Keep them.\n\nRestore\n\nRun the tool.";
        let body = text.find("Take").unwrap();
        let restore_body = text.find("Run").unwrap();
        let restore = text.find("Restore").unwrap();
        assert_eq!(
            headings(text, &[0, body, restore, restore_body]),
            vec![None, Some("Backups"), None, Some("Restore")]
        );
    }

    #[test]
    fn a_chunk_is_under_the_section_its_new_text_opens_not_the_one_it_overlaps() {
        let text = "Backups\n\nTake them daily. Keep them.\n\nRestore\n\nRun the tool. Check it.";
        let keep = text.find("Keep").unwrap();
        let check = text.find("Check").unwrap();
        // The second chunk repeats "Keep them." from the first, then brings the Restore section.
        let bounds = [
            ChunkBounds {
                byte_start: 0,
                byte_end: text.find("Keep them.").unwrap() + "Keep them.".len(),
                char_start: 0,
                char_end: 0,
            },
            ChunkBounds {
                byte_start: keep,
                byte_end: check,
                char_start: 0,
                char_end: 0,
            },
            ChunkBounds {
                byte_start: check,
                byte_end: text.len(),
                char_start: 0,
                char_end: 0,
            },
        ];
        let found: Vec<Option<&str>> = headings_above(text, &bounds)
            .into_iter()
            .map(|range| range.map(|range| &text[range]))
            .collect();
        // The second chunk holds "Restore" itself; the third is under it.
        assert_eq!(found, vec![None, None, Some("Restore")]);
    }

    #[test]
    fn paragraphs_of_several_lines_and_lead_ins_are_not_headings() {
        let text = "Backups\nare taken daily\n\nFor example:\n\nSome text.\n\n  Indented Heading  \n\nMore.";
        let some = text.find("Some").unwrap();
        let more = text.find("More").unwrap();
        assert_eq!(
            headings(text, &[some, more]),
            vec![None, Some("Indented Heading")]
        );
    }

    #[test]
    fn paragraphs_end_as_the_chunker_ends_them() {
        // A form feed (pdftotext's page break) and U+2029 end a paragraph alone; CR and CRLF lines count.
        let text = "Old page.\n\u{0C}Chapter 2\n\nText two.\u{2029}Section B\u{2029}Text B.\r\n\r\nPart C\r\rText C.";
        let starts = ["Text two", "Text B", "Text C"].map(|at| text.find(at).unwrap());
        assert_eq!(
            headings(text, &starts),
            vec![Some("Chapter 2"), Some("Section B"), Some("Part C")]
        );
    }

    #[test]
    fn headings_follow_the_chunker_on_a_real_cut() {
        let section = "Vacuum reclaims the storage of dead tuples. ".repeat(12);
        let text = format!("Routine Maintenance\n\n{section}\n\nCost-based Delay\n\n{section}");
        let config = ChunkConfig::new(300, 60, SizeUnit::Characters).unwrap();
        let bounds = chunk_bounds_with_checkpoint(&text, &config, &mut || {});
        let found = headings_above(&text, &bounds);
        assert_eq!(found.len(), bounds.len());
        let second_heading = text.find("Cost-based").unwrap();
        for (chunk, heading) in bounds.iter().zip(&found) {
            let heading = heading.clone().map(|range| &text[range]);
            let chunk_text = &text[chunk.byte_start..chunk.byte_end];
            let expected =
                if chunk_text.starts_with("Routine") || chunk_text.starts_with("Cost-based") {
                    None
                } else if chunk.byte_start >= second_heading {
                    Some("Cost-based Delay")
                } else {
                    Some("Routine Maintenance")
                };
            assert_eq!(heading, expected, "chunk at {}", chunk.byte_start);
        }
    }

    #[test]
    fn no_text_and_no_chunks() {
        assert!(headings_above("", &[]).is_empty());
        assert_eq!(headings("", &[0]), vec![None]);
        assert_eq!(headings("\n\n\n", &[1]), vec![None]);
    }

    #[test]
    fn a_header_names_title_then_heading() {
        assert_eq!(
            chunk_header("Routine Maintenance", Some("Cost-based Delay"), false),
            Some("Routine Maintenance > Cost-based Delay".to_owned())
        );
        assert_eq!(
            chunk_header("", Some("Cost-based Delay"), false),
            Some("Cost-based Delay".to_owned())
        );
        assert_eq!(chunk_header("  ", None, false), None);
        // A heading the chunk's text happens to begin with is still named.
        assert_eq!(
            chunk_header("Manual", Some("Backups"), false),
            Some("Manual > Backups".to_owned())
        );
    }

    #[test]
    fn a_header_leaves_out_a_heading_that_repeats_the_title() {
        assert_eq!(
            chunk_header("Backups", Some(" Backups "), false),
            Some("Backups".to_owned())
        );
    }

    #[test]
    fn a_header_is_one_bounded_line() {
        let title = format!("A\ntitle\n\nwritten   {}", "long".repeat(100));
        let header = chunk_header(&title, Some(&"é".repeat(500)), false).unwrap();
        assert!(!header.contains('\n'));
        let (title_part, heading_part) = header.split_once(" > ").unwrap();
        assert!(title_part.starts_with("A title written long"));
        assert_eq!(title_part.chars().count(), MAX_HEADER_PART_CHARS);
        assert_eq!(heading_part.chars().count(), MAX_HEADER_PART_CHARS);
        // A cut right after a word leaves no trailing space.
        let words = format!("{} next", "w".repeat(MAX_HEADER_PART_CHARS - 1));
        let header = chunk_header(&words, None, false).unwrap();
        assert_eq!(header, "w".repeat(MAX_HEADER_PART_CHARS - 1));
    }

    #[test]
    fn a_header_that_does_not_fit_the_window_is_left_out_of_the_embedding() {
        let fits_in_35 = |input: &str| input.chars().count() <= 35;
        assert_eq!(
            embedding_input("doc: ", Some("Manual > Backups"), "Take them.", fits_in_35),
            "doc: Manual > Backups\n\nTake them."
        );
        assert_eq!(
            embedding_input(
                "doc: ",
                Some("Manual > Backups and restores"),
                "Take them.",
                fits_in_35
            ),
            "doc: Take them."
        );
        assert_eq!(
            embedding_input("", None, "Take them.", |_| panic!(
                "no header, nothing to measure"
            )),
            "Take them."
        );
    }

    #[test]
    fn the_opening_chunk_has_no_header() {
        assert_eq!(chunk_header("Leave", Some("Rules"), true), None);
    }

    #[test]
    fn the_header_goes_in_front_after_a_blank_line() {
        assert_eq!(with_header(Some("T > H"), "body"), "T > H\n\nbody");
        assert_eq!(with_header(None, "body"), "body");
    }
}
