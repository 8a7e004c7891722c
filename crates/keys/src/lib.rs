//! The keys of rows a transaction inserted into watched tables, between the row trigger that sees each row and
//! the statement trigger that queues them (`src/api/watch_keys.rs` is the PostgreSQL side).
//!
//! Keys are kept as the text of a PostgreSQL array literal's elements, the form the watch's queue row stores
//! (`rag.row_batches.key_values`), so that a statement's keys become one string without another pass.
//!
//! Each key is tagged with the subtransaction that was current when its row trigger ran. Two rules follow from
//! PostgreSQL numbering subtransactions in the order they start, and from keys arriving in time order:
//! - the keys gathered since subtransaction `S` started are exactly those tagged `S` or higher, and they are
//!   a suffix of what is kept;
//! - so a statement trigger running in `S` takes only that suffix ([`PendingKeys::take`]): keys an outer
//!   statement gathered before `S` began stay for that statement's own trigger, and are not queued by a batch
//!   that `S`'s rollback would undo;
//! - and when `S` rolls back, that suffix is dropped ([`PendingKeys::forget_since`]): those rows are gone.
use std::collections::HashMap;

/// A subtransaction's number within its top-level transaction (PostgreSQL's `SubTransactionId`).
pub type Subtransaction = u32;

/// Keys gathered in one subtransaction, in order: the array elements, comma-separated.
#[derive(Debug, Default)]
struct Run {
    subtransaction: Subtransaction,
    elements: Vec<u8>,
    count: usize,
}

/// What a transaction's row triggers gathered and its statement triggers have not taken yet, per target
/// (`W`: the watch, and the table the row trigger fired on).
#[derive(Debug)]
pub struct PendingKeys<W> {
    by_watch: HashMap<W, Vec<Run>>,
}

impl<W> Default for PendingKeys<W> {
    fn default() -> Self {
        PendingKeys {
            by_watch: HashMap::new(),
        }
    }
}

impl<W: Copy + Eq + std::hash::Hash + Ord> PendingKeys<W> {
    pub fn new() -> PendingKeys<W> {
        PendingKeys::default()
    }

    pub fn is_empty(&self) -> bool {
        self.by_watch.is_empty()
    }

    /// Keeps a key that is written as it is inside an array literal (an integer's text).
    pub fn push_bare(&mut self, watch: W, subtransaction: Subtransaction, text: &[u8]) {
        self.run(watch, subtransaction).extend_from_slice(text);
    }

    /// Keeps a key written in double quotes inside an array literal, with `"` and `\` escaped: right for any
    /// text, including the empty string, `NULL`, and text with commas, braces or spaces in it.
    pub fn push_quoted(&mut self, watch: W, subtransaction: Subtransaction, text: &[u8]) {
        let elements = self.run(watch, subtransaction);
        elements.reserve(text.len() + 2);
        elements.push(b'"');
        for &byte in text {
            if byte == b'"' || byte == b'\\' {
                elements.push(b'\\');
            }
            elements.push(byte);
        }
        elements.push(b'"');
    }

    /// Keeps a NULL key (a key column without a NOT NULL constraint).
    pub fn push_null(&mut self, watch: W, subtransaction: Subtransaction) {
        self.run(watch, subtransaction).extend_from_slice(b"NULL");
    }

    /// The keys of `watch` gathered since `current` started, as an array literal (`{1,2,3}`), and forgets
    /// them; None when there are none.
    pub fn take(&mut self, watch: W, current: Subtransaction) -> Option<Vec<u8>> {
        let runs = self.by_watch.get_mut(&watch)?;
        let first = runs
            .iter()
            .rposition(|run| run.subtransaction < current)
            .map_or(0, |i| i + 1);
        let taken: Vec<Run> = runs.drain(first..).collect();
        if runs.is_empty() {
            self.by_watch.remove(&watch);
        }
        if taken.is_empty() {
            return None;
        }
        let length = taken
            .iter()
            .map(|run| run.elements.len() + 1)
            .sum::<usize>()
            + 1;
        let mut literal = Vec::with_capacity(length);
        literal.push(b'{');
        for (i, run) in taken.iter().enumerate() {
            if i > 0 {
                literal.push(b',');
            }
            literal.extend_from_slice(&run.elements);
        }
        literal.push(b'}');
        Some(literal)
    }

    /// Drops every key gathered since `aborted` started: the subtransaction rolled back, and its rows with it.
    pub fn forget_since(&mut self, aborted: Subtransaction) {
        self.by_watch.retain(|_, runs| {
            let first = runs
                .iter()
                .rposition(|run| run.subtransaction < aborted)
                .map_or(0, |i| i + 1);
            runs.truncate(first);
            !runs.is_empty()
        });
    }

    /// Forgets everything (the transaction ended) and says how many keys of which watches were still kept:
    /// at a commit, keys whose statement trigger never ran.
    pub fn clear(&mut self) -> Vec<(W, usize)> {
        let mut left: Vec<(W, usize)> = self
            .by_watch
            .drain()
            .map(|(watch, runs)| (watch, runs.iter().map(|run| run.count).sum()))
            .collect();
        left.sort_unstable();
        left
    }

    /// The buffer the next key of `watch` is appended to, after a comma when the run has keys already; a new
    /// run when the current subtransaction is not the last run's.
    fn run(&mut self, watch: W, subtransaction: Subtransaction) -> &mut Vec<u8> {
        let runs = self.by_watch.entry(watch).or_default();
        if runs.last().map(|run| run.subtransaction) != Some(subtransaction) {
            runs.push(Run {
                subtransaction,
                ..Run::default()
            });
        }
        let run = runs.last_mut().expect("a run was just pushed");
        if run.count > 0 {
            run.elements.push(b',');
        }
        run.count += 1;
        &mut run.elements
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Keys = PendingKeys<i32>;

    fn text(literal: Option<Vec<u8>>) -> Option<String> {
        literal.map(|bytes| String::from_utf8(bytes).unwrap())
    }

    #[test]
    fn a_statement_takes_its_keys_as_one_array_literal() {
        let mut keys = Keys::new();
        keys.push_bare(7, 1, b"1");
        keys.push_bare(7, 1, b"22");
        keys.push_null(7, 1);
        assert_eq!(text(keys.take(7, 1)).as_deref(), Some("{1,22,NULL}"));
        assert_eq!(keys.take(7, 1), None);
        assert!(keys.is_empty());
    }

    #[test]
    fn quoting_survives_every_character_an_array_literal_treats_specially() {
        let mut keys = Keys::new();
        for key in [
            "",
            "NULL",
            "a,b",
            "{x}",
            " spaced ",
            "quote\"d",
            "back\\slash",
            "héllo",
        ] {
            keys.push_quoted(1, 1, key.as_bytes());
        }
        assert_eq!(
            text(keys.take(1, 1)).as_deref(),
            Some(r#"{"","NULL","a,b","{x}"," spaced ","quote\"d","back\\slash","héllo"}"#)
        );
    }

    #[test]
    fn watches_are_kept_apart() {
        let mut keys = Keys::new();
        keys.push_bare(1, 1, b"10");
        keys.push_bare(2, 1, b"20");
        keys.push_bare(1, 1, b"11");
        assert_eq!(text(keys.take(2, 1)).as_deref(), Some("{20}"));
        assert_eq!(text(keys.take(1, 1)).as_deref(), Some("{10,11}"));
    }

    #[test]
    fn a_statement_in_a_subtransaction_takes_only_what_was_gathered_since_it_began() {
        // An outer statement's row triggers ran (subtransaction 1); one of them opened subtransaction 5 and
        // inserted more rows, whose statement trigger now runs in 5.
        let mut keys = Keys::new();
        keys.push_bare(3, 1, b"1");
        keys.push_bare(3, 1, b"2");
        keys.push_bare(3, 5, b"3");
        keys.push_bare(3, 6, b"4");
        assert_eq!(text(keys.take(3, 5)).as_deref(), Some("{3,4}"));
        // The outer statement's trigger, back in 1, takes the rest.
        assert_eq!(text(keys.take(3, 1)).as_deref(), Some("{1,2}"));
    }

    #[test]
    fn a_committed_subtransaction_keys_belong_to_its_parent_statement() {
        // Keys gathered in 5, which committed; its parent 2 goes on gathering: the parent's statement takes
        // all of them, and a rollback of the parent drops all of them.
        let mut keys = Keys::new();
        keys.push_bare(3, 2, b"1");
        keys.push_bare(3, 5, b"2");
        keys.push_bare(3, 2, b"3");
        let mut rolled_back = Keys::new();
        rolled_back.push_bare(3, 1, b"0");
        rolled_back.push_bare(3, 2, b"1");
        rolled_back.push_bare(3, 5, b"2");
        rolled_back.push_bare(3, 2, b"3");
        assert_eq!(text(keys.take(3, 2)).as_deref(), Some("{1,2,3}"));
        rolled_back.forget_since(2);
        assert_eq!(text(rolled_back.take(3, 1)).as_deref(), Some("{0}"));
    }

    #[test]
    fn a_rollback_drops_the_keys_of_its_rows_only() {
        let mut keys = Keys::new();
        keys.push_bare(1, 1, b"1");
        keys.push_bare(2, 4, b"2");
        keys.push_bare(1, 4, b"3");
        keys.push_bare(1, 9, b"4");
        keys.forget_since(4);
        assert_eq!(text(keys.take(1, 1)).as_deref(), Some("{1}"));
        assert_eq!(keys.take(2, 1), None);
        assert!(keys.is_empty());
    }

    #[test]
    fn clearing_counts_what_no_statement_took() {
        let mut keys = Keys::new();
        keys.push_bare(2, 1, b"1");
        keys.push_bare(1, 1, b"1");
        keys.push_bare(1, 3, b"2");
        assert_eq!(keys.clear(), vec![(1, 2), (2, 1)]);
        assert!(keys.is_empty());
        assert_eq!(keys.clear(), vec![]);
    }
}
