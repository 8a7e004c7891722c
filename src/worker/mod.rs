//! Background processing: one launcher per cluster starts embedding workers for every database that has the
//! extension (new databases included, no restart needed); a backend that queues work wakes its database's
//! workers when its transaction commits.
//!
//! One file per job: `launcher` starts workers, `serve` is a worker's main loop, `documents` its claim loop,
//! `chunking` and `row_sync` what it does to documents and watched rows, `breaker` its providers, `steps` how
//! its steps are made durable; `registry` is the shared memory they coordinate through.
pub mod breaker;
pub mod chunking;
pub mod database_commands;
pub mod documents;
pub mod launcher;
pub mod registry;
pub mod row_sync;
pub mod serve;
pub mod steps;
pub mod transaction;
pub mod wake;
