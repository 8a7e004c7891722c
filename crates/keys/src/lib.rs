//! The keys of rows a transaction wrote to watched tables, between the row trigger that sees each row and the
//! statement trigger that queues them (`src/api/watch_keys.rs` is the PostgreSQL side).
//!
//! Keys are kept as the text of a PostgreSQL array literal's elements, the form the watch's queue row stores
//! (`rag.row_batches.key_values`), so that a statement's keys become one string without another pass.
//!
//! Each key is tagged with the subtransaction that was current when its row trigger ran. PostgreSQL numbers
//! subtransactions in the order they start, and keys arrive in time order, so the keys gathered since
//! subtransaction `S` started are exactly those tagged `S` or higher, and they are a suffix of what is kept.
//! Hence:
//! - a statement trigger running in `S` takes only that suffix ([`PendingKeys::take`]): keys an outer
//!   statement gathered before `S` began stay for that statement's own trigger, and are not queued by a batch
//!   that `S`'s rollback would undo;
//! - when `S` rolls back, that suffix is dropped ([`PendingKeys::forget_since`]): those rows are gone.
//!
//! What is kept is bounded ([`PendingKeys::with_limit`]), and growing it never aborts the process: the
//! caller gets an error to raise instead, as PostgreSQL raises one when a statement's memory runs out.
use std::collections::HashMap;

/// A subtransaction's number within its top-level transaction (PostgreSQL's `SubTransactionId`).
pub type Subtransaction = u32;

/// Why a key could not be kept, or a statement's keys not be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeysError {
    /// The keys kept would pass the limit given to [`PendingKeys::with_limit`], in bytes of array text.
    TooLarge { limit: usize },
    /// The allocator refused the memory.
    OutOfMemory,
}

/// One key's text, as a row trigger read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key<'a> {
    /// A NULL key (a key column without a NOT NULL constraint).
    Null,
    /// Written as it is inside an array literal (an integer's text).
    Bare(&'a [u8]),
    /// Written in double quotes, escaped (any other text).
    Quoted(&'a [u8]),
}

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
    bytes: usize,
    limit: usize,
}

impl<W: Copy + Eq + std::hash::Hash + Ord> PendingKeys<W> {
    /// Keeps at most `limit` bytes of array text in all (a statement's keys become one text value, which
    /// PostgreSQL caps at a gigabyte).
    pub fn with_limit(limit: usize) -> PendingKeys<W> {
        PendingKeys {
            by_watch: HashMap::new(),
            bytes: 0,
            limit,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_watch.is_empty()
    }

    /// Keeps a key that is written as it is inside an array literal (an integer's text).
    pub fn push_bare(
        &mut self,
        watch: W,
        subtransaction: Subtransaction,
        text: &[u8],
    ) -> Result<(), KeysError> {
        let elements = self.run(watch, subtransaction, text.len())?;
        elements.extend_from_slice(text);
        Ok(())
    }

    /// Keeps a key written in double quotes inside an array literal, with `"` and `\` escaped: right for any
    /// text, including the empty string, `NULL`, and text with commas, braces or spaces in it.
    pub fn push_quoted(
        &mut self,
        watch: W,
        subtransaction: Subtransaction,
        text: &[u8],
    ) -> Result<(), KeysError> {
        let escapes = text
            .iter()
            .filter(|&&byte| byte == b'"' || byte == b'\\')
            .count();
        let elements = self.run(watch, subtransaction, text.len() + escapes + 2)?;
        elements.push(b'"');
        for &byte in text {
            if byte == b'"' || byte == b'\\' {
                elements.push(b'\\');
            }
            elements.push(byte);
        }
        elements.push(b'"');
        Ok(())
    }

    /// Keeps a NULL key (a key column without a NOT NULL constraint).
    pub fn push_null(&mut self, watch: W, subtransaction: Subtransaction) -> Result<(), KeysError> {
        let elements = self.run(watch, subtransaction, 4)?;
        elements.extend_from_slice(b"NULL");
        Ok(())
    }

    /// Keeps any kind of key.
    pub fn push(
        &mut self,
        watch: W,
        subtransaction: Subtransaction,
        key: Key,
    ) -> Result<(), KeysError> {
        match key {
            Key::Null => self.push_null(watch, subtransaction),
            Key::Bare(text) => self.push_bare(watch, subtransaction, text),
            Key::Quoted(text) => self.push_quoted(watch, subtransaction, text),
        }
    }

    /// Keeps `key` for a statement's end, and returns the array literals to queue now instead, each a batch
    /// that the current subtransaction's rollback would undo with its rows:
    /// - what `current` kept for `watch` once it reaches `hand_on_at` bytes (an apply worker ends no statement
    ///   before its commit, and a subscription's initial copy is one transaction);
    /// - past the limit in all, which keys of enclosing subtransactions can fill without any of them being
    ///   queueable from `current` (nested savepoints, many targets): what `current` kept for `watch`, making
    ///   room for the key, or, where that is not enough, the key alone, rather than an error that would fail
    ///   a write an apply worker retries for ever.
    pub fn keep_or_hand_on(
        &mut self,
        watch: W,
        current: Subtransaction,
        key: Key,
        hand_on_at: usize,
    ) -> Result<Vec<Vec<u8>>, KeysError> {
        let mut ready = Vec::new();
        match self.push(watch, current, key) {
            Ok(()) => {
                if self.bytes_since(&watch, current) >= hand_on_at {
                    ready.extend(self.take(watch, current)?);
                }
            }
            Err(KeysError::TooLarge { .. }) => {
                ready.extend(self.take(watch, current)?);
                if let Err(error) = self.push(watch, current, key) {
                    let KeysError::TooLarge { .. } = error else {
                        return Err(error);
                    };
                    let mut alone = PendingKeys::with_limit(usize::MAX);
                    alone.push(watch, current, key)?;
                    ready.extend(alone.take(watch, current)?);
                }
            }
            Err(error) => return Err(error),
        }
        Ok(ready)
    }

    /// The keys of `watch` gathered since `current` started, as an array literal (`{1,2,3}`), and forgets
    /// them; None when there are none. When the literal cannot be allocated, they are forgotten all the same
    /// (the caller raises, which rolls the statement back).
    pub fn take(
        &mut self,
        watch: W,
        current: Subtransaction,
    ) -> Result<Option<Vec<u8>>, KeysError> {
        let Some(runs) = self.by_watch.get_mut(&watch) else {
            return Ok(None);
        };
        let first = runs
            .iter()
            .rposition(|run| run.subtransaction < current)
            .map_or(0, |i| i + 1);
        let taken: Vec<Run> = runs.drain(first..).collect();
        if runs.is_empty() {
            self.by_watch.remove(&watch);
        }
        let taken_bytes: usize = taken.iter().map(|run| run.elements.len() + 1).sum();
        self.bytes -= taken_bytes;
        // A run left empty by a refused allocation holds no key.
        let taken: Vec<&Run> = taken.iter().filter(|run| run.count > 0).collect();
        if taken.is_empty() {
            return Ok(None);
        }
        let mut literal = Vec::new();
        literal
            .try_reserve_exact(taken_bytes + 1)
            .map_err(|_| KeysError::OutOfMemory)?;
        literal.push(b'{');
        for (i, run) in taken.iter().enumerate() {
            if i > 0 {
                literal.push(b',');
            }
            literal.extend_from_slice(&run.elements);
        }
        literal.push(b'}');
        Ok(Some(literal))
    }

    /// The keys gathered since `current` started of every target that `wanted` accepts, each as
    /// [`PendingKeys::take`] gives them, in the targets' order: at the end of a statement, what its rows
    /// gathered for targets that no statement trigger of theirs takes (a partition written through its parent).
    pub fn take_where(
        &mut self,
        current: Subtransaction,
        wanted: impl Fn(&W) -> bool,
    ) -> Result<Vec<(W, Vec<u8>)>, KeysError> {
        let mut targets: Vec<W> = self
            .by_watch
            .keys()
            .copied()
            .filter(|target| wanted(target))
            .collect();
        targets.sort_unstable();
        let mut taken = Vec::new();
        for target in targets {
            if let Some(literal) = self.take(target, current)? {
                taken.push((target, literal));
            }
        }
        Ok(taken)
    }

    /// Bytes of array text that [`PendingKeys::take`] of `watch` in `current` would return now: what may be
    /// handed on before the statement ends, so that a bound holds per subtransaction and target, not only over
    /// the whole transaction.
    pub fn bytes_since(&self, watch: &W, current: Subtransaction) -> usize {
        self.by_watch.get(watch).map_or(0, |runs| {
            runs.iter()
                .rev()
                .take_while(|run| run.subtransaction >= current)
                .map(|run| run.elements.len() + 1)
                .sum()
        })
    }

    /// Drops every key gathered since `aborted` started: the subtransaction rolled back, and its rows with it.
    pub fn forget_since(&mut self, aborted: Subtransaction) {
        let mut dropped = 0;
        self.by_watch.retain(|_, runs| {
            let first = runs
                .iter()
                .rposition(|run| run.subtransaction < aborted)
                .map_or(0, |i| i + 1);
            dropped += runs[first..]
                .iter()
                .map(|run| run.elements.len() + 1)
                .sum::<usize>();
            runs.truncate(first);
            !runs.is_empty()
        });
        self.bytes -= dropped;
    }

    /// Forgets everything (the transaction ended) and says how many keys of which targets were still kept:
    /// at a commit, keys whose statement trigger never ran.
    pub fn clear(&mut self) -> Vec<(W, usize)> {
        let mut left: Vec<(W, usize)> = self
            .by_watch
            .drain()
            .map(|(watch, runs)| (watch, runs.iter().map(|run| run.count).sum()))
            .collect();
        left.sort_unstable();
        self.bytes = 0;
        left
    }

    /// The buffer the next key of `watch` is appended to, with room for `length` more bytes, after a comma when
    /// the run has keys already; a new run when the current subtransaction is not the last run's. Each run
    /// counts one byte more than its elements: the comma or brace that joins it into the literal.
    fn run(
        &mut self,
        watch: W,
        subtransaction: Subtransaction,
        length: usize,
    ) -> Result<&mut Vec<u8>, KeysError> {
        let needed = length + 2;
        if self.bytes.saturating_add(needed) > self.limit {
            return Err(KeysError::TooLarge { limit: self.limit });
        }
        let runs = self.by_watch.entry(watch).or_default();
        if runs.last().map(|run| run.subtransaction) != Some(subtransaction) {
            runs.try_reserve(1).map_err(|_| KeysError::OutOfMemory)?;
            runs.push(Run {
                subtransaction,
                ..Run::default()
            });
            self.bytes += 1;
        }
        let run = runs.last_mut().expect("a run was just pushed");
        run.elements
            .try_reserve(needed)
            .map_err(|_| KeysError::OutOfMemory)?;
        if run.count > 0 {
            run.elements.push(b',');
            self.bytes += 1;
        }
        run.count += 1;
        self.bytes += length;
        Ok(&mut run.elements)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Keys = PendingKeys<i32>;

    fn empty() -> Keys {
        Keys::with_limit(usize::MAX)
    }

    fn text(literal: Option<Vec<u8>>) -> Option<String> {
        literal.map(|bytes| String::from_utf8(bytes).unwrap())
    }

    fn texts(literals: Vec<Vec<u8>>) -> Vec<String> {
        literals
            .into_iter()
            .map(|bytes| String::from_utf8(bytes).unwrap())
            .collect()
    }

    #[test]
    fn a_subtransactions_keys_are_handed_on_once_they_reach_the_bound() {
        let mut keys = empty();
        assert!(keys
            .keep_or_hand_on(7, 1, Key::Bare(b"1"), 6)
            .unwrap()
            .is_empty());
        assert!(keys
            .keep_or_hand_on(7, 2, Key::Bare(b"22"), 6)
            .unwrap()
            .is_empty());
        // Subtransaction 2 now holds "22,333" (and its joining byte): handed on, subtransaction 1's key stays.
        assert_eq!(
            texts(keys.keep_or_hand_on(7, 2, Key::Quoted(b"333"), 6).unwrap()),
            ["{22,\"333\"}"]
        );
        assert_eq!(text(keys.take(7, 1).unwrap()).as_deref(), Some("{1}"));
    }

    #[test]
    fn past_the_limit_the_current_subtransactions_keys_make_room_or_the_key_goes_alone() {
        // 10 bytes: "11111" takes 6 (with its run's byte), "2" 2 more, and a push needs its length + 2 free.
        let mut keys = Keys::with_limit(10);
        assert!(keys
            .keep_or_hand_on(7, 1, Key::Bare(b"11111"), usize::MAX)
            .unwrap()
            .is_empty());
        assert!(keys
            .keep_or_hand_on(7, 2, Key::Bare(b"2"), usize::MAX)
            .unwrap()
            .is_empty());
        // Full: subtransaction 2's "2" is handed on and "3" kept in its place.
        assert_eq!(
            texts(
                keys.keep_or_hand_on(7, 2, Key::Bare(b"3"), usize::MAX)
                    .unwrap()
            ),
            ["{2}"]
        );
        // A key longer than the room subtransaction 2 can make goes alone, after what it kept.
        assert_eq!(
            texts(
                keys.keep_or_hand_on(7, 2, Key::Bare(b"4444444"), usize::MAX)
                    .unwrap()
            ),
            ["{3}", "{4444444}"]
        );
        // In a new subtransaction with nothing of its own kept, a key that does not fit goes alone.
        assert_eq!(
            texts(keys.keep_or_hand_on(8, 3, Key::Null, usize::MAX).unwrap()),
            ["{NULL}"]
        );
        // Nothing of an enclosing subtransaction was handed on or lost.
        assert_eq!(text(keys.take(7, 1).unwrap()).as_deref(), Some("{11111}"));
    }

    #[test]
    fn bytes_since_counts_only_what_take_would_return() {
        let mut keys = empty();
        assert_eq!(keys.bytes_since(&7, 1), 0);
        keys.push_bare(7, 1, b"11").unwrap();
        keys.push_bare(7, 3, b"333").unwrap();
        keys.push_bare(7, 3, b"4").unwrap();
        keys.push_bare(8, 3, b"55555").unwrap();
        // Subtransaction 3's run of watch 7: "333,4" and the byte that joins it into the literal.
        assert_eq!(keys.bytes_since(&7, 2), 6);
        assert_eq!(keys.bytes_since(&7, 1), 6 + 3);
        let taken = keys.take(7, 2).unwrap().unwrap();
        assert_eq!(taken, b"{333,4}");
        assert_eq!(keys.bytes_since(&7, 2), 0);
        assert_eq!(keys.bytes_since(&7, 1), 3);
        assert_eq!(keys.bytes_since(&9, 1), 0);
    }

    #[test]
    fn a_statement_takes_its_keys_as_one_array_literal() {
        let mut keys = empty();
        keys.push_bare(7, 1, b"1").unwrap();
        keys.push_bare(7, 1, b"22").unwrap();
        keys.push_null(7, 1).unwrap();
        assert_eq!(
            text(keys.take(7, 1).unwrap()).as_deref(),
            Some("{1,22,NULL}")
        );
        assert_eq!(keys.take(7, 1).unwrap(), None);
        assert!(keys.is_empty());
    }

    #[test]
    fn quoting_survives_every_character_an_array_literal_treats_specially() {
        let mut keys = empty();
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
            keys.push_quoted(1, 1, key.as_bytes()).unwrap();
        }
        assert_eq!(
            text(keys.take(1, 1).unwrap()).as_deref(),
            Some(r#"{"","NULL","a,b","{x}"," spaced ","quote\"d","back\\slash","héllo"}"#)
        );
    }

    #[test]
    fn watches_are_kept_apart() {
        let mut keys = empty();
        keys.push_bare(1, 1, b"10").unwrap();
        keys.push_bare(2, 1, b"20").unwrap();
        keys.push_bare(1, 1, b"11").unwrap();
        assert_eq!(text(keys.take(2, 1).unwrap()).as_deref(), Some("{20}"));
        assert_eq!(text(keys.take(1, 1).unwrap()).as_deref(), Some("{10,11}"));
    }

    #[test]
    fn a_statement_in_a_subtransaction_takes_only_what_was_gathered_since_it_began() {
        // An outer statement's row triggers ran (subtransaction 1); one of them opened subtransaction 5 and
        // inserted more rows, whose statement trigger now runs in 5.
        let mut keys = empty();
        keys.push_bare(3, 1, b"1").unwrap();
        keys.push_bare(3, 1, b"2").unwrap();
        keys.push_bare(3, 5, b"3").unwrap();
        keys.push_bare(3, 6, b"4").unwrap();
        assert_eq!(text(keys.take(3, 5).unwrap()).as_deref(), Some("{3,4}"));
        // The outer statement's trigger, back in 1, takes the rest.
        assert_eq!(text(keys.take(3, 1).unwrap()).as_deref(), Some("{1,2}"));
    }

    #[test]
    fn a_committed_subtransaction_keys_belong_to_its_parent_statement() {
        // Keys gathered in 5, which committed; its parent 2 goes on gathering: the parent's statement takes
        // all of them, and a rollback of the parent drops all of them.
        let mut keys = empty();
        keys.push_bare(3, 2, b"1").unwrap();
        keys.push_bare(3, 5, b"2").unwrap();
        keys.push_bare(3, 2, b"3").unwrap();
        let mut rolled_back = empty();
        rolled_back.push_bare(3, 1, b"0").unwrap();
        rolled_back.push_bare(3, 2, b"1").unwrap();
        rolled_back.push_bare(3, 5, b"2").unwrap();
        rolled_back.push_bare(3, 2, b"3").unwrap();
        assert_eq!(text(keys.take(3, 2).unwrap()).as_deref(), Some("{1,2,3}"));
        rolled_back.forget_since(2);
        assert_eq!(
            text(rolled_back.take(3, 1).unwrap()).as_deref(),
            Some("{0}")
        );
    }

    #[test]
    fn a_rollback_drops_the_keys_of_its_rows_only() {
        let mut keys = empty();
        keys.push_bare(1, 1, b"1").unwrap();
        keys.push_bare(2, 4, b"2").unwrap();
        keys.push_bare(1, 4, b"3").unwrap();
        keys.push_bare(1, 9, b"4").unwrap();
        keys.forget_since(4);
        assert_eq!(text(keys.take(1, 1).unwrap()).as_deref(), Some("{1}"));
        assert_eq!(keys.take(2, 1).unwrap(), None);
        assert!(keys.is_empty());
    }

    #[test]
    fn the_limit_refuses_a_key_and_counts_what_was_taken_or_dropped() {
        // "{1,22}" is 6 bytes; the limit counts each key's bytes, its separator and one byte per run.
        let mut keys = Keys::with_limit(12);
        keys.push_bare(1, 1, b"1").unwrap();
        keys.push_bare(1, 1, b"22").unwrap();
        assert_eq!(
            keys.push_quoted(1, 1, b"long key"),
            Err(KeysError::TooLarge { limit: 12 })
        );
        assert_eq!(text(keys.take(1, 1).unwrap()).as_deref(), Some("{1,22}"));
        // Taken keys no longer count, nor do keys a rollback dropped.
        keys.push_bare(1, 2, b"333").unwrap();
        keys.push_bare(1, 3, b"4444").unwrap();
        keys.forget_since(2);
        keys.push_quoted(1, 4, b"long").unwrap();
        assert_eq!(
            text(keys.take(1, 1).unwrap()).as_deref(),
            Some("{\"long\"}")
        );
        assert_eq!(keys.bytes, 0);
    }

    #[test]
    fn the_end_of_a_statement_takes_the_targets_it_wants_gathered_since_its_subtransaction_began() {
        // Targets are (trigger depth, watch). A statement in subtransaction 3 whose row triggers ran at depth
        // 2 wrote to two watched partitions (watches 20 and 10, in that order); an outer statement
        // (subtransaction 1, depth 2) had gathered for watch 10 before; a statement inside one of its
        // triggers (depth 1) left a key of its own not yet queued.
        let mut keys = PendingKeys::<(i32, i32)>::with_limit(usize::MAX);
        keys.push_bare((2, 10), 1, b"0").unwrap();
        keys.push_bare((2, 20), 3, b"20").unwrap();
        keys.push_bare((2, 10), 3, b"10").unwrap();
        keys.push_bare((3, 10), 3, b"30").unwrap();
        keys.push_bare((2, 20), 4, b"21").unwrap();
        let deeper_than_one = |&(depth, _): &(i32, i32)| depth > 1;
        let taken: Vec<((i32, i32), String)> = keys
            .take_where(3, deeper_than_one)
            .unwrap()
            .into_iter()
            .map(|(target, literal)| (target, String::from_utf8(literal).unwrap()))
            .collect();
        assert_eq!(
            taken,
            vec![
                ((2, 10), "{10}".to_string()),
                ((2, 20), "{20,21}".to_string()),
                ((3, 10), "{30}".to_string())
            ]
        );
        assert!(keys.take_where(3, deeper_than_one).unwrap().is_empty());
        // The outer statement's key is left for its own end; a statement one level in takes nothing of it.
        assert!(keys
            .take_where(1, |&(depth, _)| depth > 2)
            .unwrap()
            .is_empty());
        assert_eq!(text(keys.take((2, 10), 1).unwrap()).as_deref(), Some("{0}"));
        assert!(keys.is_empty());
        assert_eq!(keys.bytes, 0);
    }

    #[test]
    fn clearing_counts_what_no_statement_took() {
        let mut keys = empty();
        keys.push_bare(2, 1, b"1").unwrap();
        keys.push_bare(1, 1, b"1").unwrap();
        keys.push_bare(1, 3, b"2").unwrap();
        assert_eq!(keys.clear(), vec![(1, 2), (2, 1)]);
        assert!(keys.is_empty());
        assert_eq!(keys.clear(), vec![]);
    }
}
