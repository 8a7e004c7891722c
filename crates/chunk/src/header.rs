//! Contextual chunk headers: what a chunk sits under, said in front of it where it is embedded and searched.
//!
//! A chunk cut from the middle of a section often never names its subject ("Set it to zero to disable
//! the delay."): its document's title and the section heading above it do. Put in front of the chunk for
//! the embedding, the full-text index and the reranker, they let a question naming the subject find it
//! (BENCHMARKS.md §5: on the PostgreSQL manual, chunk recall@5 of hybrid search 0.62 → 0.70 when simulated).
//! The chunk's own text stays exactly the slice of the document, for citations and grounding.

use std::ops::Range;

use crate::ChunkBounds;

/// The longest heading or title a header carries, in chars: a header is a pointer, not content, and must
/// leave the chunk almost all of an embedding model's window.
pub const MAX_HEADER_PART_CHARS: usize = 120;

/// For each chunk, the byte range in `text` of the section heading above it: the last heading paragraph
/// (a paragraph of one line that [`crate::looks_like_heading`] and does not end with a colon, which
/// introduces what follows rather than naming a section) starting no later than the chunk. A chunk that
/// starts with its heading gets that heading, which [`chunk_header`] then leaves out.
///
/// `bounds` must be in text order, as the chunker gives them. One pass over the text's lines: linear
/// whatever the number of chunks or headings.
pub fn headings_above(text: &str, bounds: &[ChunkBounds]) -> Vec<Option<Range<usize>>> {
    let mut headings = SectionHeadings::new(text).peekable();
    let mut last = None;
    bounds
        .iter()
        .map(|chunk| {
            while let Some(heading) = headings.next_if(|heading| heading.start <= chunk.byte_start)
            {
                last = Some(heading);
            }
            last.clone()
        })
        .collect()
}

/// The heading paragraphs of a text in order, as byte ranges of their trimmed line.
struct SectionHeadings<'t> {
    text: &'t str,
    /// Where the next line starts; past the end when the text is read.
    line_start: usize,
}

impl<'t> SectionHeadings<'t> {
    fn new(text: &'t str) -> Self {
        SectionHeadings {
            text,
            line_start: 0,
        }
    }

    /// The next line's trimmed range (empty for a blank line), advancing past it.
    fn next_line(&mut self) -> Option<Range<usize>> {
        if self.line_start > self.text.len() {
            return None;
        }
        let start = self.line_start;
        let end = self.text[start..]
            .find('\n')
            .map_or(self.text.len(), |at| start + at);
        self.line_start = end + 1;
        let line = &self.text[start..end];
        let trimmed_start = start + (line.len() - line.trim_start().len());
        Some(trimmed_start..trimmed_start + line.trim().len())
    }
}

impl Iterator for SectionHeadings<'_> {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        loop {
            // Skip blank lines to a paragraph's first line, then see whether the paragraph ends after it.
            let first = loop {
                let line = self.next_line()?;
                if !line.is_empty() {
                    break line;
                }
            };
            match self.next_line() {
                Some(second) if !second.is_empty() => {
                    // A paragraph of several lines: skip the rest of it.
                    while self.next_line().is_some_and(|line| !line.is_empty()) {}
                }
                _ => {
                    if is_section_heading(&self.text[first.clone()]) {
                        return Some(first);
                    }
                }
            }
        }
    }
}

fn is_section_heading(line: &str) -> bool {
    crate::looks_like_heading(line) && !line.ends_with(':')
}

/// The header of a chunk: its document's title and the section heading above it, joined by " > ", each
/// cut to [`MAX_HEADER_PART_CHARS`]; the heading is left out when it repeats the title or when the chunk
/// starts with it. `None` when neither says anything, and for the chunk that opens its document
/// (`opens_document`): a document's opening states its own subject, and a short document is all opening. In
/// front of a one-chunk policy text a one-word title outweighed the text ("Leave" drew "How much notice do I
/// give before leaving?" away from "Resignation"), where a chunk from deep inside a manual page gains from it.
pub fn chunk_header(
    title: &str,
    heading: Option<&str>,
    chunk_text: &str,
    opens_document: bool,
) -> Option<String> {
    if opens_document {
        return None;
    }
    let title = title.trim();
    let heading = heading
        .map(str::trim)
        .filter(|heading| !heading.is_empty() && *heading != title)
        .filter(|heading| !chunk_text.trim_start().starts_with(heading));
    let mut header = String::new();
    for part in [Some(title), heading].into_iter().flatten() {
        if part.is_empty() {
            continue;
        }
        if !header.is_empty() {
            header.push_str(" > ");
        }
        // One line however the title was written: the header is followed by a blank line, which must
        // stay the only paragraph break it brings.
        let mut taken = 0;
        for word in part.split_whitespace() {
            if taken > 0 && taken < MAX_HEADER_PART_CHARS {
                header.push(' ');
                taken += 1;
            }
            let room = MAX_HEADER_PART_CHARS.saturating_sub(taken);
            header.extend(word.chars().take(room));
            taken += word.chars().count().min(room);
        }
    }
    (!header.is_empty()).then_some(header)
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

    fn headings<'t>(text: &'t str, starts: &[usize]) -> Vec<Option<&'t str>> {
        headings_above(text, &bounds_at(starts))
            .into_iter()
            .map(|range| range.map(|range| &text[range]))
            .collect()
    }

    #[test]
    fn a_chunk_gets_the_last_heading_before_it() {
        let text = "Intro text here.\n\nBackups\n\nTake them daily. Keep them.\n\nRestore\n\nRun the tool.";
        let body = text.find("Take").unwrap();
        let restore_body = text.find("Run").unwrap();
        let restore = text.find("Restore").unwrap();
        assert_eq!(
            headings(text, &[0, body, restore, restore_body]),
            vec![None, Some("Backups"), Some("Restore"), Some("Restore")]
        );
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
            let expected = if chunk.byte_start >= second_heading {
                "Cost-based Delay"
            } else {
                "Routine Maintenance"
            };
            assert_eq!(heading, Some(expected), "chunk at {}", chunk.byte_start);
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
            chunk_header(
                "Routine Maintenance",
                Some("Cost-based Delay"),
                "Set it to zero.",
                false
            ),
            Some("Routine Maintenance > Cost-based Delay".to_owned())
        );
        assert_eq!(
            chunk_header("", Some("Cost-based Delay"), "Set it to zero.", false),
            Some("Cost-based Delay".to_owned())
        );
        assert_eq!(chunk_header("  ", None, "x", false), None);
    }

    #[test]
    fn a_header_leaves_out_what_the_chunk_or_title_already_says() {
        assert_eq!(
            chunk_header("Backups", Some("Backups"), "text", false),
            Some("Backups".to_owned())
        );
        assert_eq!(
            chunk_header(
                "Manual",
                Some("Backups"),
                "Backups\n\nTake them daily.",
                false
            ),
            Some("Manual".to_owned())
        );
    }

    #[test]
    fn a_header_is_one_bounded_line() {
        let title = format!("A\ntitle\n\nwritten   {}", "long".repeat(100));
        let header = chunk_header(&title, Some(&"é".repeat(500)), "x", false).unwrap();
        assert!(!header.contains('\n'));
        let (title_part, heading_part) = header.split_once(" > ").unwrap();
        assert!(title_part.starts_with("A title written long"));
        assert_eq!(title_part.chars().count(), MAX_HEADER_PART_CHARS);
        assert_eq!(heading_part.chars().count(), MAX_HEADER_PART_CHARS);
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
        assert_eq!(
            chunk_header("Leave", Some("Rules"), "Staff get 25 days.", true),
            None
        );
    }

    #[test]
    fn the_header_goes_in_front_after_a_blank_line() {
        assert_eq!(with_header(Some("T > H"), "body"), "T > H\n\nbody");
        assert_eq!(with_header(None, "body"), "body");
    }
}
