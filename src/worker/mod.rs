//! Background processing: one launcher per cluster starts embedding workers for every database that has the
//! extension (new databases included, no restart needed); a backend that queues work wakes its database's
//! workers when its transaction commits.
pub mod database_commands;
pub mod embedder;
pub mod launcher;
pub mod registry;
pub mod transaction;
pub mod wake;
