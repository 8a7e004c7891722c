//! Turning retrieved chunks into the numbered sources a prompt shows the model.

use std::cmp::Ordering;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// One retrieved chunk.
///
/// Anchors are the k nearest hits (`distance` is `Some`); neighbours (ordinal ±1 of an anchor, fetched afterwards)
/// have `distance: None` and `anchor_chunk_id` naming the chunk they were fetched for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrievedChunk {
    /// Primary key of the chunk.
    pub chunk_id: i64,
    /// Document the chunk was cut from.
    pub document_id: i64,
    /// Title of that document.
    pub title: String,
    /// Position of the chunk within its document (0, 1, 2, ...).
    pub ordinal: i32,
    /// First char (Unicode scalar value, not byte) of the chunk within the document text.
    pub char_start: i64,
    /// One past the last char of the chunk within the document text.
    pub char_end: i64,
    /// The chunk's text: the document slice `char_start..char_end`.
    pub text: String,
    /// Vector distance to the question; `None` for a neighbour.
    pub distance: Option<f64>,
    /// For a neighbour, the anchor it was fetched for.
    pub anchor_chunk_id: Option<i64>,
    /// The anchor's place in the search's order, 1 being the best (the reranker's or the fused order, which a
    /// distance does not capture); `None` for a neighbour, or when the search's order is the distance's.
    pub rank: Option<i32>,
    /// Where the chunk sits in the original file, such as "p. 12" or "slide 3".
    pub locator: Option<String>,
}

/// A numbered source as sent to the model: adjacent chunks of one document merged in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Source {
    /// The number the model cites this source by (`[number]`), 1-based and in prompt order.
    pub number: usize,
    /// Document the text comes from.
    pub document_id: i64,
    /// Title of that document.
    pub title: String,
    /// The distinct locators of the merged chunks, in text order.
    pub locators: Vec<String>,
    /// The merged chunks, in text order.
    pub chunk_ids: Vec<i64>,
    /// The merged text, each char of the document appearing once even where chunks overlap.
    pub text: String,
    /// The best (smallest) distance of the anchors merged here; neighbours inherit their anchor's distance.
    pub distance: f64,
    /// Estimated tokens of `text` (see [`estimate_tokens`]).
    pub token_estimate: usize,
}

impl Source {
    /// One display string for the locators, such as "p. 12", "pp. 12–13" or "slides 3–4".
    ///
    /// Locators that do not share one recognised label ("p.", "page", "slide", ...) are listed, comma-separated.
    /// `None` when no merged chunk had a locator.
    pub fn locator(&self) -> Option<String> {
        format_locators(&self.locators)
    }
}

/// The outcome of [`assemble_sources`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AssembledSources {
    /// The sources that fit the budget, most relevant first, numbered 1..n.
    pub sources: Vec<Source>,
    /// Chunks left out because their source alone is larger than the whole context budget.
    pub skipped_oversize: Vec<i64>,
    /// Chunks left out because the budget was already spent on more relevant sources, including neighbours
    /// dropped so that their anchor could still fit.
    pub skipped_for_budget: Vec<i64>,
}

/// Estimated tokens of a text: the chunker's estimate (`rag_chunk::CHARS_PER_TOKEN` characters a token), so a
/// context budget and a chunk size in tokens count the same way. Deliberately model-agnostic.
pub use rag_chunk::estimate_tokens;

/// Merges retrieved chunks into numbered sources that fit `context_budget_tokens`.
///
/// - A neighbour inherits its anchor's distance (a neighbour whose anchor is missing ranks last, it is not dropped).
/// - Chunks of one document whose ordinals are adjacent or whose char ranges overlap or touch become one source;
///   overlapping text is kept once (merging is by offset: the later chunk loses the chars already covered).
/// - Sources are ordered by the search's rank when it gave one (a reranker's or a fusion's order), then by
///   distance, ties by document id then offset, and taken in that order while they fit the
///   budget; one that does not fit is skipped whole (never truncated) and smaller later ones may still fit.
/// - A merged source that does not fit is retried without its neighbours, so the text that actually matched the
///   question is not lost to the context around it.
/// - Headers are not counted against the budget, only the source texts.
pub fn assemble_sources(
    chunks: &[RetrievedChunk],
    context_budget_tokens: usize,
) -> AssembledSources {
    let pieces = rank_pieces(chunks);
    let mut candidates = merge_pieces(pieces);
    candidates.sort_by(compare_relevance);

    let mut remaining = context_budget_tokens;
    let mut accepted: Vec<Candidate> = Vec::new();
    let mut assembled = AssembledSources::default();

    for candidate in candidates {
        if candidate.token_estimate <= remaining {
            remaining -= candidate.token_estimate;
            accepted.push(candidate);
            continue;
        }
        let anchors: Vec<Piece> = candidate
            .pieces
            .iter()
            .filter(|p| p.is_anchor)
            .cloned()
            .collect();
        if anchors.is_empty() || anchors.len() == candidate.pieces.len() {
            record_skip(&mut assembled, &candidate, context_budget_tokens);
            continue;
        }
        assembled.skipped_for_budget.extend(
            candidate
                .pieces
                .iter()
                .filter(|p| !p.is_anchor)
                .map(|p| p.chunk.chunk_id),
        );
        let mut narrowed = merge_pieces(anchors);
        narrowed.sort_by(compare_relevance);
        for sub in narrowed {
            if sub.token_estimate <= remaining {
                remaining -= sub.token_estimate;
                accepted.push(sub);
            } else {
                record_skip(&mut assembled, &sub, context_budget_tokens);
            }
        }
    }

    accepted.sort_by(compare_relevance);
    assembled.sources = accepted
        .into_iter()
        .enumerate()
        .map(|(index, candidate)| candidate.into_source(index + 1))
        .collect();
    assembled
}

fn record_skip(assembled: &mut AssembledSources, candidate: &Candidate, budget: usize) {
    let ids = candidate.pieces.iter().map(|p| p.chunk.chunk_id);
    if candidate.token_estimate > budget {
        assembled.skipped_oversize.extend(ids);
    } else {
        assembled.skipped_for_budget.extend(ids);
    }
}

/// A chunk with the search rank and distance it ranks by (its own as an anchor, its anchor's as a neighbour).
#[derive(Debug, Clone)]
struct Piece<'a> {
    chunk: &'a RetrievedChunk,
    rank: i64,
    distance: f64,
    is_anchor: bool,
}

impl Piece<'_> {
    /// A reversed range would make the offset arithmetic meaningless; treat it as empty.
    fn char_end(&self) -> i64 {
        self.chunk.char_end.max(self.chunk.char_start)
    }
}

/// Contiguous pieces of one document, before numbering.
struct Candidate<'a> {
    pieces: Vec<Piece<'a>>,
    text: String,
    rank: i64,
    distance: f64,
    token_estimate: usize,
}

impl Candidate<'_> {
    fn document_id(&self) -> i64 {
        self.pieces.first().map_or(0, |p| p.chunk.document_id)
    }

    fn char_start(&self) -> i64 {
        self.pieces.first().map_or(0, |p| p.chunk.char_start)
    }

    fn into_source(self, number: usize) -> Source {
        let mut locators: Vec<String> = Vec::new();
        for piece in &self.pieces {
            if let Some(locator) = piece.chunk.locator.as_deref().map(str::trim) {
                if !locator.is_empty() && !locators.iter().any(|seen| seen == locator) {
                    locators.push(locator.to_string());
                }
            }
        }
        Source {
            number,
            document_id: self.document_id(),
            title: self
                .pieces
                .first()
                .map(|p| p.chunk.title.clone())
                .unwrap_or_default(),
            locators,
            chunk_ids: self.pieces.iter().map(|p| p.chunk.chunk_id).collect(),
            text: self.text,
            distance: self.distance,
            token_estimate: self.token_estimate,
        }
    }
}

/// The search's rank first (absent ranks, `i64::MAX`, tie), then the distance.
fn compare_relevance(a: &Candidate, b: &Candidate) -> Ordering {
    a.rank
        .cmp(&b.rank)
        .then(a.distance.total_cmp(&b.distance))
        .then(a.document_id().cmp(&b.document_id()))
        .then(a.char_start().cmp(&b.char_start()))
}

/// NaN would poison every comparison; a distance that is not a number is as good as none.
fn usable_distance(distance: f64) -> f64 {
    if distance.is_nan() {
        f64::INFINITY
    } else {
        distance
    }
}

/// Gives every chunk its ranking distance and keeps each chunk id once (its best showing).
fn rank_pieces(chunks: &[RetrievedChunk]) -> Vec<Piece<'_>> {
    let mut anchor_distance: HashMap<i64, f64> = HashMap::new();
    let mut anchor_rank: HashMap<i64, i64> = HashMap::new();
    for chunk in chunks {
        if let Some(distance) = chunk.distance {
            let distance = usable_distance(distance);
            anchor_distance
                .entry(chunk.chunk_id)
                .and_modify(|best| *best = best.min(distance))
                .or_insert(distance);
            let rank = chunk.rank.map_or(i64::MAX, i64::from);
            anchor_rank
                .entry(chunk.chunk_id)
                .and_modify(|best| *best = (*best).min(rank))
                .or_insert(rank);
        }
    }

    let mut pieces: Vec<Piece> = Vec::with_capacity(chunks.len());
    let mut index_of: HashMap<i64, usize> = HashMap::new();
    for chunk in chunks {
        let is_anchor = chunk.distance.is_some();
        let distance = match chunk.distance {
            Some(distance) => usable_distance(distance),
            None => chunk
                .anchor_chunk_id
                .and_then(|anchor| anchor_distance.get(&anchor).copied())
                .unwrap_or(f64::INFINITY),
        };
        let rank = match chunk.distance {
            Some(_) => chunk.rank.map_or(i64::MAX, i64::from),
            None => chunk
                .anchor_chunk_id
                .and_then(|anchor| anchor_rank.get(&anchor).copied())
                .unwrap_or(i64::MAX),
        };
        match index_of.get(&chunk.chunk_id) {
            Some(&index) => {
                let existing = &mut pieces[index];
                if distance < existing.distance {
                    existing.distance = distance;
                }
                existing.rank = existing.rank.min(rank);
                if is_anchor && !existing.is_anchor {
                    existing.is_anchor = true;
                    existing.chunk = chunk;
                }
            }
            None => {
                index_of.insert(chunk.chunk_id, pieces.len());
                pieces.push(Piece {
                    chunk,
                    rank,
                    distance,
                    is_anchor,
                });
            }
        }
    }
    pieces
}

/// Groups pieces into contiguous runs per document and merges each run's text.
fn merge_pieces(mut pieces: Vec<Piece<'_>>) -> Vec<Candidate<'_>> {
    pieces.sort_by(|a, b| {
        (
            a.chunk.document_id,
            a.chunk.char_start,
            a.chunk.ordinal,
            a.chunk.chunk_id,
        )
            .cmp(&(
                b.chunk.document_id,
                b.chunk.char_start,
                b.chunk.ordinal,
                b.chunk.chunk_id,
            ))
    });

    let mut runs: Vec<Vec<Piece>> = Vec::new();
    let mut run_end = i64::MIN;
    for piece in pieces {
        let joins = runs.last().and_then(|run| run.last()).is_some_and(|last| {
            last.chunk.document_id == piece.chunk.document_id
                && (i64::from(last.chunk.ordinal) + 1 == i64::from(piece.chunk.ordinal)
                    || piece.chunk.char_start <= run_end)
        });
        if joins {
            run_end = run_end.max(piece.char_end());
            if let Some(run) = runs.last_mut() {
                run.push(piece);
            }
        } else {
            run_end = piece.char_end();
            runs.push(vec![piece]);
        }
    }

    runs.into_iter().map(merge_run).collect()
}

fn merge_run(pieces: Vec<Piece<'_>>) -> Candidate<'_> {
    let mut text = String::new();
    let mut covered_end: Option<i64> = None;
    for piece in &pieces {
        let chunk = piece.chunk;
        match covered_end {
            Some(end) if chunk.char_start < end => {
                let already_covered = usize::try_from(end - chunk.char_start).unwrap_or(usize::MAX);
                text.extend(chunk.text.chars().skip(already_covered));
            }
            Some(end) => {
                // Adjacent by ordinal but with a gap: the whitespace between them was trimmed off both chunks.
                let needs_separator = chunk.char_start > end
                    && !text.is_empty()
                    && !text.ends_with(char::is_whitespace)
                    && !chunk.text.starts_with(char::is_whitespace);
                if needs_separator {
                    text.push('\n');
                }
                text.push_str(&chunk.text);
            }
            None => text.push_str(&chunk.text),
        }
        covered_end = Some(covered_end.map_or(piece.char_end(), |end| end.max(piece.char_end())));
    }
    let distance = pieces
        .iter()
        .map(|p| p.distance)
        .fold(f64::INFINITY, f64::min);
    let rank = pieces.iter().map(|p| p.rank).min().unwrap_or(i64::MAX);
    let token_estimate = estimate_tokens(&text);
    Candidate {
        pieces,
        text,
        rank,
        distance,
        token_estimate,
    }
}

/// Locator labels that can be collapsed into a range, singular then plural.
const LOCATOR_LABELS: &[(&str, &str)] = &[
    ("p.", "pp."),
    ("page", "pages"),
    ("slide", "slides"),
    ("sheet", "sheets"),
    ("section", "sections"),
    ("line", "lines"),
    ("para.", "paras."),
    ("§", "§§"),
];

fn format_locators(locators: &[String]) -> Option<String> {
    match locators {
        [] => None,
        [only] => Some(only.clone()),
        _ => Some(collapse_locator_range(locators).unwrap_or_else(|| locators.join(", "))),
    }
}

/// "p. 12", "p. 13" -> "pp. 12–13", when every locator uses the same known label.
fn collapse_locator_range(locators: &[String]) -> Option<String> {
    let mut label_index: Option<usize> = None;
    let mut low = u64::MAX;
    let mut high = 0u64;
    for locator in locators {
        let (index, first, last) = parse_locator(locator)?;
        if label_index.is_some_and(|seen| seen != index) {
            return None;
        }
        label_index = Some(index);
        low = low.min(first);
        high = high.max(last);
    }
    let (singular, plural) = LOCATOR_LABELS[label_index?];
    Some(if low == high {
        format!("{singular} {low}")
    } else {
        format!("{plural} {low}–{high}")
    })
}

/// Splits "pp. 12–13" into (label index, 12, 13).
fn parse_locator(locator: &str) -> Option<(usize, u64, u64)> {
    let (label, numbers) = locator.trim().rsplit_once(char::is_whitespace)?;
    let label = label.trim();
    let index = LOCATOR_LABELS.iter().position(|(singular, plural)| {
        label.eq_ignore_ascii_case(singular) || label.eq_ignore_ascii_case(plural)
    })?;
    let (first, last) = match numbers.split_once(['-', '–']) {
        Some((first, last)) => (first.trim().parse().ok()?, last.trim().parse().ok()?),
        None => {
            let only = numbers.trim().parse().ok()?;
            (only, only)
        }
    };
    (first <= last).then_some((index, first, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A document whose chunks are 10-char slices overlapping by 2 chars: chunk i covers 8i..8i+10.
    const DOC: &str = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJ";

    fn slice(from: usize, to: usize) -> String {
        DOC.chars().skip(from).take(to - from).collect()
    }

    fn chunk(
        document_id: i64,
        ordinal: i32,
        distance: Option<f64>,
        anchor: Option<i64>,
    ) -> RetrievedChunk {
        let start = 8 * ordinal as usize;
        let end = (start + 10).min(DOC.len());
        RetrievedChunk {
            chunk_id: document_id * 100 + i64::from(ordinal),
            document_id,
            title: format!("Doc {document_id}"),
            ordinal,
            char_start: start as i64,
            char_end: end as i64,
            text: slice(start, end),
            distance,
            anchor_chunk_id: anchor,
            rank: None,
            locator: None,
        }
    }

    #[test]
    fn the_search_rank_orders_sources_before_the_distance() {
        // A reranker put document 2's chunk first although document 1's is nearer by distance; the neighbour of
        // document 2's anchor travels with it.
        let mut near = chunk(1, 0, Some(0.10), None);
        near.rank = Some(2);
        let mut relevant = chunk(2, 2, Some(0.40), None);
        relevant.rank = Some(1);
        let neighbour = chunk(2, 3, None, Some(relevant.chunk_id));
        let assembled =
            assemble_sources(&[near.clone(), relevant.clone(), neighbour.clone()], 1000);
        let order: Vec<i64> = assembled.sources.iter().map(|s| s.document_id).collect();
        assert_eq!(order, [2, 1]);
        assert_eq!(
            assembled.sources[0].chunk_ids,
            [relevant.chunk_id, neighbour.chunk_id]
        );
        assert_eq!(assembled.sources[0].distance, 0.40);
        // Without ranks the distance decides, as before.
        near.rank = None;
        relevant.rank = None;
        let assembled = assemble_sources(&[near, relevant, neighbour], 1000);
        let order: Vec<i64> = assembled.sources.iter().map(|s| s.document_id).collect();
        assert_eq!(order, [1, 2]);
    }

    fn with_text(mut chunk: RetrievedChunk, text: &str, start: i64) -> RetrievedChunk {
        chunk.text = text.to_string();
        chunk.char_start = start;
        chunk.char_end = start + text.chars().count() as i64;
        chunk
    }

    #[test]
    fn neighbour_inherits_its_anchors_distance_and_is_kept() {
        let chunks = vec![
            chunk(1, 1, Some(0.2), None),
            chunk(2, 0, Some(0.3), None),
            // Neighbour of doc 1's anchor, listed last and without a distance of its own.
            chunk(1, 2, None, Some(101)),
        ];
        let assembled = assemble_sources(&chunks, 1000);
        assert_eq!(assembled.sources.len(), 2);
        let first = &assembled.sources[0];
        assert_eq!(first.document_id, 1);
        assert_eq!(first.chunk_ids, vec![101, 102]);
        assert_eq!(first.distance, 0.2);
        assert_eq!(assembled.sources[1].document_id, 2);
    }

    #[test]
    fn lone_neighbour_ranks_by_its_anchor_not_last() {
        // The neighbour is not contiguous with its anchor's text here (different document id by construction),
        // so it forms its own source and must rank by the anchor's distance, ahead of a worse anchor.
        let mut neighbour = chunk(3, 0, None, Some(101));
        neighbour.chunk_id = 999;
        let chunks = vec![
            chunk(1, 1, Some(0.1), None),
            chunk(2, 0, Some(0.5), None),
            neighbour,
        ];
        let assembled = assemble_sources(&chunks, 1000);
        let order: Vec<i64> = assembled.sources.iter().map(|s| s.document_id).collect();
        assert_eq!(order, vec![1, 3, 2]);
        assert_eq!(assembled.sources[1].distance, 0.1);
    }

    #[test]
    fn orphan_neighbour_ranks_last_but_is_kept() {
        let chunks = vec![chunk(2, 0, None, Some(12345)), chunk(1, 0, Some(0.9), None)];
        let assembled = assemble_sources(&chunks, 1000);
        assert_eq!(assembled.sources.len(), 2);
        assert_eq!(assembled.sources[1].document_id, 2);
        assert!(assembled.sources[1].distance.is_infinite());
    }

    #[test]
    fn merging_does_not_repeat_the_overlap() {
        let chunks = vec![
            chunk(1, 2, None, Some(101)),
            chunk(1, 1, Some(0.2), None),
            chunk(1, 0, None, Some(101)),
        ];
        let assembled = assemble_sources(&chunks, 1000);
        assert_eq!(assembled.sources.len(), 1);
        let source = &assembled.sources[0];
        assert_eq!(source.chunk_ids, vec![100, 101, 102]);
        assert_eq!(source.text, slice(0, 26));
        assert_eq!(source.token_estimate, 7);
    }

    #[test]
    fn merging_counts_chars_not_bytes() {
        let text = "Grüße aus Köln und München";
        let first = with_text(
            chunk(1, 0, Some(0.1), None),
            &text.chars().take(12).collect::<String>(),
            0,
        );
        let second = with_text(
            chunk(1, 1, None, Some(100)),
            &text.chars().skip(8).collect::<String>(),
            8,
        );
        let assembled = assemble_sources(&[first, second], 1000);
        assert_eq!(assembled.sources[0].text, text);
    }

    #[test]
    fn chunk_contained_in_another_adds_no_text() {
        let outer = with_text(chunk(1, 0, Some(0.1), None), "0123456789", 0);
        let inner = with_text(chunk(1, 5, Some(0.2), None), "2345", 2);
        let assembled = assemble_sources(&[outer, inner], 1000);
        assert_eq!(assembled.sources.len(), 1);
        assert_eq!(assembled.sources[0].text, "0123456789");
        assert_eq!(assembled.sources[0].chunk_ids, vec![100, 105]);
    }

    #[test]
    fn adjacent_ordinals_with_a_gap_are_merged_with_a_separator() {
        let first = with_text(chunk(1, 0, Some(0.1), None), "First paragraph.", 0);
        let second = with_text(chunk(1, 1, None, Some(100)), "Second paragraph.", 18);
        let assembled = assemble_sources(&[first, second], 1000);
        assert_eq!(assembled.sources.len(), 1);
        assert_eq!(
            assembled.sources[0].text,
            "First paragraph.\nSecond paragraph."
        );
    }

    #[test]
    fn distant_chunks_of_one_document_stay_separate_sources() {
        let chunks = vec![chunk(1, 0, Some(0.4), None), chunk(1, 3, Some(0.1), None)];
        let assembled = assemble_sources(&chunks, 1000);
        assert_eq!(assembled.sources.len(), 2);
        assert_eq!(assembled.sources[0].chunk_ids, vec![103]);
        assert_eq!(assembled.sources[1].chunk_ids, vec![100]);
        assert_eq!(assembled.sources[0].number, 1);
        assert_eq!(assembled.sources[1].number, 2);
    }

    #[test]
    fn ties_order_by_document_then_offset() {
        let chunks = vec![
            chunk(2, 0, Some(0.3), None),
            chunk(1, 4, Some(0.3), None),
            chunk(1, 0, Some(0.3), None),
        ];
        let assembled = assemble_sources(&chunks, 1000);
        let ids: Vec<i64> = assembled
            .sources
            .iter()
            .flat_map(|s| s.chunk_ids.clone())
            .collect();
        assert_eq!(ids, vec![100, 104, 200]);
    }

    #[test]
    fn duplicate_chunk_is_used_once_with_its_best_distance() {
        let chunks = vec![
            chunk(1, 1, None, Some(201)),
            chunk(2, 1, Some(0.1), None),
            chunk(1, 1, Some(0.6), None),
        ];
        let assembled = assemble_sources(&chunks, 1000);
        let doc1 = assembled
            .sources
            .iter()
            .find(|s| s.document_id == 1)
            .expect("doc 1 is a source");
        assert_eq!(doc1.chunk_ids, vec![101]);
        assert_eq!(doc1.distance, 0.1);
    }

    #[test]
    fn budget_skips_oversize_but_later_smaller_sources_fit() {
        let big = with_text(chunk(1, 0, Some(0.1), None), &"x".repeat(400), 0); // 100 tokens
        let medium = with_text(chunk(2, 0, Some(0.2), None), &"y".repeat(160), 0); // 40 tokens
        let too_much_now = with_text(chunk(3, 0, Some(0.3), None), &"z".repeat(120), 0); // 30 tokens
        let small = with_text(chunk(4, 0, Some(0.4), None), &"w".repeat(40), 0); // 10 tokens
        let assembled = assemble_sources(&[big, medium, too_much_now, small], 50);
        let docs: Vec<i64> = assembled.sources.iter().map(|s| s.document_id).collect();
        assert_eq!(docs, vec![2, 4]);
        assert_eq!(assembled.skipped_oversize, vec![100]);
        assert_eq!(assembled.skipped_for_budget, vec![300]);
        assert_eq!(assembled.sources[0].number, 1);
        assert_eq!(assembled.sources[1].number, 2);
        let texts_whole = assembled
            .sources
            .iter()
            .all(|s| s.text.chars().count() == s.token_estimate * rag_chunk::CHARS_PER_TOKEN);
        assert!(texts_whole, "sources are never truncated");
    }

    #[test]
    fn too_large_merged_source_falls_back_to_its_anchor() {
        let anchor = with_text(chunk(1, 1, Some(0.1), None), &"a".repeat(40), 40); // 10 tokens
        let before = with_text(chunk(1, 0, None, Some(101)), &"b".repeat(40), 0);
        let after = with_text(chunk(1, 2, None, Some(101)), &"c".repeat(40), 80);
        let assembled = assemble_sources(&[before, anchor, after], 15);
        assert_eq!(assembled.sources.len(), 1);
        assert_eq!(assembled.sources[0].chunk_ids, vec![101]);
        assert_eq!(assembled.sources[0].text, "a".repeat(40));
        assert_eq!(assembled.skipped_for_budget, vec![100, 102]);
        assert!(assembled.skipped_oversize.is_empty());
    }

    #[test]
    fn zero_budget_records_everything_as_oversize() {
        let assembled = assemble_sources(&[chunk(1, 0, Some(0.1), None)], 0);
        assert!(assembled.sources.is_empty());
        assert_eq!(assembled.skipped_oversize, vec![100]);
    }

    #[test]
    fn nan_and_reversed_ranges_do_not_panic() {
        let mut odd = chunk(1, 0, Some(f64::NAN), None);
        odd.char_end = -5;
        let assembled = assemble_sources(&[odd, chunk(2, 0, Some(0.5), None)], 1000);
        assert_eq!(assembled.sources.len(), 2);
        assert_eq!(assembled.sources[0].document_id, 2);
    }

    #[test]
    fn token_estimate_rounds_up() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("abc"), 1);
        assert_eq!(estimate_tokens("abcd"), 1);
        assert_eq!(estimate_tokens("abcde"), 2);
        assert_eq!(estimate_tokens("éééé"), 1);
    }

    #[test]
    fn locators_are_distinct_in_order_and_collapse_into_a_range() {
        let mut first = chunk(1, 0, Some(0.1), None);
        first.locator = Some("p. 12".into());
        let mut second = chunk(1, 1, None, Some(100));
        second.locator = Some("p. 12".into());
        let mut third = chunk(1, 2, None, Some(100));
        third.locator = Some("p. 13".into());
        let assembled = assemble_sources(&[first, second, third], 1000);
        let source = &assembled.sources[0];
        assert_eq!(
            source.locators,
            vec!["p. 12".to_string(), "p. 13".to_string()]
        );
        assert_eq!(source.locator().as_deref(), Some("pp. 12–13"));
    }

    #[test]
    fn locator_formatting() {
        let fmt = |items: &[&str]| {
            format_locators(&items.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(fmt(&[]), None);
        assert_eq!(fmt(&["slide 3"]).as_deref(), Some("slide 3"));
        assert_eq!(fmt(&["slide 3", "slide 4"]).as_deref(), Some("slides 3–4"));
        assert_eq!(fmt(&["pp. 12–13", "p. 14"]).as_deref(), Some("pp. 12–14"));
        assert_eq!(fmt(&["p. 2", "slide 4"]).as_deref(), Some("p. 2, slide 4"));
        assert_eq!(
            fmt(&["Intro", "Summary"]).as_deref(),
            Some("Intro, Summary")
        );
    }
}
