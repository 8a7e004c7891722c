//! The launcher: a static background worker that keeps one embedding worker (or `rag.workers_per_database`,
//! and `rag.bulk_load_workers` while a bulk load is queued) running for each database that has the extension.
//! It cannot see other databases' catalogs, so the first
//! time it sees a connectable database it starts one short-lived worker there, which reports back when the
//! extension is absent. Such a database is then left alone for the launcher's lifetime unless a backend there
//! asks for a worker: `CREATE EXTENSION rag` does (through the utility hook, after commit), and so does every
//! ingest. A cluster of many databases that never use `rag` therefore costs one probe per database per server
//! start, at most `PROBES_PER_ROUND` of them per launcher round, and nothing after that.
use crate::settings;
use crate::worker::registry::{self, SlotState};
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, DynamicBackgroundWorker,
    SignalWakeFlags,
};
use pgrx::prelude::*;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// At most this many databases of unknown status are probed per launcher round, so a server start with
/// hundreds of databases does not fork hundreds of processes at once.
const PROBES_PER_ROUND: usize = 4;

/// A database created while the launcher runs is probed only once it has existed this long, unless a backend
/// there asks first (`CREATE EXTENSION rag`, an ingest). A probe is a connection with a snapshot in that
/// database: made while its creator loads it and runs VACUUM (as PostgreSQL's own regression suite does at its
/// start), it can keep VACUUM from marking the new rows all-visible. A database that does not use rag should not
/// see us at all while it is being set up. Databases there when the launcher starts are probed at once, so a
/// restarted server serves its databases without delay.
const NEW_DATABASE_GRACE: Duration = Duration::from_secs(30);

pub fn register() {
    BackgroundWorkerBuilder::new("rag launcher")
        .set_type("rag launcher")
        .set_function("rag_launcher_main")
        .set_library("rag")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        // A crashed launcher comes back on its own; the workers it started are its to restart.
        .set_restart_time(Some(Duration::from_secs(5)))
        .load();
}

struct Running {
    database: pg_sys::Oid,
    handle: DynamicBackgroundWorker,
}

/// What the launcher knows between rounds.
#[derive(Default)]
struct Launcher {
    running: HashMap<usize, Running>,
    /// Databases where a probe found no extension; they are probed again only when a backend there asks.
    absent: HashSet<pg_sys::Oid>,
    /// Databases where a worker has found the extension.
    served: HashSet<pg_sys::Oid>,
    /// Served databases whose worker made room for another database: they wait for a backend to ask, or until
    /// the time their worker left (ms since the Unix epoch, registry::wake_at), when their first queued item is
    /// due.
    dormant: HashMap<pg_sys::Oid, Option<u64>>,
    /// When each database last had a running worker: a freed slot goes to the database that has gone without
    /// one longest, so that more databases with work than rag.max_workers take turns.
    last_served: HashMap<pg_sys::Oid, Instant>,
    /// When each database last asked: a request that raced with its worker leaving keeps it from dormancy.
    last_request: HashMap<pg_sys::Oid, Instant>,
    /// The connectable databases, as last listed.
    databases: Vec<pg_sys::Oid>,
    /// When each database was first listed; None until the first listing (its databases count as old).
    first_listed: Option<HashMap<pg_sys::Oid, Instant>>,
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn rag_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(Some("postgres"), None);
    // Its one query names only pg_catalog's objects; pinned all the same, as the workers' is.
    crate::pg::settle_worker_session();
    registry::set_launcher_pid(crate::pg::my_pid());
    let mut launcher = Launcher::default();
    loop {
        if crate::pg::shutdown_requested() {
            break;
        }
        if BackgroundWorker::sighup_received() {
            crate::pg::reload_configuration();
        }
        let asked = launcher.take_requests();
        reap_stopped_workers(&mut launcher);
        launcher.refresh_databases();
        let (waiting_for_a_slot, without_a_worker) = launcher.start_workers(&asked);
        registry::set_workers_wanted(waiting_for_a_slot > 0, without_a_worker);
        let nap = Duration::from_secs(settings::LAUNCHER_NAPTIME_S.get().max(1) as u64);
        if !BackgroundWorker::wait_latch(Some(nap)) {
            break;
        }
    }
    // Workers notice shutdown through the postmaster; nothing to hand over.
}

impl Launcher {
    /// Backends' wake requests: their databases are probed or woken again. Returns the databases that asked.
    fn take_requests(&mut self) -> Vec<pg_sys::Oid> {
        let requests = registry::take_launcher_wake_requests();
        if requests.every_database {
            self.absent.clear();
            self.dormant.clear();
        }
        for database in &requests.databases {
            self.absent.remove(database);
            self.dormant.remove(database);
            self.last_request.insert(*database, Instant::now());
        }
        requests.databases
    }

    /// Lists the databases again. A failed listing is said in the log and the last good list serves this
    /// round: an empty list would look like a cluster without databases, and no worker would be started.
    fn refresh_databases(&mut self) {
        match crate::worker::transaction::run(list_databases) {
            Ok(Ok(listed)) => {
                let now = Instant::now();
                let long_ago = now.checked_sub(NEW_DATABASE_GRACE).unwrap_or(now);
                let first_listing = self.first_listed.is_none();
                let first_listed = self.first_listed.get_or_insert_with(HashMap::new);
                first_listed.retain(|database, _| listed.contains(database));
                for database in &listed {
                    first_listed.entry(*database).or_insert(if first_listing {
                        long_ago
                    } else {
                        now
                    });
                }
                self.databases = listed;
            }
            Ok(Err(error)) => {
                pgrx::warning!(
                    "rag launcher: could not list databases, using the last list: {error}"
                )
            }
            Err(failure) => {
                pgrx::warning!(
                    "rag launcher: could not list databases, using the last list: {}",
                    failure.message
                )
            }
        }
    }

    /// Starts the workers each database should have: rag.workers_per_database where the extension is,
    /// one probe where it is not known yet (at most PROBES_PER_ROUND), then the extra workers of bulk loads
    /// (rag.bulk_load_workers), only when no database waits for a slot. Returns how many databases had to wait
    /// for a slot (then idle workers elsewhere with nothing due make room, busy extra workers give way between
    /// two steps, and as many workers as databases wait give their slots up once they have served their turn:
    /// serve::gives_way, serve::rest).
    ///
    /// Also returns how many of those have no worker at all: only for those do workers that have served their
    /// turn give way (a database that lacks only its second worker, rag.workers_per_database = 2, made a worker
    /// somewhere leave and start again every 30 s, its own included).
    fn start_workers(&mut self, asked: &[pg_sys::Oid]) -> (usize, usize) {
        let now = Instant::now();
        // A dormant database whose first queued item is due now wants its worker back.
        let now_ms = registry::now_ms();
        self.dormant
            .retain(|_, wake_at| wake_at.is_none_or(|at| at > now_ms));
        for database in &self.databases {
            if registry::slots_of(*database)
                .iter()
                .any(|&slot| registry::slot_state(slot) == SlotState::Running)
            {
                self.last_served.insert(*database, now);
            }
        }
        self.last_served
            .retain(|database, _| self.databases.contains(database));
        let mut databases = self.databases.clone();
        // The database that has gone without a worker longest goes first (one never served before all), and of
        // those, databases whose backends asked: their probe is not to wait behind hundreds of others.
        databases.sort_by_key(|database| {
            (
                self.last_served.get(database).copied(),
                !asked.contains(database),
            )
        });
        let mut probes_left = PROBES_PER_ROUND;
        let mut waiting_for_a_slot = 0;
        let mut without_a_worker = 0;
        let mut served = Vec::new();
        for database in databases {
            if self.absent.contains(&database)
                || self.dormant.contains_key(&database)
                || registry::database_paused(database)
            {
                continue;
            }
            let slots = registry::slots_of(database);
            if slots
                .iter()
                .any(|&slot| registry::slot_state(slot) == SlotState::Running)
            {
                self.served.insert(database);
            }
            // A database of unknown status gets one worker, which is the probe; the rest once it serves.
            let wanted = if self.served.contains(&database) {
                served.push(database);
                registry::standing_workers()
            } else if slots.is_empty() && probes_left > 0 && self.may_probe(database) {
                probes_left -= 1;
                1
            } else {
                0
            };
            if !self.start_up_to(database, slots.len(), wanted) {
                waiting_for_a_slot += 1;
                if registry::slots_of(database).is_empty() {
                    without_a_worker += 1;
                }
            }
        }
        if waiting_for_a_slot == 0 {
            for database in served {
                let held = registry::slots_of(database).len();
                if !self.start_up_to(database, held, registry::workers_wanted(database)) {
                    break;
                }
            }
        }
        (waiting_for_a_slot, without_a_worker)
    }

    /// Starts workers for `database` until it holds `wanted` slots. False when rag.max_workers stopped it (a
    /// failed start, max_worker_processes being full, is said in the log and tried again next round).
    fn start_up_to(&mut self, database: pg_sys::Oid, held: usize, wanted: usize) -> bool {
        for _ in held..wanted {
            if self.running.len() >= settings::MAX_WORKERS.get() as usize {
                return false;
            }
            match start_worker(database) {
                Some((slot, handle)) => {
                    self.running.insert(slot, Running { database, handle });
                    // Served from now: a worker that leaves before the next round (its database had nothing
                    // due) does not put its database first in line again.
                    self.last_served.insert(database, Instant::now());
                }
                None => break,
            }
        }
        true
    }
}

impl Launcher {
    /// Whether a database of unknown status may be probed now (see NEW_DATABASE_GRACE).
    /// take_requests records every database that asked in last_request, this round's included.
    fn may_probe(&self, database: pg_sys::Oid) -> bool {
        self.last_request.contains_key(&database)
            || self
                .first_listed
                .as_ref()
                .and_then(|first_listed| first_listed.get(&database))
                .is_none_or(|listed| listed.elapsed() >= NEW_DATABASE_GRACE)
    }
}

fn list_databases() -> Result<Vec<pg_sys::Oid>, crate::error::RagError> {
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT oid FROM pg_catalog.pg_database WHERE datallowconn AND NOT datistemplate ORDER BY oid",
            None,
            &[],
        )?;
        let mut databases = Vec::new();
        for row in rows {
            databases.push(crate::error::not_null(
                row.get::<pg_sys::Oid>(1)?,
                "pg_database.oid",
            )?);
        }
        Ok(databases)
    })
}

fn start_worker(database: pg_sys::Oid) -> Option<(usize, DynamicBackgroundWorker)> {
    let slot = registry::reserve_slot(database)?;
    let started = BackgroundWorkerBuilder::new("rag worker")
        .set_type("rag worker")
        .set_function("rag_worker_main")
        .set_library("rag")
        .enable_spi_access()
        .set_argument((slot as i32).into_datum())
        // The launcher restarts workers itself; a postmaster restart of a dynamic worker would duplicate them
        // after a crash, when the launcher starts fresh ones anyway.
        .set_restart_time(None)
        .set_notify_pid(crate::pg::my_pid())
        .load_dynamic();
    match started {
        Ok(handle) => Some((slot, handle)),
        Err(_) => {
            registry::release_slot(slot);
            pgrx::log!("rag launcher: could not start a worker (max_worker_processes reached?)");
            None
        }
    }
}

fn reap_stopped_workers(launcher: &mut Launcher) {
    let stopped: Vec<usize> = launcher
        .running
        .iter()
        .filter(|(_, worker)| {
            matches!(worker.handle.pid(), Err(status) if !matches!(status, pgrx::bgworkers::BackgroundWorkerStatus::NotYetStarted))
        })
        .map(|(slot, _)| *slot)
        .collect();
    for slot in stopped {
        if let Some(worker) = launcher.running.remove(&slot) {
            launcher.last_served.insert(worker.database, Instant::now());
            match registry::slot_state(slot) {
                SlotState::NoExtension => {
                    launcher.absent.insert(worker.database);
                    launcher.served.remove(&worker.database);
                }
                // Work queued while the worker was leaving has asked for a worker since: start one again.
                SlotState::Dormant
                    if launcher
                        .last_request
                        .get(&worker.database)
                        .is_none_or(|asked| asked.elapsed() >= Duration::from_secs(10)) =>
                {
                    launcher
                        .dormant
                        .insert(worker.database, registry::wake_at(slot));
                }
                _ => {}
            }
            registry::release_slot(slot);
        }
    }
}
